package agent

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/policy"
)

const allowFromRemoteB = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - podSelector: {matchLabels: {pod: b}}
`

// A pod declared on another node is selected by its labels like a local endpoint: the
// local endpoint's policy admits its identity, the ipcache maps its address to that
// identity and to its node's address, and all of it survives a restart. Deleting the node
// removes its pods.
func TestRemoteEndpointsSelectedByLabels(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	local := h.add("x", "a", map[string]string{"pod": "a"})
	if _, err := h.apply("p.yaml", allowFromRemoteB); err != nil {
		t.Fatal(err)
	}
	if _, err := h.a.PutRemoteEndpoint(ctx, "x", "b", api.RemoteEndpointSpec{Node: "n2", IP: "10.2.0.5"}); err == nil {
		t.Fatal("remote endpoint on an undeclared node accepted")
	}
	if _, err := h.a.PutNode(ctx, "n2", api.NodeSpec{Address: "198.19.0.2", PodCIDR: "10.2.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []api.RemoteEndpointSpec{
		{Node: "n2", IP: "10.3.0.5"},  // outside the node's pod CIDR
		{Node: "n2", IP: "not-an-ip"}, // not an address
		{Node: "n2", IP: "10.2.0.6", Labels: map[string]string{"io.kubernetes.pod.namespace": "y"}}, // reserved label
	} {
		if _, err := h.a.PutRemoteEndpoint(ctx, "x", "bad", bad); err == nil {
			t.Errorf("remote endpoint %+v accepted", bad)
		}
	}
	r, err := h.a.PutRemoteEndpoint(ctx, "x", "b", api.RemoteEndpointSpec{Node: "n2", IP: "10.2.0.5", Labels: map[string]string{"pod": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Identity < uint32(identity.FirstEndpoint) || r.Identity == uint32(local.Identity) {
		t.Fatalf("remote endpoint identity %d", r.Identity)
	}
	check := func(when string) {
		t.Helper()
		ipc, eps := h.dp.snapshot()
		e := ipc[netip.MustParsePrefix("10.2.0.5/32")]
		if want := (mapstate.IPCacheEntry{Identity: identity.Identity(r.Identity), TunnelEndpoint: netip.MustParseAddr("198.19.0.2")}); e != want {
			t.Errorf("%s: remote pod's ipcache entry %+v, want %+v", when, e, want)
		}
		if e := ipc[netip.MustParsePrefix("198.19.0.2/32")]; e.Identity != identity.RemoteNode {
			t.Errorf("%s: node address's ipcache entry %+v, want remote-node", when, e)
		}
		var admitted bool
		for _, ep := range eps {
			if ep.info.EpID == local.EpID {
				_, admitted = ep.pol.Entries[mapstate.Key{Identity: identity.Identity(r.Identity), Direction: policy.Ingress, Protocol: policy.ProtoAny}]
			}
		}
		if !admitted {
			t.Errorf("%s: local endpoint's policy does not admit the remote pod's identity", when)
		}
	}
	check("declared")
	// policy trace names the remote pod as it names a local endpoint.
	for _, req := range []api.TraceRequest{
		{From: "x/b", To: "x/a", Port: 80, Protocol: "TCP"},
		{From: "10.2.0.5", To: "x/a", Port: 80, Protocol: "TCP"},
	} {
		tr, err := h.a.Trace(ctx, req)
		if err != nil || !tr.Allowed {
			t.Errorf("trace %s -> %s: %+v %v, want allowed by the policy", req.From, req.To, tr, err)
		}
	}
	if _, err := h.a.Trace(ctx, api.TraceRequest{From: "x/nobody", To: "x/a", Port: 80, Protocol: "TCP"}); !isStatus(err, 404) {
		t.Errorf("trace from an unknown pod: %v, want not found", err)
	}
	h.dp.fakeOverlay.mu.Lock()
	routes := h.dp.fakeOverlay.routes
	h.dp.fakeOverlay.mu.Unlock()
	if want := []overlay.Node{{Address: netip.MustParseAddr("198.19.0.2"), PodCIDR: netip.MustParsePrefix("10.2.0.0/24")}}; !reflect.DeepEqual(routes, want) {
		t.Errorf("routes to other nodes %+v, want %+v", routes, want)
	}

	before, _ := h.a.ListRemoteEndpoints(ctx)
	nodes, _ := h.a.ListNodes(ctx)
	if len(nodes) != 1 || nodes[0].RemoteEndpoints != 1 || nodes[0].PodCIDR != "10.2.0.0/24" {
		t.Fatalf("nodes %+v", nodes)
	}
	h.restart()
	if after, _ := h.a.ListRemoteEndpoints(ctx); !reflect.DeepEqual(before, after) {
		t.Fatalf("remote endpoints changed across restart: %+v -> %+v", before, after)
	}
	check("after restart")

	// The number the pod's own node gave its labels is used here, so the identity carried
	// in the overlay means the same labels; a number these labels or others already have
	// here is refused.
	pinned, err := h.a.PutRemoteEndpoint(ctx, "x", "c", api.RemoteEndpointSpec{Node: "n2", IP: "10.2.0.6",
		Labels: map[string]string{"pod": "c"}, Identity: 70000})
	if err != nil || pinned.Identity != 70000 {
		t.Fatalf("pinned remote endpoint: %+v %v", pinned, err)
	}
	_, err = h.a.PutRemoteEndpoint(ctx, "x", "d", api.RemoteEndpointSpec{Node: "n2", IP: "10.2.0.7",
		Labels: map[string]string{"pod": "d"}, Identity: uint32(local.Identity)})
	if !isStatus(err, 409) {
		t.Errorf("remote endpoint pinned to a local endpoint's identity: %v, want a conflict", err)
	}

	if err := h.a.DeleteNode(ctx, "n2"); err != nil {
		t.Fatal(err)
	}
	ipc, _ := h.dp.snapshot()
	if _, ok := ipc[netip.MustParsePrefix("10.2.0.5/32")]; ok {
		t.Error("deleted node's pod still in the ipcache")
	}
	h.dp.fakeOverlay.mu.Lock()
	routes = h.dp.fakeOverlay.routes
	h.dp.fakeOverlay.mu.Unlock()
	if len(routes) != 0 {
		t.Errorf("routes after deleting the node: %+v", routes)
	}
	if rs, _ := h.a.ListRemoteEndpoints(ctx); len(rs) != 0 {
		t.Errorf("remote endpoints after deleting their node: %+v", rs)
	}
}

func isStatus(err error, status int) bool {
	var e *api.Error
	return errors.As(err, &e) && e.Status == status
}
