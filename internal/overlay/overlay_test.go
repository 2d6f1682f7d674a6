package overlay

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/testenv"
)

func TestParseModeAndMTU(t *testing.T) {
	for _, tc := range []struct {
		in        string
		want      Mode
		mtu, mtu6 int
	}{
		{"", Native, 0, 0},
		{"native", Native, 0, 0},
		{"vxlan", VXLAN, 1450, 1430},
		{"ipip", IPIP, 1480, 1480},
	} {
		m, err := ParseMode(tc.in)
		if err != nil || m != tc.want || PodMTU(m, UnderlayIPv4) != tc.mtu || PodMTU(m, UnderlayIPv6) != tc.mtu6 {
			t.Errorf("ParseMode(%q) = %q, %v, MTU %d (IPv6 underlay %d); want %q, MTU %d (%d)", tc.in, m, err,
				PodMTU(m, UnderlayIPv4), PodMTU(m, UnderlayIPv6), tc.want, tc.mtu, tc.mtu6)
		}
	}
	if _, err := ParseMode("geneve"); err == nil {
		t.Error("ParseMode(geneve): no error")
	}
}

// The underlay is IPv4 unless IPv6 is asked for; with IPv6, the nodes that have an IPv6
// fabric address are reached at it, by their IPv4 node address, and the others are not in
// the map (reached over IPv4).
func TestUnderlay(t *testing.T) {
	for in, want := range map[string]Underlay{"": UnderlayIPv4, "ipv4": UnderlayIPv4, "ipv6": UnderlayIPv6} {
		if u, err := ParseUnderlay(in); err != nil || u != want {
			t.Errorf("ParseUnderlay(%q) = %q, %v; want %q", in, u, err, want)
		}
	}
	if _, err := ParseUnderlay("inet6"); err == nil {
		t.Error("ParseUnderlay(inet6): no error")
	}
	a, b := netip.MustParseAddr("198.19.250.1"), netip.MustParseAddr("198.19.250.2")
	b6 := netip.MustParseAddr("2001:2:0:fa6::b")
	nodes := []Node{{Address: a}, {Address: b, Address6: b6}}
	if got := Remote6(UnderlayIPv4, nodes); len(got) != 0 {
		t.Errorf("Remote6(ipv4) = %v, want none", got)
	}
	if got := Remote6(UnderlayIPv6, nodes); !maps.Equal(got, map[netip.Addr]netip.Addr{b: b6}) {
		t.Errorf("Remote6(ipv6) = %v, want %v at %v only", got, b, b6)
	}
}

// IPv6 crosses nodes on the VXLAN overlay, and with native routing to a node that has an
// IPv6 fabric address; IP-in-IP refuses it with an error of its own.
func TestCheckIPv6(t *testing.T) {
	fab6 := netip.MustParseAddr("2001:2:0:fab::b")
	for _, tc := range []struct {
		mode     Mode
		address6 netip.Addr
		want     error
	}{
		{VXLAN, netip.Addr{}, nil},
		{VXLAN, fab6, nil},
		{Native, fab6, nil},
		{Native, netip.Addr{}, ErrNoIPv6},
		{IPIP, fab6, ErrIPIPNoIPv6},
		{IPIP, netip.Addr{}, ErrIPIPNoIPv6},
	} {
		err := CheckIPv6(tc.mode, tc.address6)
		if !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) || CarriesIPv6(tc.mode, tc.address6) != (tc.want == nil) {
			t.Errorf("CheckIPv6(%s, %v) = %v, want %v", tc.mode, tc.address6, err, tc.want)
		}
	}
}

// routeView is what a test compares of a route wantRoutes computes.
type routeView struct {
	gw, src netip.Addr
	dev     int
	mtu     int
	link    bool // scope link
}

func viewRoute(r *netlink.Route) routeView {
	gw, _ := netip.AddrFromSlice(r.Gw)
	src, _ := netip.AddrFromSlice(r.Src)
	return routeView{gw: gw.Unmap(), src: src.Unmap(), dev: r.LinkIndex, mtu: r.MTU, link: r.Scope == netlink.SCOPE_LINK}
}

// wantRoutes routes each node's IPv4 pod CIDR in every mode, and its IPv6 one through the
// VXLAN device or via its IPv6 fabric address with native routing; a node without an IPv6
// fabric address, or the IP-in-IP overlay, gets no IPv6 route. Every route is this
// package's (its protocol), so that SyncRoutes finds it again.
func TestWantRoutes(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	nodes := []Node{
		// Dual stack with an IPv6 fabric address.
		{Address: a("198.19.250.2"), PodCIDR: p("198.18.32.0/20"), PodCIDR6: p("2001:2:0:b::/64"), Address6: a("2001:2:0:fab::b")},
		// Dual stack without one (a record kept from VXLAN mode, say).
		{Address: a("198.19.250.3"), PodCIDR: p("198.18.48.0/20"), PodCIDR6: p("2001:2:0:c::/64")},
		// An IPv6 fabric address, no pods at all yet.
		{Address: a("198.19.250.4"), Address6: a("2001:2:0:fab::d")},
	}
	router := a("198.18.0.1")
	const dev = 7
	for _, tc := range []struct {
		mode Mode
		want map[netip.Prefix]routeView
	}{
		{Native, map[netip.Prefix]routeView{
			p("198.18.32.0/20"):  {gw: a("198.19.250.2")},
			p("198.18.48.0/20"):  {gw: a("198.19.250.3")},
			p("2001:2:0:b::/64"): {gw: a("2001:2:0:fab::b")},
		}},
		{IPIP, map[netip.Prefix]routeView{
			p("198.18.32.0/20"): {gw: a("198.19.250.2"), mtu: FabricMTU - IPIPOverhead},
			p("198.18.48.0/20"): {gw: a("198.19.250.3"), mtu: FabricMTU - IPIPOverhead},
		}},
		{VXLAN, map[netip.Prefix]routeView{
			p("198.18.32.0/20"):  {dev: dev, src: router, link: true},
			p("198.18.48.0/20"):  {dev: dev, src: router, link: true},
			p("2001:2:0:b::/64"): {dev: dev, link: true},
			p("2001:2:0:c::/64"): {dev: dev, link: true},
		}},
	} {
		devIndex := 0
		if tc.mode == VXLAN {
			devIndex = dev
		}
		got := map[netip.Prefix]routeView{}
		for dst, r := range wantRoutes(tc.mode, router, devIndex, nodes) {
			got[dst] = viewRoute(r)
			if r.Protocol != routeProtocol || r.Dst.String() != dst.String() {
				t.Errorf("%s: route to %v: protocol %v, destination %v", tc.mode, dst, r.Protocol, r.Dst)
			}
		}
		if !maps.Equal(got, tc.want) {
			t.Errorf("%s: routes %+v, want %+v", tc.mode, got, tc.want)
		}
	}
	if got := wantRoutes(Native, netip.Addr{}, 0, nil); len(got) != 0 {
		t.Errorf("no nodes: routes %v", got)
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

// VXLAN routes another node's IPv6 pod CIDR into the device beside its IPv4 one; IP-in-IP,
// and native routing to a node without an IPv6 fabric address, route none (and take away
// the one VXLAN made), and RemoveRoutes leaves no route of either family.
func TestSyncRoutesIPv6(t *testing.T) {
	testenv.RequireRoot(t)
	ns := testenv.NewNetns(t, "rpov6-"+testenv.Suffix(6))
	h := testenv.NetlinkHandle(t, ns)
	if _, err := EnsureDevice(ns, UnderlayIPv4); err != nil {
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

// Native routing routes another node's IPv6 pod CIDR via the node's IPv6 fabric address,
// and deletes the route once the node has no IPv6 fabric address or is gone. A node whose
// IPv6 gateway the kernel cannot reach does not keep the other routes from being made.
func TestSyncRoutesNativeIPv6(t *testing.T) {
	testenv.RequireRoot(t)
	ns := testenv.NewNetns(t, "rpovn6-"+testenv.Suffix(6))
	h := testenv.NetlinkHandle(t, ns)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fab0"}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"fab0", "peer0"} {
		l, _ := h.LinkByName(name)
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	l, _ := h.LinkByName("fab0")
	for _, s := range []string{"198.19.250.1/24", "2001:2:0:fab::a/64"} {
		a, _ := netlink.ParseAddr(s)
		a.Flags = unix.IFA_F_NODAD // usable at once: the route's gateway must be on-link
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
	}
	cidr4, cidr6 := netip.MustParsePrefix("198.18.32.0/20"), netip.MustParsePrefix("2001:2:0:b::/64")
	node := Node{Address: netip.MustParseAddr("198.19.250.2"), PodCIDR: cidr4, PodCIDR6: cidr6, Address6: netip.MustParseAddr("2001:2:0:fab::b")}
	// A node whose IPv6 fabric address this namespace has no route to.
	lost := Node{Address: netip.MustParseAddr("198.19.250.3"), PodCIDR: netip.MustParsePrefix("198.18.48.0/20"),
		PodCIDR6: netip.MustParsePrefix("2001:2:0:c::/64"), Address6: netip.MustParseAddr("2001:2:0:99::c")}

	if err := SyncRoutes(ns, Native, netip.Addr{}, []Node{lost, node}); err == nil {
		t.Error("SyncRoutes with an unreachable IPv6 gateway: no error")
	}
	got, err := Routes(ns)
	slices.SortFunc(got, netip.Prefix.Compare)
	if want := []netip.Prefix{cidr4, netip.MustParsePrefix("198.18.48.0/20"), cidr6}; err != nil || !slices.Equal(got, want) {
		t.Errorf("routes %v (%v), want %v: all but the unreachable node's IPv6 one", got, err, want)
	}
	rs, err := h.RouteGet(net.ParseIP("2001:2:0:b::5"))
	if err != nil || len(rs) != 1 || !rs[0].Gw.Equal(net.ParseIP("2001:2:0:fab::b")) || rs[0].LinkIndex != l.Attrs().Index {
		t.Errorf("route to a pod's IPv6 address: %+v (%v), want via 2001:2:0:fab::b on fab0", rs, err)
	}

	// Without its IPv6 fabric address the node's IPv6 pod CIDR is not routed.
	node.Address6 = netip.Addr{}
	if err := SyncRoutes(ns, Native, netip.Addr{}, []Node{node}); err != nil {
		t.Fatal(err)
	}
	if got, err := Routes(ns); err != nil || !slices.Equal(got, []netip.Prefix{cidr4}) {
		t.Errorf("routes without the IPv6 fabric address %v (%v), want %v only", got, err, cidr4)
	}
	if err := RemoveRoutes(ns); err != nil {
		t.Fatal(err)
	}
	if got, err := Routes(ns); err != nil || len(got) != 0 {
		t.Errorf("routes left: %v (%v)", got, err)
	}
}

// The VXLAN device is made with the pods' MTU of its underlay and takes the other one's
// when a run with the other underlay finds it; being collect_md, it receives VXLAN on both
// families' sockets, so nodes reach it over an IPv4 or an IPv6 fabric alike.
func TestEnsureDevice(t *testing.T) {
	testenv.RequireRoot(t)
	ns := testenv.NewNetns(t, "rpovd-"+testenv.Suffix(6))
	h := testenv.NetlinkHandle(t, ns)
	var idx int
	for _, u := range []Underlay{UnderlayIPv4, UnderlayIPv6, UnderlayIPv4} {
		i, err := EnsureDevice(ns, u)
		if err != nil {
			t.Fatal(err)
		}
		if idx != 0 && i != idx {
			t.Errorf("%s: device index %d, want the device made before (%d)", u, i, idx)
		}
		idx = i
		l, err := h.LinkByName(DeviceName)
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs().MTU != PodMTU(VXLAN, u) {
			t.Errorf("%s underlay: device MTU %d, want %d", u, l.Attrs().MTU, PodMTU(VXLAN, u))
		}
	}
	for _, network := range []string{"udp4", "udp6"} {
		err := testenv.InNetns(ns, func() error {
			c, err := net.ListenPacket(network, fmt.Sprintf(":%d", Port))
			if err == nil {
				c.Close()
			}
			return err
		})
		if !errors.Is(err, unix.EADDRINUSE) {
			t.Errorf("binding %s port %d beside the device: %v, want in use (the device's socket)", network, Port, err)
		}
	}
}
