package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// twoNodes is two dual-stack agents, each in its own node namespace, joined by a fabric
// veth (IPv4, and IPv6 too with fabric6), with each other declared as nodes (with their
// IPv6 pod CIDRs where the overlay carries IPv6 to them).
type twoNodes struct {
	a, b           *agenttest.Env
	addrA, addrB   netip.Addr // fabric addresses
	addr6A, addr6B netip.Addr // IPv6 fabric addresses (zero: the fabric is IPv4 only)
	underlay       overlay.Underlay
}

// vxlanAddrB is where node A's VXLAN packets reach node B: its IPv6 fabric address over an
// IPv6 underlay, else its address.
func (n *twoNodes) vxlanAddrB() netip.Addr {
	if n.underlay == overlay.UnderlayIPv6 {
		return n.addr6B
	}
	return n.addrB
}

// dropFabric4 takes the IPv4 addresses off the fabric veth's two ends: from then on only
// IPv6 crosses between the nodes. The node addresses stay declared: they name the nodes.
func (n *twoNodes) dropFabric4(t *testing.T) {
	t.Helper()
	delAddr4(t, endpoint.NetnsPath(n.a.Config.NodeNetns), n.addrA)
	delAddr4(t, endpoint.NetnsPath(n.b.Config.NodeNetns), n.addrB)
}

// The nodes' IPv6 fabric addresses with fabric6: declared as node addresses (--address6),
// unlike the host policy test's fab6A and fab6B.
var (
	nodeFab6A = netip.MustParseAddr("2001:2:0:fa6::a")
	nodeFab6B = netip.MustParseAddr("2001:2:0:fa6::b")
)

func startTwoNodes(t *testing.T, mode overlay.Mode, fabric6 bool, underlay overlay.Underlay) *twoNodes {
	t.Helper()
	n := &twoNodes{addrA: netip.MustParseAddr("198.19.255.1"), addrB: netip.MustParseAddr("198.19.255.2"), underlay: underlay}
	cidrA, cidrB := netip.MustParsePrefix("198.18.16.0/20"), netip.MustParsePrefix("198.18.32.0/20")
	cidr6A, cidr6B := netip.MustParsePrefix("2001:2:0:a::/64"), netip.MustParsePrefix("2001:2:0:b::/64")
	n.a = agenttest.StartAgent(t, agenttest.Options{PodCIDR: cidrA, PodCIDR6: cidr6A, Tunnel: mode, VXLANUnderlay: underlay})
	n.b = agenttest.StartAgent(t, agenttest.Options{PodCIDR: cidrB, PodCIDR6: cidr6B, Tunnel: mode, VXLANUnderlay: underlay})
	agenttest.LinkFabric(t, n.a, n.b, n.addrA, n.addrB)
	addB := []string{"node", "add", "node-b", "--address", n.addrB.String(), "--pod-cidr", cidrB.String()}
	addA := []string{"node", "add", "node-a", "--address", n.addrA.String(), "--pod-cidr", cidrA.String()}
	if fabric6 {
		// The node namespaces go with the agents, and the addresses with them.
		n.addr6A, n.addr6B = nodeFab6A, nodeFab6B
		nodeA, nodeB := endpoint.NetnsPath(n.a.Config.NodeNetns), endpoint.NetnsPath(n.b.Config.NodeNetns)
		addAddr6(t, nodeA, linkHolding(t, nodeA, n.addrA), n.addr6A)
		addAddr6(t, nodeB, linkHolding(t, nodeB, n.addrB), n.addr6B)
		addB = append(addB, "--address6", n.addr6B.String())
		addA = append(addA, "--address6", n.addr6A.String())
	}
	full6B, full6A := append(slices.Clone(addB), "--pod-cidr6", cidr6B.String()), append(slices.Clone(addA), "--pod-cidr6", cidr6A.String())
	if err := overlay.CheckIPv6(mode, n.addr6B); err != nil {
		// Refused by name, never taken half-way: the node is declared IPv4-only.
		if _, errs, code := n.a.CLI(full6B...); code == 0 || !strings.Contains(errs, err.Error()) {
			t.Errorf("%s: node add --pod-cidr6: exit %d, %q; want the refusal %q", mode, code, errs, err)
		}
	} else {
		addB, addA = full6B, full6A
	}
	n.a.MustCLI(addB...)
	n.b.MustCLI(addA...)
	return n
}

// declare declares endpoint key of from as a remote endpoint on to, with its labels and
// the identity its node gave it.
func declare(t *testing.T, from, to *agenttest.Env, node, key string, labels string) {
	t.Helper()
	ep := from.Endpoint(key)
	to.MustCLI("remote", "add", key, "--node", node, "--ip", ep.IP, "--labels", labels,
		"--identity", strconv.FormatUint(uint64(ep.Identity), 10))
}

// pods creates x/a and x/c on node A and x/b on node B, declares each on the other node,
// and applies allowAToB80 on node B.
func (n *twoNodes) pods(t *testing.T) (a, c, b api.Endpoint) {
	t.Helper()
	a = n.a.AddEndpoint("x", "a", map[string]string{"pod": "a"})
	c = n.a.AddEndpoint("x", "c", map[string]string{"pod": "c"})
	// Remote pods are declared before node B allocates for its own, so that both nodes
	// can use the numbers node A gave (until identities are allocated cluster-wide).
	declare(t, n.a, n.b, "node-a", "x/a", "pod=a")
	declare(t, n.a, n.b, "node-a", "x/c", "pod=c")
	b = n.b.AddEndpoint("x", "b", map[string]string{"pod": "b"})
	declare(t, n.b, n.a, "node-b", "x/b", "pod=b")
	if _, errs, code := n.b.CLIStdin(allowAToB80, "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply: %s", errs)
	}
	return a, c, b
}

// allowAToB80: x/b admits x/a on port 80, TCP and UDP.
var allowAToB80 = testenv.AllowAToB80

// flowsOf returns the flows agent e has seen since it started.
func flowsOf(t *testing.T, e *agenttest.Env) []api.Flow {
	t.Helper()
	var out []api.Flow
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := e.Client.Observe(ctx, api.ObserveRequest{SinceStart: true}, func(f api.Flow) error {
		out = append(out, f)
		return nil
	})
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	return out
}

// Pods on two nodes talk through the VXLAN overlay: the receiving node's ingress policy
// selects the remote pod by labels and is judged on the identity the VNI carried (flows
// flagged tunnel); denied pairs are dropped; a pod that sends its own VXLAN packets with
// an identity of its choice is dropped (not from a node address); UDP datagrams larger
// than the pod MTU (fragments) pass when policy allows them and are dropped when it does
// not.
func TestOverlayVXLAN(t *testing.T) { testOverlay(t, overlay.VXLAN, overlay.UnderlayIPv4) }

// The same over an IPv6 fabric (rampartd --vxlan-underlay=ipv6, the nodes declared with
// their IPv6 fabric addresses): once the fabric's IPv4 addresses are gone, pods still talk
// over IPv4 and IPv6, judged on the VNI's identity, with the pods' MTU leaving room for the
// IPv6 outer header; a pod's own VXLAN packet to node B's IPv6 fabric address, from its
// IPv6 address (no node's), is dropped as tunnel-untrusted-source for an inner IPv4 and an
// inner IPv6 datagram.
func TestOverlayVXLANIPv6Fabric(t *testing.T) {
	testOverlay(t, overlay.VXLAN, overlay.UnderlayIPv6)
}

// The same through IP-in-IP: the packets between the nodes are encapsulated (protocol 4 on
// the fabric), the receiving node takes the source's identity from the inner source
// address (not flagged tunnel), and a pod's own IP-in-IP packet claiming another pod's
// address is dropped.
// Nodes move from one underlay to the other a node at a time: with node A sending over
// IPv6 and node B over IPv4, every connection's packets cross in both families (each node
// accepts both) and the same policy holds, for IPv4 and IPv6 between the pods.
func TestOverlayVXLANMixedUnderlay(t *testing.T) {
	n := startTwoNodes(t, overlay.VXLAN, true, overlay.UnderlayIPv6)
	_, _, b := n.pods(t)
	n.b.Stop()
	n.b.Config.VXLANUnderlay = overlay.UnderlayIPv4
	n.b.Start()
	for _, to := range []string{b.IP, b.IP6} {
		probeNodeB(t, n, netip.MustParseAddr(to), "vxlan, node A over IPv6, node B over IPv4", true)
	}
}

func TestOverlayIPIP(t *testing.T) { testOverlay(t, overlay.IPIP, overlay.UnderlayIPv4) }

// With native routing the receiving node takes the source's identity from its address
// (the remote pod declared in its ipcache): the same policy allows and denies the same
// pairs and fragments, with no overlay device. The nodes have IPv6 fabric addresses, so
// IPv6 between their pods is natively routed too and judged the same way, and an IPv6
// source from the fabric that is no known pod's is world.
func TestOverlayNative(t *testing.T) { testOverlay(t, overlay.Native, overlay.UnderlayIPv4) }

func testOverlay(t *testing.T, mode overlay.Mode, underlay overlay.Underlay) {
	n := startTwoNodes(t, mode, mode == overlay.Native || underlay == overlay.UnderlayIPv6, underlay)
	a, c, b := n.pods(t)
	bIP := netip.MustParseAddr(b.IP)
	if underlay == overlay.UnderlayIPv6 {
		n.dropFabric4(t)
	}

	// The overlay's MTU on the pods.
	if mtu := overlay.PodMTU(mode, underlay); mtu != 0 {
		for _, ep := range []api.Endpoint{a, c} {
			h := testenv.NetlinkHandle(t, ep.Netns)
			l, err := h.LinkByName(endpoint.PodIfName)
			if err != nil {
				t.Fatal(err)
			}
			if l.Attrs().MTU != mtu {
				t.Errorf("%s: pod MTU %d, want %d", ep.Name, l.Attrs().MTU, mtu)
			}
		}
	}
	h := testenv.NetlinkHandle(t, endpoint.NetnsPath(n.a.Config.NodeNetns))
	if _, err := h.LinkByName(overlay.DeviceName); (err == nil) != (mode == overlay.VXLAN) {
		t.Errorf("%s: %s exists %v", mode, overlay.DeviceName, err == nil)
	}

	probeNodeB(t, n, bIP, string(mode), true)
	if mode == overlay.IPIP {
		// The packets between the nodes are IP-in-IP, not natively routed.
		fabric, _, err := overlay.Fabric(endpoint.NetnsPath(n.b.Config.NodeNetns), []overlay.Node{{Address: n.addrA}})
		if err != nil || len(fabric) != 1 {
			t.Fatalf("node B's fabric interface: %v %v", fabric, err)
		}
		if !sawIPIP(t, endpoint.NetnsPath(n.b.Config.NodeNetns), fabric[0], n.addrA, n.addrB, bIP, func() {
			n.a.Probe("x/a", bIP, 80, "tcp", 3*time.Second)
		}) {
			t.Errorf("no IP-in-IP packet from node A to node B for x/b on %s", fabric[0])
		}
	}

	// A restarted agent keeps the overlay: device or programs, routes and remote pods.
	n.b.Restart()
	n.a.Restart()
	if !n.a.Probe("x/a", bIP, 80, "tcp", 3*time.Second) {
		t.Error("x/a -> node B x/b 80/tcp after both agents restarted: not connected")
	}
	if n.a.Probe("x/c", bIP, 80, "tcp", 700*time.Millisecond) {
		t.Error("x/c -> node B x/b 80/tcp after both agents restarted: connected, want denied")
	}

	// Node B judged x/a on the identity that arrived in the VNI (VXLAN), or that its
	// ipcache gives x/a's address (IP-in-IP, native): the same number, which only the
	// tunnel flag tells apart.
	var allowed, denied bool
	for _, f := range flowsOf(t, n.b) {
		if f.Endpoint != "x/b" || f.Direction != "ingress" || slices.Contains(f.Flags, "tunnel") != (mode == overlay.VXLAN) {
			continue
		}
		if f.Type == "new" && f.Source.IP == a.IP && f.Source.Identity == uint32(a.Identity) &&
			f.Source.Name == "a" && f.Source.Node == "node-a" {
			allowed = true
		}
		if f.Type == "drop" && f.Source.IP == c.IP && f.Source.Identity == uint32(c.Identity) {
			denied = true
		}
	}
	if !allowed || !denied {
		t.Errorf("node B's flows (%s): allowed flow from x/a with its identity %v, denied flow from x/c %v", mode, allowed, denied)
	}

	checkFragments(t, n, a, c, b)
	checkIPv6(t, n, mode, a, c, b)

	switch mode {
	case overlay.VXLAN:
		// x/c sends its own VXLAN packet to node B claiming x/a's identity in the VNI,
		// with an inner UDP datagram from x/a's address to x/b port 80 (which x/a may
		// reach).
		vc, err := testenv.Dial(c.Netns, "udp", netip.AddrPortFrom(n.vxlanAddrB(), overlay.Port), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer vc.Close()
		forged := vxlanPacket(uint32(a.Identity), netip.MustParseAddr(a.IP), bIP, 40999, 80, []byte("forged"))
		checkForged(t, n, a, "VXLAN", func() error { _, err := vc.Write(forged); return err })
	case overlay.IPIP:
		// x/c sends its own IP-in-IP packet (protocol 4) to node B whose inner datagram
		// comes from x/a's address to x/b port 80, so as to be judged as x/a.
		var rc net.PacketConn
		if err := testenv.InNetns(c.Netns, func() (err error) {
			rc, err = net.ListenPacket("ip4:4", "0.0.0.0")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		inner := ipv4UDP(netip.MustParseAddr(a.IP), bIP, 40999, 80, []byte("forged"))
		checkForged(t, n, a, "IP-in-IP", func() error {
			_, err := rc.WriteTo(inner, &net.IPAddr{IP: n.addrB.AsSlice()})
			return err
		})
	}
}

// overlayProbes are the probes from node A's pods to x/b on node B, and whether
// allowAToB80 lets each through.
var overlayProbes = []struct {
	from  string
	port  uint16
	proto string
	want  bool
}{
	{"x/a", 80, "tcp", true},
	{"x/a", 80, "udp", true},
	{"x/a", 81, "tcp", false},
	{"x/a", 81, "udp", false},
	{"x/c", 80, "tcp", false},
	{"x/c", 80, "udp", false},
}

// probeNodeB runs overlayProbes to x/b's address to; unless reachable, every one must fail.
func probeNodeB(t *testing.T, n *twoNodes, to netip.Addr, what string, reachable bool) {
	t.Helper()
	for _, p := range overlayProbes {
		want := p.want && reachable
		timeout := 3 * time.Second
		if !want {
			timeout = 700 * time.Millisecond
		}
		if got := n.a.Probe(p.from, to, p.port, p.proto, timeout); got != want {
			t.Errorf("%s: %s -> node B x/b [%v]:%d/%s: connected %v, want %v", what, p.from, to, p.port, p.proto, got, want)
		}
	}
}

// checkIPv6 probes x/b on node B over IPv6 from node A's pods. On the VXLAN overlay, and
// with native routing via the nodes' IPv6 fabric addresses, the same policy decides as for
// IPv4 (x/a to port 80 allowed, the rest denied, fragments included) on the identity the
// VNI carried or that node B's ipcache gives the source address. On VXLAN, x/c's own VXLAN
// packet claiming x/a's identity for an inner IPv6 datagram is dropped as from no node;
// natively, a source from the fabric that is no known pod's is judged as world. IP-in-IP,
// and native routing without IPv6 fabric addresses, carry no IPv6 between nodes: every
// probe fails (no route), none leaks.
func checkIPv6(t *testing.T, n *twoNodes, mode overlay.Mode, a, c, b api.Endpoint) {
	t.Helper()
	bIP6 := netip.MustParseAddr(b.IP6)
	carried := overlay.CarriesIPv6(mode, n.addr6B)
	probeNodeB(t, n, bIP6, string(mode)+" over IPv6", carried)
	if !carried {
		return
	}
	if mode == overlay.Native {
		// Natively routed: via node B's IPv6 fabric address, no device in between.
		h := testenv.NetlinkHandle(t, endpoint.NetnsPath(n.a.Config.NodeNetns))
		rs, err := h.RouteGet(bIP6.AsSlice())
		if err != nil || len(rs) != 1 || !rs[0].Gw.Equal(n.addr6B.AsSlice()) {
			t.Errorf("node A's route to x/b's IPv6 address: %+v (%v), want via %v", rs, err, n.addr6B)
		}
	}
	for _, tc := range []struct {
		from api.Endpoint
		port uint16
		want bool
	}{{a, 80, true}, {c, 80, false}} {
		if got := echoUDP(t, tc.from.Netns, netip.AddrPortFrom(bIP6, tc.port), 4000, tc.want); got != tc.want {
			t.Errorf("4000-byte UDP datagram (fragments) over IPv6 from x/%s to x/b port %d: echoed %v, want %v", tc.from.Name, tc.port, got, tc.want)
		}
	}
	var allowed, denied bool
	for _, f := range flowsOf(t, n.b) {
		if f.Endpoint != "x/b" || f.Direction != "ingress" || slices.Contains(f.Flags, "tunnel") != (mode == overlay.VXLAN) {
			continue
		}
		if f.Type == "new" && f.Source.IP == a.IP6 && f.Source.Identity == uint32(a.Identity) {
			allowed = true
		}
		if f.Type == "drop" && f.Source.IP == c.IP6 && f.Source.Identity == uint32(c.Identity) {
			denied = true
		}
		if f.Reason == "fragment-unknown" {
			t.Errorf("node B dropped an IPv6 fragment whose first fragment it did not see: %+v", f)
		}
	}
	if !allowed || !denied {
		t.Errorf("node B's IPv6 flows (%s): allowed flow from x/a with its identity %v, denied flow from x/c %v", mode, allowed, denied)
	}
	if mode == overlay.Native {
		checkUnknownSource6(t, n, bIP6)
		return
	}
	// The VXLAN device's own IPv6 link traffic (router solicitations, MLD) has no node to go
	// to: none is sent, so none is dropped as such.
	for _, f := range flowsOf(t, n.a) {
		if f.Reason == "tunnel-no-endpoint" {
			t.Errorf("node A dropped a packet into the overlay for want of a node: %+v", f)
		}
	}
	vc, err := testenv.Dial(c.Netns, "udp", netip.AddrPortFrom(n.vxlanAddrB(), overlay.Port), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	forged := vxlanFrame(uint32(a.Identity), 0x86dd, ipv6UDP(netip.MustParseAddr(a.IP6), bIP6, 40999, 80, []byte("forged")))
	checkForged(t, n, a, "VXLAN (inner IPv6)", func() error { _, err := vc.Write(forged); return err })
}

// checkUnknownSource6 connects from node A's namespace to x/b port 80 (which only x/a may
// reach) with a source address in node A's IPv6 pod CIDR that is no pod's: natively routed
// to node B, the packet has no identity there but world's, so it is dropped by policy.
func checkUnknownSource6(t *testing.T, n *twoNodes, bIP6 netip.Addr) {
	t.Helper()
	nodeA := endpoint.NetnsPath(n.a.Config.NodeNetns)
	// No pod's: pods' IPv6 addresses are their IPv4 offsets in node A's /20, all below 4096.
	stranger := netip.MustParseAddr("2001:2:0:a::ff:99")
	h := testenv.NetlinkHandle(t, nodeA)
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: stranger.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}
	if err := h.AddrAdd(lo, addr); err != nil {
		t.Fatalf("adding %v to node A's lo: %v", stranger, err)
	}
	t.Cleanup(func() { h.AddrDel(lo, addr) })
	dial := func() bool {
		var conn net.Conn
		err := testenv.InNetns(nodeA, func() (err error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: stranger.AsSlice()}, Timeout: 700 * time.Millisecond}
			conn, err = d.Dial("tcp6", netip.AddrPortFrom(bIP6, 80).String())
			return err
		})
		if err == nil {
			conn.Close()
		}
		return err == nil
	}
	sawDrop := func() bool {
		for _, f := range flowsOf(t, n.b) {
			if f.Endpoint == "x/b" && f.Type == "drop" && f.Source.IP == stranger.String() {
				if f.Source.Identity != uint32(identity.World) || f.Source.Name != "" {
					t.Errorf("node B judged %v as %+v, want world", stranger, f.Source)
				}
				return true
			}
		}
		return false
	}
	if !testenv.Eventually(5*time.Second, func() bool {
		if dial() {
			t.Errorf("%v (no pod) from the fabric -> x/b [%v]:80: connected, want denied", stranger, bIP6)
		}
		return sawDrop()
	}) {
		t.Errorf("node B did not drop %v (no pod) from the fabric to x/b port 80", stranger)
	}
}

// checkForged sends x/c's own encapsulated packet (send) claiming x/a's identity until node
// B reports it dropped as tunnel-untrusted-source, and checks that it never reached x/b.
func checkForged(t *testing.T, n *twoNodes, a api.Endpoint, kind string, send func() error) {
	t.Helper()
	sawForged := func() bool {
		for _, f := range flowsOf(t, n.b) {
			if f.Type == "drop" && f.Reason == "tunnel-untrusted-source" && f.Source.Identity == uint32(a.Identity) &&
				f.Source.Port == 40999 && f.Endpoint == "" {
				return true
			}
		}
		return false
	}
	if !testenv.Eventually(5*time.Second, func() bool {
		if err := send(); err != nil {
			t.Fatal(err)
		}
		return sawForged()
	}) {
		t.Errorf("node B did not drop the pod's own %s packet as tunnel-untrusted-source", kind)
	}
	for _, f := range flowsOf(t, n.b) {
		if f.Endpoint == "x/b" && f.Source.Port == 40999 {
			t.Errorf("the pod's own %s packet reached x/b's veth: %+v", kind, f)
		}
	}
}

// checkFragments sends UDP datagrams larger than the pod MTU, which leave the pod in
// fragments, from node A's pods to x/b on node B: those policy allows (x/a to port 80) are
// echoed whole, those it denies (x/a to port 81, x/c to port 80) are not, and node B's
// flows show the denied datagram's fragments dropped by policy with its ports, never as
// fragments whose first fragment it did not see.
func checkFragments(t *testing.T, n *twoNodes, a, c, b api.Endpoint) {
	t.Helper()
	bIP := netip.MustParseAddr(b.IP)
	for _, tc := range []struct {
		from api.Endpoint
		port uint16
		size int
		want bool
	}{
		{a, 80, 4000, true},
		{a, 80, 8000, true},
		{a, 81, 8000, false},
		{c, 80, 4000, false},
	} {
		if got := echoUDP(t, tc.from.Netns, netip.AddrPortFrom(bIP, tc.port), tc.size, tc.want); got != tc.want {
			t.Errorf("%d-byte UDP datagram (fragments) from x/%s to x/b port %d: echoed %v, want %v", tc.size, tc.from.Name, tc.port, got, tc.want)
		}
	}
	var deniedFrags int
	for _, f := range flowsOf(t, n.b) {
		if f.Endpoint != "x/b" || f.Source.IP != a.IP || f.Protocol != "UDP" {
			continue
		}
		if f.Reason == "fragment-unknown" {
			t.Errorf("node B dropped a fragment of x/a's whose first fragment it did not see: %+v", f)
		}
		// Full-size fragments (the probes to port 81 above sent small datagrams).
		if f.Type == "drop" && f.Reason == "policy-default-deny" && f.Dest.Port == 81 && f.Length >= 1000 {
			deniedFrags++
		}
	}
	// The 8000-byte datagram is six fragments at a 1450 or 1480 MTU, five at 1500.
	if deniedFrags < 5 {
		t.Errorf("node B's drops of x/a's 8000-byte datagram to port 81: %d, want one per fragment (at least 5)", deniedFrags)
	}
}

// echoUDP sends a size-byte datagram from the namespace at nsPath to to and reports whether
// it came back whole (a few tries when it is expected to, one short one when not).
func echoUDP(t *testing.T, nsPath string, to netip.AddrPort, size int, want bool) bool {
	t.Helper()
	conn, err := testenv.Dial(nsPath, "udp", to, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msg := make([]byte, size)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	buf := make([]byte, 2*size)
	tries, wait := 1, 700*time.Millisecond
	if want {
		tries, wait = 5, time.Second
	}
	for range tries {
		if _, err := conn.Write(msg); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(wait))
		if k, err := conn.Read(buf); err == nil && k == size && bytes.Equal(buf[:k], msg) {
			return true
		}
	}
	return false
}

// sawIPIP reports whether, while traffic runs, the interface ifname in the namespace at
// nsPath receives an IP-in-IP packet from node address from to node address to whose
// inner destination is inner.
func sawIPIP(t *testing.T, nsPath, ifname string, from, to, inner netip.Addr, traffic func()) bool {
	t.Helper()
	var fd int
	err := testenv.InNetns(nsPath, func() error {
		l, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		// ETH_P_ALL: such a socket sees a received packet before tc ingress, where the
		// dataplane takes the outer header off (a socket for ETH_P_IP sees it after).
		proto := int(htons(unix.ETH_P_ALL))
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, proto); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: l.Index})
	})
	if err != nil {
		t.Fatalf("packet socket on %s: %v", ifname, err)
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Usec: 200000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); traffic() }()
	defer func() { <-done }()
	f4, t4, i4 := from.As4(), to.As4(), inner.As4()
	buf := make([]byte, 2048)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		k, sa, err := unix.Recvfrom(fd, buf, 0)
		ll, ok := sa.(*unix.SockaddrLinklayer)
		if err != nil || k < 40 || !ok || ll.Protocol != htons(unix.ETH_P_IP) {
			continue
		}
		if buf[0] == 0x45 && buf[9] == 4 && bytes.Equal(buf[12:16], f4[:]) && bytes.Equal(buf[16:20], t4[:]) && bytes.Equal(buf[36:40], i4[:]) {
			return true
		}
	}
	return false
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// vxlanPacket builds a VXLAN payload (RFC 7348: flags with the VNI bit, VNI) carrying an
// Ethernet frame with an IPv4/UDP datagram from src:sport to dst:dport.
func vxlanPacket(vni uint32, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	return vxlanFrame(vni, 0x0800, ipv4UDP(src, dst, sport, dport, payload))
}

// vxlanFrame builds a VXLAN payload carrying an Ethernet frame of type ethType with packet.
func vxlanFrame(vni uint32, ethType uint16, packet []byte) []byte {
	b := make([]byte, 8, 8+14+len(packet))
	b[0] = 0x08
	binary.BigEndian.PutUint32(b[4:], vni<<8)
	eth := make([]byte, 14)
	copy(eth[0:6], []byte{0x02, 0, 0, 0, 0, 1})
	copy(eth[6:12], []byte{0x02, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(eth[12:], ethType)
	b = append(b, eth...)
	return append(b, packet...)
}

// ipv6UDP builds an IPv6/UDP datagram from src:sport to dst:dport (UDP checksum zero: it
// is dropped before anything would check it).
func ipv6UDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	ip := make([]byte, 40, 40+8+len(payload))
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(8+len(payload)))
	ip[6] = 17
	ip[7] = 64
	s, d := src.As16(), dst.As16()
	copy(ip[8:24], s[:])
	copy(ip[24:40], d[:])
	return append(ip, udpDatagram(sport, dport, payload)...)
}

// udpDatagram is a UDP header (checksum zero) and payload.
func udpDatagram(sport, dport uint16, payload []byte) []byte {
	udp := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	return append(udp, payload...)
}

// ipv4UDP builds an IPv4/UDP datagram from src:sport to dst:dport.
func ipv4UDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	ip := make([]byte, 20, 20+8+len(payload))
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	ip[8] = 64
	ip[9] = 17
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	return append(ip, udpDatagram(sport, dport, payload)...)
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// An agent restarted in another mode leaves nothing of the previous one: switching from
// IP-in-IP to native routing takes the programs off the fabric, to VXLAN makes the device,
// and back to IP-in-IP removes the device and encapsulates again. Policy holds throughout.
func TestOverlayModeSwitch(t *testing.T) {
	n := startTwoNodes(t, overlay.IPIP, false, overlay.UnderlayIPv4)
	_, _, b := n.pods(t)
	bIP := netip.MustParseAddr(b.IP)
	type node struct {
		env  *agenttest.Env
		peer netip.Addr
	}
	nodes := []node{{n.a, n.addrB}, {n.b, n.addrA}}
	fabricFilters := func(nd node) []string {
		path := endpoint.NetnsPath(nd.env.Config.NodeNetns)
		fabric, _, err := overlay.Fabric(path, []overlay.Node{{Address: nd.peer}})
		if err != nil || len(fabric) != 1 {
			t.Fatalf("fabric interface: %v %v", fabric, err)
		}
		return testenv.BPFFilterNames(t, testenv.NetlinkHandle(t, path), fabric[0])
	}
	for _, mode := range []overlay.Mode{overlay.IPIP, overlay.Native, overlay.VXLAN, overlay.IPIP} {
		if mode != n.a.Config.Tunnel {
			for _, nd := range nodes {
				nd.env.Stop()
				nd.env.Config.Tunnel = mode
				nd.env.Start()
			}
		}
		for _, nd := range nodes {
			want := []string(nil)
			if mode == overlay.IPIP {
				want = []string{"rampart_from_ipip", "rampart_to_ipip"}
			}
			if got := fabricFilters(nd); !slices.Equal(got, want) {
				t.Errorf("%s: filters on %s's fabric interface %v, want %v", mode, nd.env.Config.Instance, got, want)
			}
			h := testenv.NetlinkHandle(t, endpoint.NetnsPath(nd.env.Config.NodeNetns))
			if _, err := h.LinkByName(overlay.DeviceName); (err == nil) != (mode == overlay.VXLAN) {
				t.Errorf("%s: %s exists %v on %s", mode, overlay.DeviceName, err == nil, nd.env.Config.Instance)
			}
		}
		if !n.a.Probe("x/a", bIP, 80, "tcp", 3*time.Second) {
			t.Errorf("%s: x/a -> node B x/b 80/tcp: not connected", mode)
		}
		if n.a.Probe("x/c", bIP, 80, "tcp", 700*time.Millisecond) {
			t.Errorf("%s: x/c -> node B x/b 80/tcp: connected, want denied", mode)
		}
	}
}
