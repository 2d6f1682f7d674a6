package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

const probeTimeout = 500 * time.Millisecond

// denyIngressToB allows nothing into pod=b endpoints of namespace y except TCP 80 from
// pod=a endpoints of namespace x.
const allowXAtoB = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-x-a
  namespace: y
spec:
  podSelector:
    matchLabels:
      pod: b
  policyTypes: [Ingress]
  ingress:
  - from:
    - namespaceSelector:
        matchLabels:
          ns: x
      podSelector:
        matchLabels:
          pod: a
    ports:
    - protocol: TCP
      port: 80
`

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func setupXY(t *testing.T) *agenttest.Env {
	t.Helper()
	e := agenttest.StartAgent(t, agenttest.Options{})
	e.MustCLI("namespace", "label", "x", "ns=x")
	e.MustCLI("namespace", "label", "y", "ns=y")
	e.AddEndpoint("x", "a", map[string]string{"pod": "a"})
	e.AddEndpoint("x", "c", map[string]string{"pod": "c"})
	e.AddEndpoint("y", "b", map[string]string{"pod": "b"})
	return e
}

func TestEndpointsPolicyAndTraffic(t *testing.T) {
	e := setupXY(t)
	bIP := e.IP("y/b")

	// No policy: everything passes.
	for _, from := range []string{"x/a", "x/c"} {
		if !e.Probe(from, bIP, 80, "tcp", 2*time.Second) || !e.Probe(from, bIP, 81, "udp", 2*time.Second) {
			t.Fatalf("%s -> y/b blocked without policy", from)
		}
	}

	out := e.MustCLI("apply", "-f", writeFile(t, "allow.yaml", allowXAtoB))
	if !strings.Contains(out, "created") {
		t.Fatalf("apply output: %q", out)
	}
	checks := []struct {
		from  string
		port  uint16
		proto string
		want  bool
	}{
		{"x/a", 80, "tcp", true},
		{"x/a", 81, "tcp", false},
		{"x/a", 80, "udp", false},
		{"x/c", 80, "tcp", false},
	}
	for _, c := range checks {
		if got := e.Probe(c.from, bIP, c.port, c.proto, probeTimeout); got != c.want {
			t.Errorf("%s -> y/b %d/%s: got %v, want %v", c.from, c.port, c.proto, got, c.want)
		}
	}
	// b's egress is not enforced: b reaches a.
	if !e.Probe("y/b", e.IP("x/a"), 80, "tcp", 2*time.Second) {
		t.Error("y/b -> x/a blocked, but only b's ingress is restricted")
	}

	// get policies lists it with its rules and source.
	out = e.MustCLI("get", "policies")
	if !strings.Contains(out, "NetworkPolicy") || !strings.Contains(out, "allow-x-a") || !strings.Contains(out, "allow.yaml") {
		t.Errorf("get policies: %q", out)
	}
	// endpoint get shows enforcement and counters.
	out = e.MustCLI("endpoint", "get", "y/b")
	for _, want := range []string{"Enforcement:", "ingress", "pod=b", "Ingress:", "dropped", "Identity:"} {
		if !strings.Contains(out, want) {
			t.Errorf("endpoint get lacks %q:\n%s", want, out)
		}
	}
	var ep api.Endpoint
	if err := json.Unmarshal([]byte(e.MustCLI("endpoint", "get", "y/b", "-o", "json")), &ep); err != nil {
		t.Fatal(err)
	}
	if !ep.EnforceIngress || ep.EnforceEgress || ep.Counters == nil || ep.Counters.IngressDrops == 0 || ep.Counters.IngressPackets == 0 {
		t.Errorf("endpoint y/b: %+v counters %+v", ep, ep.Counters)
	}

	// trace agrees.
	out = e.MustCLI("policy", "trace", "--from", "x/a", "--to", "y/b", "--port", "80/TCP")
	if !strings.Contains(out, "ALLOWED") || !strings.Contains(out, "NetworkPolicy/y/allow-x-a") {
		t.Errorf("trace x/a -> y/b:80: %q", out)
	}
	out = e.MustCLI("policy", "trace", "--from", "x/c", "--to", "y/b", "--port", "80/TCP")
	if !strings.Contains(out, "DENIED") || !strings.Contains(out, "default-deny") {
		t.Errorf("trace x/c -> y/b:80: %q", out)
	}

	// observe shows the forwarded and the dropped flows, with rule and reason.
	ok := testenv.Eventually(5*time.Second, func() bool {
		out = e.MustCLI("observe", "--since-start", "--endpoint", "y/b", "--port", "80", "--protocol", "tcp")
		return strings.Contains(out, "FORWARDED rule=NetworkPolicy/y/allow-x-a") && strings.Contains(out, "DROPPED reason=policy-default-deny")
	})
	if !ok {
		t.Errorf("observe: %q", out)
	}
	out = e.MustCLI("observe", "--since-start", "--verdict", "dropped", "-o", "json")
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var f api.Flow
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			t.Fatalf("observe -o json line %q: %v", line, err)
		}
		if f.Verdict != "DROPPED" {
			t.Errorf("verdict filter let through %+v", f)
		}
	}

	// Deleting the policy opens the way again.
	out = e.MustCLI("delete", "-f", writeFile(t, "allow.yaml", allowXAtoB))
	if !strings.Contains(out, "deleted") {
		t.Errorf("delete output %q", out)
	}
	if !e.Probe("x/c", bIP, 80, "tcp", 2*time.Second) {
		t.Error("x/c -> y/b still blocked after delete")
	}
}
