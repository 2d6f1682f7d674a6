package agent

import (
	"context"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/labels"
)

// namedPortsPolicy names ports only: x/a admits x/b on its own "serve-80-tcp" and sends
// to x/b on x/b's "serve-81-tcp".
const namedPortsPolicy = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: named, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: b}}}]
    ports: [{port: serve-80-tcp}]
  egress:
  - to: [{podSelector: {matchLabels: {pod: b}}}]
    ports: [{port: serve-81-tcp}]
`

// In Kubernetes mode a port given by name resolves against the pods' container ports: a
// local pod's (from its CNI ADD, then every sync) for ingress, a pod's on another node
// for egress to it; both follow changes of the pods and survive a restart.
func TestSyncClusterNamedPorts(t *testing.T) {
	h := newHarness(t)
	h.a.Close()
	lookup := pods{"x/a": {Labels: labels.Labels{"pod": "a"}, Ports: []PortRecord{{Name: "serve-80-tcp", Port: 80, Protocol: "TCP"}}}}
	h.cfg.Kubernetes = &Kubernetes{NodeName: "n1", Pods: lookup}
	h.start()
	ctx := context.Background()
	cniAdd(t, h, "c1", "eth0", "x", "a")
	if ep, err := h.a.GetEndpoint(ctx, "x", "a"); err != nil || len(ep.Ports) != 1 || ep.Ports[0].Port != 80 {
		t.Fatalf("x/a after its CNI ADD: %+v, %v; want its container port serve-80-tcp", ep.Ports, err)
	}
	objects := map[string]PolicyObject{"np": {Kind: "NetworkPolicy", Namespace: "x", Name: "named", ResourceVersion: "1", Object: object(namedPortsPolicy)}}
	view := func(localPort, remotePort uint16) ClusterView {
		v := clusterView(5000, objects)
		v.Remotes[0].Ports = []PortRecord{{Name: "serve-81-tcp", Port: remotePort, Protocol: "TCP"}}
		v.LocalPods = map[string]PodInfo{"x/a": {Labels: labels.Labels{"pod": "a"}, Ports: []PortRecord{{Name: "serve-80-tcp", Port: localPort, Protocol: "TCP"}}}}
		return v
	}
	allowed := func(from, to string, port uint16) bool {
		t.Helper()
		res, err := h.a.Trace(ctx, api.TraceRequest{From: from, To: to, Protocol: "TCP", Port: port})
		if err != nil {
			t.Fatalf("trace %s -> %s %d: %v", from, to, port, err)
		}
		return res.Allowed
	}
	want := func(what string, localPort, remotePort uint16) {
		t.Helper()
		for _, c := range []struct {
			from, to string
			port     uint16
			want     bool
		}{
			{"x/b", "x/a", localPort, true}, {"x/b", "x/a", localPort + 1, false},
			{"x/a", "x/b", remotePort, true}, {"x/a", "x/b", remotePort + 1, false},
		} {
			if got := allowed(c.from, c.to, c.port); got != c.want {
				t.Errorf("%s: %s -> %s TCP %d allowed %v, want %v", what, c.from, c.to, c.port, got, c.want)
			}
		}
	}
	if _, err := h.a.SyncCluster(ctx, view(80, 81)); err != nil {
		t.Fatal(err)
	}
	want("first sync", 80, 81)
	if rs, _ := h.a.ListRemoteEndpoints(ctx); len(rs) != 1 || len(rs[0].Ports) != 1 || rs[0].Ports[0].Port != 81 {
		t.Errorf("remote endpoints %+v, want x/b with serve-81-tcp", rs)
	}

	// The pods change their ports (a pod recreated with other containers).
	if _, err := h.a.SyncCluster(ctx, view(8080, 8081)); err != nil {
		t.Fatal(err)
	}
	want("ports changed", 8080, 8081)
	if allowed("x/b", "x/a", 80) || allowed("x/a", "x/b", 81) {
		t.Error("the old port numbers are still allowed after the pods changed them")
	}

	h.restart()
	want("after a restart", 8080, 8081)

	// A port the agent cannot use is reported, and the pod keeps what it had.
	v := view(8080, 8081)
	v.LocalPods["x/a"] = PodInfo{Labels: labels.Labels{"pod": "a"}, Ports: []PortRecord{{Name: "serve-80-tcp", Port: 0, Protocol: "TCP"}}}
	res, err := h.a.SyncCluster(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) != 1 || res.Problems[0] != "pod x/a: port serve-80-tcp: number must be 1-65535" {
		t.Errorf("problems %q, want x/a's bad port", res.Problems)
	}
	want("a bad port reported", 8080, 8081)
}
