package cli_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// auditPolicies: allow-a is enforced (pod=b admits pod=a on TCP 80); audit-deny would deny
// that very flow and audit-isolate would isolate pod=c, both in audit mode.
const auditPolicies = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-a, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: a}}}]
    ports: [{protocol: TCP, port: 80}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: audit-deny
  namespace: x
  annotations: {policy.rampart.io/audit: "true"}
spec:
  endpointSelector: {matchLabels: {pod: b}}
  ingressDeny:
  - fromEndpoints: [{matchLabels: {pod: a}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: audit-isolate
  namespace: x
  annotations: {policy.rampart.io/audit: "true"}
spec:
  podSelector: {matchLabels: {pod: c}}
  policyTypes: [Ingress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate-d, namespace: x}
spec:
  podSelector: {matchLabels: {pod: d}}
  policyTypes: [Ingress]
`

// TestAuditMode: policies and an endpoint in audit mode, with real connections. What the
// audited policies would drop connects, and observe reports it as AUDIT with the rule or
// the default-deny policy; what the enforced policy drops stays dropped and names its
// default-deny policy; policy trace shows both.
func TestAuditMode(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{})
	e.AddEndpoint("x", "a", map[string]string{"pod": "a"})
	e.AddEndpoint("x", "b", map[string]string{"pod": "b"})
	e.AddEndpoint("x", "c", map[string]string{"pod": "c"})
	e.AddEndpoint("x", "d", map[string]string{"pod": "d"}, "--audit")
	e.MustCLI("apply", "-f", writeFile(t, "audit.yaml", auditPolicies))
	bIP, cIP, dIP := e.IP("x/b"), e.IP("x/c"), e.IP("x/d")

	type probe struct {
		to   string
		port uint16
		want bool
	}
	probes := []probe{{"x/b", 80, true}, {"x/c", 80, true}, {"x/d", 80, true}, {"x/b", 81, false}}
	got := make([]bool, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		ip := e.IP(p.to)
		wg.Go(func() { got[i] = e.Probe("x/a", ip, p.port, "tcp", 2*time.Second) })
	}
	wg.Wait()
	for i, p := range probes {
		if got[i] != p.want {
			t.Errorf("x/a -> %s:%d: connected %v, want %v", p.to, p.port, got[i], p.want)
		}
	}

	wantLines := []struct{ addr, text string }{
		{bIP.String() + ":80 ingress AUDIT reason=policy-deny rule=CiliumNetworkPolicy/x/audit-deny", "audit deny"},
		{cIP.String() + ":80 ingress AUDIT reason=policy-default-deny defaultDenyBy=NetworkPolicy/x/audit-isolate", "audited default deny"},
		{dIP.String() + ":80 ingress AUDIT reason=policy-default-deny defaultDenyBy=NetworkPolicy/x/isolate-d", "endpoint in audit mode"},
		{bIP.String() + ":81 ingress DROPPED reason=policy-default-deny defaultDenyBy=NetworkPolicy/x/allow-a", "enforced default deny"},
	}
	var out string
	ok := testenv.Eventually(5*time.Second, func() bool {
		out = e.MustCLI("observe", "--since-start", "--protocol", "tcp")
		for _, w := range wantLines {
			if !strings.Contains(out, w.addr) {
				return false
			}
		}
		return true
	})
	if !ok {
		for _, w := range wantLines {
			if !strings.Contains(out, w.addr) {
				t.Errorf("observe: no %s flow (%q)", w.text, w.addr)
			}
		}
		t.Fatalf("observe:\n%s", out)
	}
	if audited := e.MustCLI("observe", "--since-start", "--verdict", "AUDIT"); strings.Count(audited, " AUDIT ") < 3 || strings.Contains(audited, "DROPPED") {
		t.Errorf("observe --verdict AUDIT:\n%s", audited)
	}

	tr := e.MustCLI("policy", "trace", "--from", "x/a", "--to", "x/b", "--port", "80/TCP")
	if !strings.Contains(tr, "AUDIT: policies in audit mode would deny it by CiliumNetworkPolicy/x/audit-deny") || !strings.Contains(tr, "allowed by NetworkPolicy/x/allow-a") {
		t.Errorf("policy trace x/a -> x/b:80:\n%s", tr)
	}
	t.Logf("trace:\n%s\nobserve:\n%s", tr, out)
	if ep := e.Endpoint("x/d"); !ep.Audit || ep.EnforceIngress {
		t.Errorf("x/d: audit %v, enforces ingress %v; want audit, not enforcing", ep.Audit, ep.EnforceIngress)
	}

	// Out of audit mode x/d enforces isolate-d; back in, it reports again.
	e.MustCLI("endpoint", "audit", "x/d", "off")
	if ep := e.Endpoint("x/d"); ep.Audit || !ep.EnforceIngress {
		t.Errorf("x/d after audit off: audit %v, enforces ingress %v", ep.Audit, ep.EnforceIngress)
	}
	if e.Probe("x/a", dIP, 80, "tcp", probeTimeout) {
		t.Error("x/a -> x/d:80 connected with x/d out of audit mode, which isolate-d isolates")
	}
	e.MustCLI("endpoint", "audit", "x/d", "on")
	if !e.Probe("x/a", dIP, 80, "tcp", 2*time.Second) {
		t.Error("x/a -> x/d:80 blocked with x/d back in audit mode")
	}
	if _, errs, code := e.CLI("endpoint", "audit", "x/d", "maybe"); code == 0 || !strings.Contains(errs, `audit mode "maybe": want on or off`) {
		t.Errorf("endpoint audit x/d maybe: exit %d, %s", code, errs)
	}
}
