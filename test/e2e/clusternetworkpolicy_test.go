package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// cnpScenario: red/a and blue/b, blue/c. A NetworkPolicy lets all of red into blue/b (b is
// isolated; c is not). The Admin tier denies red into blue on 81 and on every port after
// passing 82 to the NetworkPolicy tier, and accepts blue/c into blue/b on 80; the Baseline
// tier denies red into blue/c on 80, which applies to c only (b is isolated by the
// NetworkPolicy tier).
const cnpNetworkPolicy = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-red, namespace: blue}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: red}}}]
`

const cnpTiers = `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: admin-pass}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: blue}}}
  ingress:
  - name: red-82-to-networkpolicy
    action: Pass
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: red}}}]
    protocols: [{tcp: {destinationPort: {number: 82}}}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: admin-accept-c}
spec:
  tier: Admin
  priority: 5
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: b}}}}
  ingress:
  - action: Accept
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: c}}}}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: admin-deny-red}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: blue}}}
  ingress:
  - name: red-81
    action: Deny
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: red}}}]
    protocols: [{tcp: {destinationPort: {number: 81}}}]
  - name: red-rest
    action: Deny
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: red}}}]
    protocols: [{tcp: {destinationPort: {range: {start: 82, end: 83}}}}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: baseline-red}
spec:
  tier: Baseline
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: blue}}}
  ingress:
  - action: Deny
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: red}}}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]
`

// ClusterNetworkPolicy tiers with real traffic, applied with rampart apply: Admin Deny
// over a NetworkPolicy allow, Admin Accept over NetworkPolicy isolation, Pass handing
// one port back to the NetworkPolicy tier before a later Admin Deny, and Baseline deciding
// only for the pod no NetworkPolicy isolates; trace names the tier. Deleting the
// ClusterNetworkPolicies leaves the NetworkPolicy alone in force.
func TestClusterNetworkPolicyTiers(t *testing.T) {
	env := agenttest.StartAgent(t, agenttest.Options{TCPPorts: []uint16{80, 81, 82, 83}})
	env.AddEndpoint("red", "a", map[string]string{"app": "a"})
	env.AddEndpoint("blue", "b", map[string]string{"app": "b"})
	env.AddEndpoint("blue", "c", map[string]string{"app": "c"})
	if out, errs, code := env.CLIStdin(cnpNetworkPolicy+"---\n"+cnpTiers, "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply: %d %s%s", code, out, errs)
	}
	type probe struct {
		from, to string
		port     uint16
		want     bool
	}
	probes := []probe{
		{"red/a", "blue/b", 80, true},  // NetworkPolicy allows red
		{"red/a", "blue/b", 81, false}, // Admin Deny over the NetworkPolicy allow
		{"red/a", "blue/b", 82, true},  // Pass at priority 1, then the NetworkPolicy allow
		{"red/a", "blue/b", 83, false}, // Admin Deny (red-rest)
		{"blue/c", "blue/b", 80, true}, // Admin Accept over isolation
		{"blue/c", "blue/b", 81, false},
		{"red/a", "blue/c", 80, false}, // Baseline Deny: c is not isolated
		{"red/a", "blue/c", 82, true},  // Pass, then nothing: c is not isolated
		{"red/a", "blue/c", 81, false}, // Admin Deny
	}
	check := func(when string, ps []probe) {
		t.Helper()
		got := make([]bool, len(ps))
		done := make(chan struct{}, len(ps))
		for i, p := range ps {
			go func() {
				got[i] = env.Probe(p.from, env.IP(p.to), p.port, "tcp", 700*time.Millisecond)
				done <- struct{}{}
			}()
		}
		for range ps {
			<-done
		}
		for i, p := range ps {
			if got[i] != p.want {
				t.Errorf("%s: %s -> %s:%d: connected %v, want %v", when, p.from, p.to, p.port, got[i], p.want)
			}
		}
	}
	check("with the tiers", probes)

	out := env.MustCLI("policy", "trace", "--from", "red/a", "--to", "blue/b", "--port", "81/TCP")
	if !strings.Contains(out, "Admin tier") || !strings.Contains(out, "admin-deny-red") {
		t.Errorf("trace red/a -> blue/b:81 does not name the Admin rule:\n%s", out)
	}

	if out, errs, code := env.CLIStdin(cnpTiers, "delete", "-f", "-"); code != 0 {
		t.Fatalf("delete: %d %s%s", code, out, errs)
	}
	check("after deleting them", []probe{
		{"red/a", "blue/b", 81, true}, {"red/a", "blue/b", 83, true}, {"blue/c", "blue/b", 80, false}, {"red/a", "blue/c", 80, true},
	})
}
