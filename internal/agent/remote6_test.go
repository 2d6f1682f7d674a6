package agent

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/overlay"
)

// A dual-stack node's pods are reachable over IPv6 on the VXLAN overlay, and with native
// routing via the node's IPv6 fabric address: the node's IPv6 pod CIDR is routed with its
// IPv4 one, and a remote pod's IPv6 address (derived as its node derived it: its IPv4
// offset in the IPv6 pod CIDR) is in the ipcache with the identity and tunnel endpoint of
// its IPv4 one, across a restart; the node's IPv6 fabric address is remote-node's. An IPv6
// address in the node's pod CIDR that is no declared pod's has no entry of its own (world).
func TestRemoteEndpointIPv6(t *testing.T) {
	for _, tc := range []struct {
		mode     overlay.Mode
		address6 string
	}{{overlay.VXLAN, ""}, {overlay.Native, "2001:2:0:fab::2"}} {
		h := newDualStackHarnessOn(t, tc.mode)
		ctx := context.Background()
		n, err := h.a.PutNode(ctx, "n2", api.NodeSpec{Address: "198.19.0.2", PodCIDR: "10.2.0.0/24", PodCIDR6: "2001:2:0:2::/64", Address6: tc.address6})
		if err != nil || n.PodCIDR6 != "2001:2:0:2::/64" || n.Address6 != tc.address6 {
			t.Fatalf("%s: node with an IPv6 pod CIDR: %+v %v", tc.mode, n, err)
		}
		r, err := h.a.PutRemoteEndpoint(ctx, "x", "b", api.RemoteEndpointSpec{Node: "n2", IP: "10.2.0.5", Labels: map[string]string{"pod": "b"}})
		if err != nil || r.IP6 != "2001:2:0:2::5" {
			t.Fatalf("%s: remote endpoint: %+v %v, want IPv6 address 2001:2:0:2::5", tc.mode, r, err)
		}
		check := func(when string) {
			t.Helper()
			ipc, _ := h.dp.snapshot()
			want := mapstate.IPCacheEntry{Identity: identity.Identity(r.Identity), TunnelEndpoint: netip.MustParseAddr("198.19.0.2")}
			for _, p := range []string{"10.2.0.5/32", "2001:2:0:2::5/128"} {
				if e := ipc[netip.MustParsePrefix(p)]; e != want {
					t.Errorf("%s, %s: ipcache %s: %+v, want %+v", tc.mode, when, p, e, want)
				}
			}
			for p, e := range ipc {
				if p.Contains(netip.MustParseAddr("2001:2:0:2::9")) && p.Bits() != 0 {
					t.Errorf("%s, %s: ipcache maps %v (%+v), which holds an address that is no pod's", tc.mode, when, p, e)
				}
			}
			wantNode := mapstate.IPCacheEntry{Identity: identity.RemoteNode}
			if e, ok := ipc[netip.MustParsePrefix("2001:2:0:fab::2/128")]; (tc.address6 != "") != ok || ok && e != wantNode {
				t.Errorf("%s, %s: ipcache of the node's IPv6 fabric address: %+v %v, want %+v", tc.mode, when, e, ok, wantNode)
			}
			h.dp.fakeOverlay.mu.Lock()
			routes := h.dp.fakeOverlay.routes
			h.dp.fakeOverlay.mu.Unlock()
			wantRoutes := []overlay.Node{{Address: netip.MustParseAddr("198.19.0.2"), PodCIDR: netip.MustParsePrefix("10.2.0.0/24"),
				PodCIDR6: netip.MustParsePrefix("2001:2:0:2::/64")}}
			if tc.address6 != "" {
				wantRoutes[0].Address6 = netip.MustParseAddr(tc.address6)
			}
			if !reflect.DeepEqual(routes, wantRoutes) {
				t.Errorf("%s, %s: routes to other nodes %+v, want %+v", tc.mode, when, routes, wantRoutes)
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
			{api.NodeSpec{Address: "198.19.0.3", PodCIDR6: "2001:2:0:3::/64", Address6: tc.address6}, "needs the node's IPv4 pod CIDR"},
			{api.NodeSpec{Address: "198.19.0.3", PodCIDR: "10.3.0.0/24", PodCIDR6: "2001:2::/48", Address6: tc.address6}, "overlaps this node's"},
			{api.NodeSpec{Address: "198.19.0.3", PodCIDR: "10.3.0.0/16", PodCIDR6: "2001:2:0:3::/120", Address6: tc.address6}, "fewer than the IPv4 pod range"},
			{api.NodeSpec{Address: "198.19.0.3", Address6: "198.19.0.3"}, "want the node's global or unique-local IPv6"},
			{api.NodeSpec{Address: "198.19.0.3", Address6: "fe80::3"}, "want the node's global or unique-local IPv6"},
			{api.NodeSpec{Address: "198.19.0.3", Address6: "2001:2::1"}, "this node's IPv6 router address"},
			{api.NodeSpec{Address: "198.19.0.3", Address6: "no"}, "address6"},
		} {
			if _, err := h.a.PutNode(ctx, "n3", c.spec); !isStatus(err, 400) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: node %+v: %v, want a bad request saying %q", tc.mode, c.spec, err, c.want)
			}
		}
		// Two nodes' pods would share IPv6 addresses.
		_, err = h.a.PutNode(ctx, "n3", api.NodeSpec{Address: "198.19.0.3", PodCIDR: "10.3.0.0/24", PodCIDR6: "2001:2:0:2::/80", Address6: "2001:2:0:fab::3"})
		if !isStatus(err, 409) || !strings.Contains(err.Error(), "overlaps node n2's") {
			t.Errorf("%s: node with an IPv6 pod CIDR inside n2's: %v, want a conflict", tc.mode, err)
		}
		if tc.address6 == "" {
			continue
		}
		_, err = h.a.PutNode(ctx, "n3", api.NodeSpec{Address: "198.19.0.3", Address6: tc.address6})
		if !isStatus(err, 409) || !strings.Contains(err.Error(), "is node n2's") {
			t.Errorf("%s: node with n2's IPv6 fabric address: %v, want a conflict", tc.mode, err)
		}
		// n2 without its IPv6 fabric address keeps no IPv6 pod CIDR natively routed; once
		// deleted, no route is left.
		if _, err := h.a.PutNode(ctx, "n2", api.NodeSpec{Address: "198.19.0.2", PodCIDR: "10.2.0.0/24", PodCIDR6: "2001:2:0:2::/64"}); !isStatus(err, 400) ||
			!strings.Contains(err.Error(), overlay.ErrNoIPv6.Error()) {
			t.Errorf("%s: n2 without its IPv6 fabric address: %v, want %v", tc.mode, err, overlay.ErrNoIPv6)
		}
		if err := h.a.DeleteNode(ctx, "n2"); err != nil {
			t.Fatal(err)
		}
		h.dp.fakeOverlay.mu.Lock()
		routes := h.dp.fakeOverlay.routes
		h.dp.fakeOverlay.mu.Unlock()
		ipc, _ := h.dp.snapshot()
		if _, ok := ipc[netip.MustParsePrefix("2001:2:0:2::5/128")]; len(routes) != 0 || ok {
			t.Errorf("%s: n2 deleted: routes %+v, x/b's IPv6 address mapped %v", tc.mode, routes, ok)
		}
	}
}

// Native routing to a node without an IPv6 fabric address, and IP-in-IP to any node, carry
// no IPv6 between nodes: another node's IPv6 pod CIDR is refused by name (overlay.ErrNoIPv6,
// overlay.ErrIPIPNoIPv6) through the API and by checkNodeCIDR6 (which a Kubernetes view's
// nodes go through too), and a remote pod's IPv6 address gets no identity here even from a
// node record that has one (a state kept from VXLAN mode).
func TestRemoteEndpointIPv6Refused(t *testing.T) {
	for _, tc := range []struct {
		mode     overlay.Mode
		address6 string
		want     error
	}{
		{overlay.Native, "", overlay.ErrNoIPv6},
		{overlay.IPIP, "", overlay.ErrIPIPNoIPv6},
		{overlay.IPIP, "2001:2:0:fab::2", overlay.ErrIPIPNoIPv6},
	} {
		h := newDualStackHarnessOn(t, tc.mode)
		_, err := h.a.PutNode(context.Background(), "n2", api.NodeSpec{Address: "198.19.0.2", PodCIDR: "10.2.0.0/24", PodCIDR6: "2001:2:0:2::/64", Address6: tc.address6})
		if !isStatus(err, 400) || !strings.Contains(err.Error(), tc.want.Error()) {
			t.Errorf("%s: node with an IPv6 pod CIDR and address6 %q: %v, want a bad request saying %q", tc.mode, tc.address6, err, tc.want)
		}
		n := NodeRecord{Name: "n2", Address: netip.MustParseAddr("198.19.0.2"), PodCIDR: netip.MustParsePrefix("10.2.0.0/24"),
			PodCIDR6: netip.MustParsePrefix("2001:2:0:2::/64")}
		if tc.address6 != "" {
			n.Address6 = netip.MustParseAddr(tc.address6)
		}
		m := newModel()
		m.nodes = map[string]*NodeRecord{"n2": &n}
		m.remotes = map[string]*RemoteEndpointRecord{"x/b": {Namespace: "x", Name: "b", Node: "n2", IP: netip.MustParseAddr("10.2.0.5")}}
		var in mapstate.Input
		remoteInput(m, identity.NewAllocator(), &in, nil, tc.mode)
		if len(in.Remote) != 1 || in.Remote[0].IP6.IsValid() {
			t.Errorf("%s: remote pods %+v, want x/b without an IPv6 address", tc.mode, in.Remote)
		}
		if err := checkNodeCIDR6(&n, tc.mode, netip.Prefix{}); !errors.Is(err, tc.want) {
			t.Errorf("%s: checkNodeCIDR6: %v, want %v", tc.mode, err, tc.want)
		}
	}
}

// In Kubernetes mode another Node's IPv6 pod CIDR is taken on the VXLAN overlay, and with
// native routing when the Node has an IPv6 InternalIP (its pods' IPv6 addresses mapped, an
// unresolved pod's to the init identity as its IPv4 one, never left to world); elsewhere it
// is left out with a problem that names the refusal, while the node and its IPv4 pods stay.
// An IPv6 fabric address that cannot be a node's is left out too.
func TestSyncClusterNodeIPv6(t *testing.T) {
	for _, tc := range []struct {
		mode     overlay.Mode
		address6 string
		refusal  error // nil: the IPv6 pod CIDR is taken
	}{
		{overlay.VXLAN, "", nil},
		{overlay.Native, "2001:2:0:fab::2", nil},
		{overlay.Native, "", overlay.ErrNoIPv6},
		{overlay.Native, "fe80::2", overlay.ErrNoIPv6},
		{overlay.IPIP, "2001:2:0:fab::2", overlay.ErrIPIPNoIPv6},
	} {
		h := kubernetesMode(newDualStackHarnessOn(t, tc.mode))
		v := clusterView(5000, nil)
		v.Nodes[0].PodCIDR6 = netip.MustParsePrefix("2001:2:0:2::/64")
		if tc.address6 != "" {
			v.Nodes[0].Address6 = netip.MustParseAddr(tc.address6)
		}
		// A second node whose IPv6 pod CIDR overlaps the first's (left out either way), and
		// whose IPv6 fabric address is the first's.
		v.Nodes = append(v.Nodes, NodeRecord{Name: "n3", Address: netip.MustParseAddr("198.19.0.3"),
			PodCIDR: netip.MustParsePrefix("10.3.0.0/24"), PodCIDR6: netip.MustParsePrefix("2001:2:0:2::/80"), Address6: v.Nodes[0].Address6})
		res, err := h.a.SyncCluster(context.Background(), v)
		if err != nil {
			t.Fatal(err)
		}
		ipc, _ := h.dp.snapshot()
		_, mapped := ipc[netip.MustParsePrefix("2001:2:0:2::5/128")]
		if _, ok := ipc[netip.MustParsePrefix("10.2.0.5/32")]; !ok || mapped != (tc.refusal == nil) {
			t.Errorf("%s %q: ipcache has x/b's IPv4 address %v, its IPv6 one %v", tc.mode, tc.address6, ok, mapped)
		}
		var want []string
		switch {
		case tc.address6 == "fe80::2":
			want = append(want, "node n2: address6 fe80::2: want the node's global or unique-local IPv6 unicast address on the fabric (left out)",
				"node n3: address6 fe80::2: want the node's global or unique-local IPv6 unicast address on the fabric (left out)")
		case tc.address6 != "":
			want = append(want, "node n3: address6 "+tc.address6+" is node n2's (left out)")
		}
		if tc.refusal != nil {
			want = append(want, "node n2: IPv6 pod CIDR 2001:2:0:2::/64: "+tc.refusal.Error()+" (left out)")
		}
		// n3 is left without an IPv6 fabric address (none, or n2's).
		if err := overlay.CheckIPv6(tc.mode, netip.Addr{}); err != nil {
			want = append(want, "node n3: IPv6 pod CIDR 2001:2:0:2::/80: "+err.Error()+" (left out)")
		} else {
			want = append(want, "node n3: IPv6 pod CIDR 2001:2:0:2::/80 overlaps node n2's (left out)")
		}
		slices.Sort(want)
		if !slices.Equal(res.Problems, want) {
			t.Errorf("%s %q: problems %q, want %q", tc.mode, tc.address6, res.Problems, want)
		}

		// x/c claims x/b's number with other labels: unresolved.
		v.Remotes = append(v.Remotes, RemoteEndpointRecord{Namespace: "x", Name: "c", Node: "n2", IP: netip.MustParseAddr("10.2.0.6"),
			Labels: labels.Labels{"pod": "c"}, Identity: 5000})
		if res, err = h.a.SyncCluster(context.Background(), v); err != nil || len(res.Unresolved) != 1 || res.Unresolved["x/c"] == "" {
			t.Fatalf("%s %q: unresolved %v (%v), want x/c", tc.mode, tc.address6, res.Unresolved, err)
		}
		ipc, _ = h.dp.snapshot()
		e6, mapped6 := ipc[netip.MustParsePrefix("2001:2:0:2::6/128")]
		if e4 := ipc[netip.MustParsePrefix("10.2.0.6/32")]; e4.Identity != identity.Init || mapped6 != (tc.refusal == nil) || mapped6 && e6.Identity != identity.Init {
			t.Errorf("%s %q: ipcache of unresolved x/c: %+v, IPv6 %+v %v; want the init identity where mapped", tc.mode, tc.address6, e4, e6, mapped6)
		}
	}
}
