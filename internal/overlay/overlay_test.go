package overlay

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/testenv"
)

func TestParseModeAndMTU(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Mode
		mtu  int
	}{
		{"", Native, 0},
		{"native", Native, 0},
		{"vxlan", VXLAN, 1450},
		{"ipip", IPIP, 1480},
	} {
		m, err := ParseMode(tc.in)
		if err != nil || m != tc.want || PodMTU(m) != tc.mtu {
			t.Errorf("ParseMode(%q) = %q, %v, MTU %d; want %q, MTU %d", tc.in, m, err, PodMTU(m), tc.want, tc.mtu)
		}
	}
	if _, err := ParseMode("geneve"); err == nil {
		t.Error("ParseMode(geneve): no error")
	}
}

// Fabric finds the interfaces the nodes' addresses are reached through and this node's
// address on them, and refuses a node it has no route to.
func TestFabric(t *testing.T) {
	testenv.RequireRoot(t)
	ns := testenv.NewNetns(t, "rpov-"+testenv.Suffix(6))
	h := testenv.NetlinkHandle(t, ns)
	for i, pair := range [][2]string{{"fab0", "peer0"}, {"fab1", "peer1"}} {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: pair[0]}, PeerName: pair[1]}); err != nil {
			t.Fatal(err)
		}
		for _, name := range pair {
			l, err := h.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
		l, _ := h.LinkByName(pair[0])
		a, _ := netlink.ParseAddr([]string{"198.19.250.1/24", "198.19.251.1/24"}[i])
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
	}
	nodes := []Node{
		{Address: netip.MustParseAddr("198.19.251.7")},
		{Address: netip.MustParseAddr("198.19.250.2")},
		{Address: netip.MustParseAddr("198.19.250.3")},
	}
	names, local, err := Fabric(ns, nodes)
	if err != nil || !slices.Equal(names, []string{"fab0", "fab1"}) || local != netip.MustParseAddr("198.19.251.1") {
		t.Errorf("Fabric = %v, %v, %v; want [fab0 fab1], 198.19.251.1 (the first node's route's source)", names, local, err)
	}
	if names, local, err := Fabric(ns, nil); err != nil || len(names) != 0 || local.IsValid() {
		t.Errorf("Fabric without nodes = %v, %v, %v", names, local, err)
	}
	if _, _, err := Fabric(ns, []Node{{Address: netip.MustParseAddr("198.19.99.1")}}); err == nil {
		t.Error("Fabric with a node it has no route to: no error")
	}

	// IP-in-IP routes the pod CIDRs via the nodes, with room for the outer header.
	nodes[1].PodCIDR = netip.MustParsePrefix("198.18.32.0/20")
	if err := SyncRoutes(ns, IPIP, netip.Addr{}, nodes); err != nil {
		t.Fatal(err)
	}
	rs, err := h.RouteGet(net.ParseIP("198.18.32.9"))
	if err != nil || len(rs) != 1 || !rs[0].Gw.Equal(net.ParseIP("198.19.250.2")) || rs[0].MTU != FabricMTU-IPIPOverhead {
		t.Errorf("route to a pod of node 198.19.250.2: %+v (%v), want via it with MTU %d", rs, err, FabricMTU-IPIPOverhead)
	}
	if err := RemoveRoutes(ns); err != nil {
		t.Fatal(err)
	}
	if got, err := Routes(ns); err != nil || len(got) != 0 {
		t.Errorf("routes left: %v (%v)", got, err)
	}
}

// VXLAN routes another node's IPv6 pod CIDR into the device beside its IPv4 one; a mode that
// carries no IPv6 routes none (and takes away the one VXLAN made), and RemoveRoutes leaves
// no route of either family.
func TestSyncRoutesIPv6(t *testing.T) {
	testenv.RequireRoot(t)
	ns := testenv.NewNetns(t, "rpov6-"+testenv.Suffix(6))
	h := testenv.NetlinkHandle(t, ns)
	if _, err := EnsureDevice(ns); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fab0"}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	l, _ := h.LinkByName("fab0")
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr("198.19.250.1/24")
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
	// The VXLAN routes' source, the node's router address, is on lo (as endpoint.Node puts it).
	lo, _ := h.LinkByName("lo")
	router, _ := netlink.ParseAddr("198.18.0.1/32")
	if err := h.AddrAdd(lo, router); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	cidr4, cidr6 := netip.MustParsePrefix("198.18.32.0/20"), netip.MustParsePrefix("2001:2:0:2::/64")
	nodes := []Node{{Address: netip.MustParseAddr("198.19.250.2"), PodCIDR: cidr4, PodCIDR6: cidr6}}
	if err := SyncRoutes(ns, VXLAN, netip.MustParseAddr("198.18.0.1"), nodes); err != nil {
		t.Fatal(err)
	}
	got, err := Routes(ns)
	slices.SortFunc(got, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	if err != nil || !slices.Equal(got, []netip.Prefix{cidr4, cidr6}) {
		t.Errorf("VXLAN routes %v (%v), want %v and %v", got, err, cidr4, cidr6)
	}
	dev, _ := h.LinkByName(DeviceName)
	rs, err := h.RouteGet(net.ParseIP("2001:2:0:2::5"))
	if err != nil || len(rs) != 1 || rs[0].LinkIndex != dev.Attrs().Index {
		t.Errorf("route to a pod's IPv6 address: %+v (%v), want through %s", rs, err, DeviceName)
	}
	for _, mode := range []Mode{IPIP, Native} {
		if err := SyncRoutes(ns, mode, netip.Addr{}, nodes); err != nil {
			t.Fatal(err)
		}
		if got, err := Routes(ns); err != nil || !slices.Equal(got, []netip.Prefix{cidr4}) {
			t.Errorf("%s routes %v (%v), want %v only", mode, got, err, cidr4)
		}
	}
	if err := RemoveRoutes(ns); err != nil {
		t.Fatal(err)
	}
	if got, err := Routes(ns); err != nil || len(got) != 0 {
		t.Errorf("routes left: %v (%v)", got, err)
	}
}
