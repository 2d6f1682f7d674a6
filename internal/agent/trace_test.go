package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
)

// bEgressTo81 lets x/b (a pod of node n2 in clusterView) send only to x/a's TCP 81.
const bEgressTo81 = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-out, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {pod: a}}}]
    ports: [{port: 81, protocol: TCP}]
`

// On the destination's node a trace from a pod on another node judges the source's side
// too, as the source's node does (from the policies and pods this node knows), and says
// which node decides it: a connection the source's node denies is not ALLOWED here.
func TestTraceRemoteSide(t *testing.T) {
	h := kubernetesMode(newHarness(t))
	ctx := context.Background()
	h.add("x", "a", map[string]string{"pod": "a"})
	objects := map[string]PolicyObject{"np": {Kind: "NetworkPolicy", Namespace: "x", Name: "b-out", ResourceVersion: "1", Object: object(bEgressTo81)}}
	if _, err := h.a.SyncCluster(ctx, clusterView(5000, objects)); err != nil {
		t.Fatal(err)
	}
	trace := func(from, to string, port uint16) api.TraceResult {
		t.Helper()
		res, err := h.a.Trace(ctx, api.TraceRequest{From: from, To: to, Protocol: "TCP", Port: port})
		if err != nil {
			t.Fatalf("trace %s -> %s %d: %v", from, to, port, err)
		}
		return res
	}
	res := trace("x/b", "x/a", 80)
	if res.Allowed || len(res.Sides) != 2 {
		t.Fatalf("x/b -> x/a 80: allowed %v, sides %+v; want denied by x/b's egress on its node", res.Allowed, res.Sides)
	}
	if s := res.Sides[0]; s.Direction != "egress" || s.Endpoint != "x/b" || s.Node != "n2" || s.Allowed || !s.Enforced {
		t.Errorf("egress side %+v, want x/b's on node n2, enforced, denied", s)
	}
	if s := res.Sides[1]; s.Direction != "ingress" || s.Endpoint != "x/a" || s.Node != "" || !s.Allowed {
		t.Errorf("ingress side %+v, want x/a's here, allowed", s)
	}
	if !strings.Contains(res.Diagnostic, "egress at x/b by node n2") {
		t.Errorf("diagnostic %q does not say which node decides the egress side", res.Diagnostic)
	}
	if res := trace("x/b", "x/a", 81); !res.Allowed || res.Sides[0].Rule == nil || !strings.Contains(res.Sides[0].Rule.Policy, "b-out") {
		t.Errorf("x/b -> x/a 81: %+v (rule %+v), want allowed by x/b-out", res, res.Sides[0].Rule)
	}
	// By address, and the other way: x/b's ingress is judged too (no policy: open).
	if res := trace("x/a", "10.2.0.5", 80); !res.Allowed || len(res.Sides) != 2 || res.Sides[1].Node != "n2" || res.Sides[1].Enforced {
		t.Errorf("x/a -> x/b's address 80: %+v, want allowed, x/b's ingress on n2 not enforced", res)
	}
}
