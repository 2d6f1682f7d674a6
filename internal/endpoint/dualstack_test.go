package endpoint_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
)

// newDualStackNode is newNode with the IPv6 pod range 2001:2::/64.
func newDualStackNode(t *testing.T) endpoint.Node {
	t.Helper()
	return newNodeWith(t, netip.MustParsePrefix("2001:2::/64"))
}

// A dual-stack endpoint has its IPv6 address and link-local address and no other, the
// host veth only the router's link-local address, each side the routes it needs; and with
// no BPF attached the endpoint and the node reach each other over IPv6, and two
// endpoints each other through the node.
func TestDualStackEndpoint(t *testing.T) {
	n := newDualStackNode(t)
	if n.Router6() != netip.MustParseAddr("2001:2::1") {
		t.Fatalf("Router6 = %v", n.Router6())
	}
	a, err := n.Create("x", "a", netip.MustParseAddr("198.18.0.10"))
	if err != nil {
		t.Fatalf("create a: %v", err)
	}
	t.Cleanup(func() { n.Delete("x", "a") })
	b, err := n.Create("y", "b", netip.MustParseAddr("198.18.0.11"))
	if err != nil {
		t.Fatalf("create b: %v", err)
	}
	t.Cleanup(func() { n.Delete("y", "b") })
	if a.IP6 != netip.MustParseAddr("2001:2::a") || a.LinkLocal6 != netip.MustParseAddr("fe80::a") {
		t.Fatalf("endpoint a's IPv6 addresses: %v %v", a.IP6, a.LinkLocal6)
	}
	if got, err := n.Lookup("x", "a", a.IP); err != nil || got.IP6 != a.IP6 || got.LinkLocal6 != a.LinkLocal6 {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}

	// The endpoint side.
	pod := testenv.NetlinkHandle(t, a.NetnsPath)
	eth, err := pod.LinkByName(endpoint.PodIfName)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := addrStrings(t, pod, eth, netlink.FAMILY_V6), []string{"2001:2::a/128", "fe80::a/64"}; !slices.Equal(got, want) {
		t.Errorf("endpoint IPv6 addresses %v, want %v", got, want)
	}
	if got, want := addrStrings(t, pod, eth, netlink.FAMILY_V4), []string{"198.18.0.10/32"}; !slices.Equal(got, want) {
		t.Errorf("endpoint IPv4 addresses %v, want %v", got, want)
	}
	if got, want := routeStrings(t, pod, eth.Attrs().Index), []string{"::/0 via fe80::1 src 2001:2::a", "fe80::/64"}; !slices.Equal(got, want) {
		t.Errorf("endpoint IPv6 routes %v, want %v", got, want)
	}
	if mode := readSysctl(t, a.NetnsPath, "net/ipv6/conf/"+endpoint.PodIfName+"/addr_gen_mode"); mode != "1" {
		t.Errorf("endpoint addr_gen_mode = %s, want 1 (none)", mode)
	}

	// The node side.
	node := nodeHandle(t, n)
	host, err := node.LinkByName(a.HostIfName)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := addrStrings(t, node, host, netlink.FAMILY_V6), []string{"fe80::1/64"}; !slices.Equal(got, want) {
		t.Errorf("host veth IPv6 addresses %v, want %v", got, want)
	}
	if got, want := routeStrings(t, node, a.HostIfIndex), []string{"2001:2::a/128 src 2001:2::1", "fe80::/64"}; !slices.Equal(got, want) {
		t.Errorf("node IPv6 routes via %s: %v, want %v", a.HostIfName, got, want)
	}
	for key, want := range map[string]string{
		"net/ipv6/conf/" + a.HostIfName + "/disable_ipv6":  "0",
		"net/ipv6/conf/" + a.HostIfName + "/addr_gen_mode": "1",
		"net/ipv6/conf/all/forwarding":                     "1",
		"net/ipv4/ip_forward":                              "1",
	} {
		if got := readSysctl(t, n.NetnsPath(), key); got != want {
			t.Errorf("node %s = %s, want %s", key, got, want)
		}
	}
	if has, err := n.HasLoAddress(n.Router6()); err != nil || !has {
		t.Errorf("node lo has %v: %v, %v", n.Router6(), has, err)
	}

	// Traffic, with no program on the veths.
	if !ping6(a.NetnsPath, n.Router6()) {
		t.Error("ping -6 endpoint a -> node's router address failed")
	}
	if !ping6(n.NetnsPath(), a.IP6) {
		t.Error("ping -6 node -> endpoint a failed")
	}
	if !ping6(a.NetnsPath, b.IP6) {
		t.Error("ping -6 endpoint a -> endpoint b failed")
	}
	// IPv4 is as on an IPv4-only node.
	srv, err := testenv.Serve(b.NetnsPath, []uint16{80}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if !testenv.Probe(a.NetnsPath, netip.AddrPortFrom(b.IP, 80), "tcp", 3*time.Second) {
		t.Error("tcp a -> b:80 over IPv4 failed")
	}

	if err := n.Delete("x", "a"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if got := routeStrings(t, node, a.HostIfIndex); len(got) != 0 {
		t.Errorf("routes via the deleted veth: %v", got)
	}
}

// A dual-stack endpoint in a runtime's namespace: LookupIn finds it only with both its
// addresses.
func TestDualStackCreateIn(t *testing.T) {
	n := newDualStackNode(t)
	ip := netip.MustParseAddr("198.18.0.30")
	sandbox := testenv.NewNetns(t, "rp-eptest6-sb-"+testenv.Suffix(6))
	at := endpoint.Attachment{NetnsPath: sandbox, IfName: "net1"}
	ep, err := n.CreateIn("x", "c", ip, at, nil)
	if err != nil {
		t.Fatalf("CreateIn: %v", err)
	}
	t.Cleanup(func() { n.DeleteLink("x", "c") })
	if ep.IP6 != netip.MustParseAddr("2001:2::1e") {
		t.Fatalf("CreateIn: IP6 %v", ep.IP6)
	}
	if !ping6(sandbox, n.Router6()) {
		t.Error("ping -6 endpoint -> node's router address failed")
	}
	if got, err := n.LookupIn("x", "c", ip, at); err != nil || got.IP6 != ep.IP6 || got.LinkLocal6 != ep.LinkLocal6 {
		t.Fatalf("LookupIn = %+v, %v", got, err)
	}
	sb := testenv.NetlinkHandle(t, sandbox)
	l, err := sb.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.AddrDel(l, &netlink.Addr{IPNet: netlink.NewIPNet(ep.IP6.AsSlice())}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.LookupIn("x", "c", ip, at); err == nil || !strings.Contains(err.Error(), "does not have address 2001:2::1e") {
		t.Fatalf("LookupIn without the IPv6 address: %v", err)
	}
}

// Setup refuses an IPv6 range that cannot pair with the IPv4 one.
func TestDualStackSetupRefusesBadRange(t *testing.T) {
	n := endpoint.Node{PodCIDR: netip.MustParsePrefix("198.18.0.0/16"), PodCIDR6: netip.MustParsePrefix("2001:2::/120")}
	if err := n.Setup(); err == nil || !strings.Contains(err.Error(), "fewer than") {
		t.Fatalf("Setup with a /120 beside a /16: %v", err)
	}
}

// An IPv4-only node's host veth has IPv6 off and the node no IPv6 route to it, as before
// dual stack.
func TestIPv4OnlyHostVethHasNoIPv6(t *testing.T) {
	n := newNode(t)
	a, err := n.Create("x", "a", netip.MustParseAddr("198.18.0.10"))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { n.Delete("x", "a") })
	if a.IP6.IsValid() || a.LinkLocal6.IsValid() || n.Router6().IsValid() {
		t.Fatalf("IPv4-only endpoint has IPv6 addresses %v %v (router %v)", a.IP6, a.LinkLocal6, n.Router6())
	}
	if got := readSysctl(t, n.NetnsPath(), "net/ipv6/conf/"+a.HostIfName+"/disable_ipv6"); got != "1" {
		t.Errorf("host veth disable_ipv6 = %s, want 1", got)
	}
	node := nodeHandle(t, n)
	if got := routeStrings(t, node, a.HostIfIndex); len(got) != 0 {
		t.Errorf("IPv6 routes via %s: %v", a.HostIfName, got)
	}
	if got := routeStrings(t, testenv.NetlinkHandle(t, a.NetnsPath), 0); len(got) != 0 {
		t.Errorf("endpoint IPv6 routes: %v", got)
	}
}

// addrStrings are l's addresses of family, sorted.
func addrStrings(t *testing.T, h *netlink.Handle, l netlink.Link, family int) []string {
	t.Helper()
	addrs, err := h.AddrList(l, family)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		out = append(out, a.IPNet.String())
	}
	slices.Sort(out)
	return out
}

// routeStrings are the IPv6 unicast routes of the main table through interface ifindex
// (0: any), as "dst[ via gw][ src addr]", sorted.
func routeStrings(t *testing.T, h *netlink.Handle, ifindex int) []string {
	t.Helper()
	routes, err := h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range routes {
		if ifindex != 0 && r.LinkIndex != ifindex || r.Type != unix.RTN_UNICAST {
			continue
		}
		s := "::/0"
		if r.Dst != nil {
			s = r.Dst.String()
		}
		if r.Gw != nil {
			s += " via " + r.Gw.String()
		}
		if r.Src != nil {
			s += " src " + r.Src.String()
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func readSysctl(t *testing.T, nsPath, key string) string {
	t.Helper()
	v, err := endpoint.ReadSysctl(nsPath, key)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ping6 reports whether one ICMPv6 echo from the namespace at nsPath to dst is answered,
// trying for up to 3 s, each try waiting a second at most.
func ping6(nsPath string, dst netip.Addr) bool {
	deadline := time.Now().Add(3 * time.Second)
	for {
		if _, err := testenv.Shell(nsPath, "ping", "-6", "-n", "-c", "1", "-W", "1", dst.String()); err == nil {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
