package agent

import (
	"context"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/overlay"
)

// On the VXLAN overlay a dual-stack node's pods are reachable over IPv6 too: the node's
// IPv6 pod CIDR is routed with its IPv4 one, and a remote pod's IPv6 address (derived as
// its node derived it: its IPv4 offset in the IPv6 pod CIDR) is in the ipcache with the
// identity and tunnel endpoint of its IPv4 one, across a restart.
func TestRemoteEndpointIPv6OverVXLAN(t *testing.T) {
	h := newDualStackHarnessOn(t, overlay.VXLAN)
	ctx := context.Background()
	n, err := h.a.PutNode(ctx, "n2", api.NodeSpec{Address: "198.19.0.2", PodCIDR: "10.2.0.0/24", PodCIDR6: "2001:2:0:2::/64"})
	if err != nil || n.PodCIDR6 != "2001:2:0:2::/64" {
		t.Fatalf("node with an IPv6 pod CIDR: %+v %v", n, err)
	}
	r, err := h.a.PutRemoteEndpoint(ctx, "x", "b", api.RemoteEndpointSpec{Node: "n2", IP: "10.2.0.5", Labels: map[string]string{"pod": "b"}})
	if err != nil || r.IP6 != "2001:2:0:2::5" {
		t.Fatalf("remote endpoint: %+v %v, want IPv6 address 2001:2:0:2::5", r, err)
	}
	check := func(when string) {
		t.Helper()
		ipc, _ := h.dp.snapshot()
		want := mapstate.IPCacheEntry{Identity: identity.Identity(r.Identity), TunnelEndpoint: netip.MustParseAddr("198.19.0.2")}
		for _, p := range []string{"10.2.0.5/32", "2001:2:0:2::5/128"} {
			if e := ipc[netip.MustParsePrefix(p)]; e != want {
				t.Errorf("%s: ipcache %s: %+v, want %+v", when, p, e, want)
			}
		}
		h.dp.fakeOverlay.mu.Lock()
		routes := h.dp.fakeOverlay.routes
		h.dp.fakeOverlay.mu.Unlock()
		wantRoutes := []overlay.Node{{Address: netip.MustParseAddr("198.19.0.2"), PodCIDR: netip.MustParsePrefix("10.2.0.0/24"),
			PodCIDR6: netip.MustParsePrefix("2001:2:0:2::/64")}}
		if !reflect.DeepEqual(routes, wantRoutes) {
			t.Errorf("%s: routes to other nodes %+v, want %+v", when, routes, wantRoutes)
		}
	}
	check("declared")
	h.restart()
	check("after restart")

	for _, c := range []struct {
		spec api.NodeSpec
		want string
	}{
		{api.NodeSpec{Address: "198.19.0.3", PodCIDR: "10.3.0.0/24", PodCIDR6: "10.4.0.0/24"}, "want an IPv6 prefix"},
		{api.NodeSpec{Address: "198.19.0.3", PodCIDR6: "2001:2:0:3::/64"}, "needs the node's IPv4 pod CIDR"},
		{api.NodeSpec{Address: "198.19.0.3", PodCIDR: "10.3.0.0/24", PodCIDR6: "2001:2::/48"}, "overlaps this node's"},
		{api.NodeSpec{Address: "198.19.0.3", PodCIDR: "10.3.0.0/16", PodCIDR6: "2001:2:0:3::/120"}, "fewer than the IPv4 pod range"},
	} {
		if _, err := h.a.PutNode(ctx, "n3", c.spec); !isStatus(err, 400) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("node %+v: %v, want a bad request saying %q", c.spec, err, c.want)
		}
	}
	// Two nodes' pods would share IPv6 addresses.
	_, err = h.a.PutNode(ctx, "n3", api.NodeSpec{Address: "198.19.0.3", PodCIDR: "10.3.0.0/24", PodCIDR6: "2001:2:0:2::/80"})
	if !isStatus(err, 409) || !strings.Contains(err.Error(), "overlaps node n2's") {
		t.Errorf("node with an IPv6 pod CIDR inside n2's: %v, want a conflict", err)
	}
}

// Native routing and IP-in-IP carry no IPv6 between nodes over the IPv4 fabric: another
// node's IPv6 pod CIDR is refused by name (overlay.ErrNoIPv6) through the API and by
// checkNodeCIDR6 (which a Kubernetes view's nodes go through too), and a remote pod's IPv6
// address gets no identity here even from a node record that has one (a state kept from
// VXLAN mode).
func TestRemoteEndpointIPv6RefusedWithoutVXLAN(t *testing.T) {
	for _, mode := range []overlay.Mode{overlay.Native, overlay.IPIP} {
		h := newDualStackHarnessOn(t, mode)
		_, err := h.a.PutNode(context.Background(), "n2", api.NodeSpec{Address: "198.19.0.2", PodCIDR: "10.2.0.0/24", PodCIDR6: "2001:2:0:2::/64"})
		if !isStatus(err, 400) || !strings.Contains(err.Error(), overlay.ErrNoIPv6.Error()) {
			t.Errorf("%s: node with an IPv6 pod CIDR: %v, want a bad request saying %q", mode, err, overlay.ErrNoIPv6)
		}
		n := NodeRecord{Name: "n2", Address: netip.MustParseAddr("198.19.0.2"), PodCIDR: netip.MustParsePrefix("10.2.0.0/24"),
			PodCIDR6: netip.MustParsePrefix("2001:2:0:2::/64")}
		m := newModel()
		m.nodes = map[string]*NodeRecord{"n2": &n}
		m.remotes = map[string]*RemoteEndpointRecord{"x/b": {Namespace: "x", Name: "b", Node: "n2", IP: netip.MustParseAddr("10.2.0.5")}}
		var in mapstate.Input
		remoteInput(m, identity.NewAllocator(), &in, nil, overlay.CarriesIPv6(mode))
		if len(in.Remote) != 1 || in.Remote[0].IP6.IsValid() {
			t.Errorf("%s: remote pods %+v, want x/b without an IPv6 address", mode, in.Remote)
		}
		if err := checkNodeCIDR6(&n, mode, netip.Prefix{}); err == nil || !strings.Contains(err.Error(), overlay.ErrNoIPv6.Error()) {
			t.Errorf("%s: checkNodeCIDR6: %v, want %v", mode, err, overlay.ErrNoIPv6)
		}
	}
}

// In Kubernetes mode another Node's IPv6 pod CIDR is taken on the VXLAN overlay (its pods'
// IPv6 addresses mapped), and elsewhere left out with a problem that names the refusal,
// while the node and its IPv4 pods stay.
func TestSyncClusterNodeIPv6(t *testing.T) {
	for _, mode := range []overlay.Mode{overlay.VXLAN, overlay.Native} {
		h := kubernetesMode(newDualStackHarnessOn(t, mode))
		v := clusterView(5000, nil)
		v.Nodes[0].PodCIDR6 = netip.MustParsePrefix("2001:2:0:2::/64")
		// A second node whose IPv6 pod CIDR overlaps the first's: left out either way.
		v.Nodes = append(v.Nodes, NodeRecord{Name: "n3", Address: netip.MustParseAddr("198.19.0.3"),
			PodCIDR: netip.MustParsePrefix("10.3.0.0/24"), PodCIDR6: netip.MustParsePrefix("2001:2:0:2::/80")})
		res, err := h.a.SyncCluster(context.Background(), v)
		if err != nil {
			t.Fatal(err)
		}
		ipc, _ := h.dp.snapshot()
		_, mapped := ipc[netip.MustParsePrefix("2001:2:0:2::5/128")]
		if _, ok := ipc[netip.MustParsePrefix("10.2.0.5/32")]; !ok || mapped != overlay.CarriesIPv6(mode) {
			t.Errorf("%s: ipcache has x/b's IPv4 address %v, its IPv6 one %v", mode, ok, mapped)
		}
		want := []string{"node n3: IPv6 pod CIDR 2001:2:0:2::/80 overlaps node n2's (left out)"}
		if !overlay.CarriesIPv6(mode) {
			want = []string{"node n2: IPv6 pod CIDR 2001:2:0:2::/64: " + overlay.ErrNoIPv6.Error() + " (left out)",
				"node n3: IPv6 pod CIDR 2001:2:0:2::/80: " + overlay.ErrNoIPv6.Error() + " (left out)"}
		}
		if !slices.Equal(res.Problems, want) {
			t.Errorf("%s: problems %q, want %q", mode, res.Problems, want)
		}
	}
}
