package e2e

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// threeNodes is three agents whose node namespaces are joined pairwise by fabric veths
// (each pair in a /24 of its own), each with the other two declared as nodes by the
// address of the link between them. Over an IPv6 underlay each link has IPv6 addresses
// too (a /64 of its own), declared as the nodes' IPv6 fabric addresses, and then only them:
// the IPv4 ones are taken off once the nodes are declared.
type threeNodes struct {
	n    [3]*agenttest.Env
	addr [3][3]netip.Addr // addr[i][j]: node i's address on its link to node j
}

func nodeName(i int) string { return "node-" + strconv.Itoa(i+1) }

func startThreeNodes(t *testing.T, mode overlay.Mode, underlay overlay.Underlay) *threeNodes {
	t.Helper()
	c := &threeNodes{}
	cidr := func(i int) netip.Prefix {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(16 * (i + 1)), 0}), 20)
	}
	for i := range c.n {
		c.n[i] = agenttest.StartAgent(t, agenttest.Options{PodCIDR: cidr(i), Tunnel: mode, VXLANUnderlay: underlay, TCPPorts: []uint16{80}})
	}
	var addr6 [3][3]netip.Addr
	for i := range 3 {
		for j := i + 1; j < 3; j++ {
			link := byte(250 + i + j) // 251, 252, 253
			c.addr[i][j] = netip.AddrFrom4([4]byte{198, 19, link, byte(i + 1)})
			c.addr[j][i] = netip.AddrFrom4([4]byte{198, 19, link, byte(j + 1)})
			agenttest.LinkFabric(t, c.n[i], c.n[j], c.addr[i][j], c.addr[j][i])
			if underlay != overlay.UnderlayIPv6 {
				continue
			}
			for _, k := range [][2]int{{i, j}, {j, i}} {
				// 2001:2:0:ffb::1 for node 1 on the link 198.19.251.0/24, and so on: in
				// the tests' IPv6 range.
				addr6[k[0]][k[1]] = netip.AddrFrom16([16]byte{0x20, 0x01, 0, 0x02, 0, 0, 0x0f, link, 15: byte(k[0] + 1)})
				path := endpoint.NetnsPath(c.n[k[0]].Config.NodeNetns)
				addAddr6(t, path, linkHolding(t, path, c.addr[k[0]][k[1]]), addr6[k[0]][k[1]])
			}
		}
	}
	for i := range 3 {
		for j := range 3 {
			if i != j {
				args := []string{"node", "add", nodeName(j), "--address", c.addr[j][i].String(), "--pod-cidr", cidr(j).String()}
				if addr6[j][i].IsValid() {
					args = append(args, "--address6", addr6[j][i].String())
				}
				c.n[i].MustCLI(args...)
			}
		}
	}
	if underlay == overlay.UnderlayIPv6 {
		for i := range 3 {
			for j := range 3 {
				if i != j {
					delAddr4(t, endpoint.NetnsPath(c.n[i].Config.NodeNetns), c.addr[i][j])
				}
			}
		}
	}
	return c
}

// add creates endpoint key on node i (a monitor with --monitor) and declares it on the
// other nodes with the identity node i gave it.
func (c *threeNodes) add(t *testing.T, i int, ns, name string, extra ...string) api.Endpoint {
	t.Helper()
	ep := c.n[i].AddEndpoint(ns, name, map[string]string{"pod": name}, extra...)
	for j := range 3 {
		if j == i {
			continue
		}
		args := []string{"remote", "add", ns + "/" + name, "--node", nodeName(i), "--ip", ep.IP,
			"--labels", "pod=" + name, "--identity", strconv.FormatUint(uint64(ep.Identity), 10)}
		if len(extra) > 0 && extra[0] == "--monitor" {
			args = append(args, "--monitor")
		}
		c.n[j].MustCLI(args...)
	}
	return ep
}

// copiesOf counts the frames of TCP packets from a to b:80 among frames, and their
// payload bytes (from the IP header: a GSO frame's exceeds what was captured).
func copiesOf(frames [][]byte, a, b netip.Addr) (n, payload int) {
	for _, f := range frames {
		if len(f) < 38 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[23] != 6 {
			continue
		}
		ihl := int(f[14]&0x0f) * 4
		if len(f) < 14+ihl+20 {
			continue
		}
		src, dst := netip.AddrFrom4([4]byte(f[26:30])), netip.AddrFrom4([4]byte(f[30:34]))
		if src == a && dst == b && binary.BigEndian.Uint16(f[14+ihl+2:]) == 80 {
			n++
			payload += int(binary.BigEndian.Uint16(f[16:])) - ihl - int(f[14+ihl+12]>>4)*4
		}
	}
	return n, payload
}

// The four placements of the paper's Table II: A's egress to B is mirrored to monitor S,
// with S on A's node or another, and B on A's node or another. On every placement the
// connection works and S reads copies of exactly A's packets to B, sent across nodes
// through the tap tunnel when S is elsewhere; the copies stop with the contract. A
// redirect through a monitor on another node fails closed and says why.
func TestTapMonitorPlacements(t *testing.T) {
	for _, mode := range []overlay.Mode{overlay.VXLAN, overlay.Native} {
		t.Run(string(mode), func(t *testing.T) { testTapPlacements(t, mode) })
	}
}

func testTapPlacements(t *testing.T, mode overlay.Mode) {
	c := startThreeNodes(t, mode, overlay.UnderlayIPv4)
	a := c.add(t, 0, "app", "a")
	bNear := c.add(t, 0, "app", "b1")
	bFar := c.add(t, 1, "app", "b2")
	sNear := c.add(t, 0, "sec", "s1", "--monitor")
	sFar := c.add(t, 2, "sec", "s3", "--monitor")
	aIP := netip.MustParseAddr(a.IP)

	for _, pl := range []struct {
		name  string
		b     api.Endpoint
		s     api.Endpoint
		sNode int
	}{
		{"A, B and S on one node", bNear, sNear, 0},
		{"A and S on one node, B on another", bFar, sNear, 0},
		{"A and B on one node, S on another", bNear, sFar, 2},
		{"A, B and S on three nodes", bFar, sFar, 2},
	} {
		bIP := netip.MustParseAddr(pl.b.IP)
		sniff := testenv.NewSniffer(t, agenttest.NetnsPathOf(c.n[pl.sNode].Config.Instance, pl.s.Namespace, pl.s.Name), endpoint.MonitorRxIfName)
		c.n[0].MustCLI("tap", "add", "a-out", "--endpoint", "app/a", "--monitor", pl.s.Namespace+"/"+pl.s.Name,
			"--action", "mirror", "--direction", "egress", "--protocol", "TCP", "--peer-port", "80")
		conn, err := testenv.Dial(a.Netns, "tcp", netip.AddrPortFrom(bIP, 80), 3*time.Second)
		if err != nil {
			t.Fatalf("%s: a -> b: %v", pl.name, err)
		}
		for i := range 20 {
			msg := []byte(fmt.Sprintf("message %02d", i))
			buf := make([]byte, len(msg))
			conn.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := conn.Write(msg); err != nil {
				t.Fatalf("%s: write: %v", pl.name, err)
			}
			if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != string(msg) {
				t.Fatalf("%s: echo %q, %v", pl.name, buf, err)
			}
		}
		// Full-sized segments too: with native routing their copies are larger than the
		// fabric's MTU once encapsulated, and travel fragmented.
		bulk := make([]byte, 256<<10)
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		go conn.Write(bulk)
		if _, err := io.ReadFull(conn, bulk); err != nil {
			t.Fatalf("%s: bulk echo: %v", pl.name, err)
		}
		conn.Close()
		var tp api.Tap
		copies, payload := 0, 0
		sent := 20*len("message 00") + len(bulk)
		ok := testenv.Eventually(5*time.Second, func() bool {
			n, p := copiesOf(sniff.Frames(t), aIP, bIP)
			copies, payload = copies+n, payload+p
			tp = tapOf(t, c.n[0], "a-out")
			return payload >= sent
		})
		// Every byte a sent reached the monitor, and the dataplane lost no copy. Bytes
		// are compared, not frames with a's packets: a GSO copy arrives whole, one frame
		// carrying many segments' payload (also across nodes), and on a loaded machine
		// the monitor's own receive queue may drop a copy after the dataplane handed it
		// over (the monitor's loss, as a full AF_PACKET ring's).
		if !ok || tp.Counters.CopiesLost != 0 || tp.Counters.MirroredBytes < uint64(sent) {
			t.Errorf("%s: monitor %s read %d copies of a -> b with %d payload bytes of %d sent; a's counters %+v",
				pl.name, pl.s.Name, copies, payload, sent, tp.Counters)
		}
		if want := ""; pl.sNode != 0 {
			want = nodeName(pl.sNode)
			if tp.MonitorNode != want {
				t.Errorf("%s: contract's monitor node %q, want %q", pl.name, tp.MonitorNode, want)
			}
		}
		t.Logf("%s (%s): %d copies, %d payload bytes, counters %+v", pl.name, mode, copies, payload, tp.Counters)
		c.n[0].MustCLI("tap", "delete", "a-out")
		sniff.Frames(t) // the closing connection's last copies, sent before the delete
		// No contract: no more copies.
		if !c.n[0].Probe("app/a", bIP, 80, "tcp", 3*time.Second) {
			t.Fatalf("%s: a -> b without the tap", pl.name)
		}
		if n, _ := copiesOf(sniff.Frames(t), aIP, bIP); n != 0 {
			t.Errorf("%s: %d copies after the contract was deleted", pl.name, n)
		}
	}

	// S's node counted the copies it handed to s3, and lost none.
	st, err := c.n[2].Client.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if m := st.Monitors; m == nil || m.Monitors != 1 || m.CopiesFromOtherNodes == 0 || m.CopiesFromOtherNodesLost != 0 {
		t.Errorf("node 3's monitors status: %+v, want one monitor with copies from other nodes, none lost", m)
	} else {
		t.Logf("node 3: %+v", *m)
	}

	// A pod cannot feed a monitor: b2 sends its own tap tunnel packet to s3's node with
	// s3's key, an inner packet as from a to b1. Node 3 drops it (its outer source is no
	// node) and s3 reads nothing of it.
	sniff := testenv.NewSniffer(t, agenttest.NetnsPathOf(c.n[2].Config.Instance, "sec", "s3"), endpoint.MonitorRxIfName)
	vc, err := testenv.Dial(bFar.Netns, "udp", netip.AddrPortFrom(c.addr[2][1], overlay.TapPort), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	key := datapath.MonitorKeyOf(netip.MustParseAddr(sFar.IP))
	forged := vxlanPacket(key, aIP, netip.MustParseAddr(bNear.IP), 40999, 80, []byte("forged"))
	if !testenv.Eventually(5*time.Second, func() bool {
		if _, err := vc.Write(forged); err != nil {
			t.Fatal(err)
		}
		for _, f := range flowsOf(t, c.n[2]) {
			if f.Type == "drop" && f.Reason == "tunnel-untrusted-source" {
				return true
			}
		}
		return false
	}) {
		t.Errorf("node 3 did not drop a pod's own tap tunnel packet as tunnel-untrusted-source")
	}
	for _, f := range sniff.Frames(t) {
		if len(f) >= 42 && binary.BigEndian.Uint16(f[36:]) == 40999 {
			t.Errorf("monitor s3 read a pod's forged copy")
		}
	}

	// A redirect through the monitor on another node: unavailable, so a's matched
	// traffic stops (fail closed), and the contract says why.
	c.n[0].MustCLI("tap", "add", "a-inline", "--endpoint", "app/a", "--monitor", "sec/s3",
		"--action", "redirect", "--direction", "egress", "--protocol", "TCP", "--peer-port", "80")
	if c.n[0].Probe("app/a", netip.MustParseAddr(bFar.IP), 80, "tcp", time.Second) {
		t.Errorf("a redirect through another node's monitor let a's connection pass")
	}
	if tp := tapOf(t, c.n[0], "a-inline"); tp.MonitorProblem == "" {
		t.Errorf("a redirect through another node's monitor: no problem reported: %+v", tp)
	}
}

// tapOf reads contract name from agent e.
func tapOf(t *testing.T, e *agenttest.Env, name string) api.Tap {
	t.Helper()
	tp, err := e.Client.GetTap(t.Context(), name)
	if err != nil {
		t.Fatalf("tap %s: %v", name, err)
	}
	return tp
}

// A datagram larger than the pod's MTU leaves a fragmented; a mirror of a's UDP to b on
// one port, to a monitor on a third node, copies every fragment (the first matches the
// port, the later ones follow it) through the tap tunnel, in every tunnel mode, and over
// an IPv6 fabric with the IPv6 underlay (no IPv4 left on it): the monitor reads each
// fragment's bytes.
func TestTapFragmentsAcrossNodes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode     overlay.Mode
		underlay overlay.Underlay
	}{
		{"vxlan", overlay.VXLAN, overlay.UnderlayIPv4},
		{"native", overlay.Native, overlay.UnderlayIPv4},
		// Copies and the overlay over an IPv6 fabric only.
		{"vxlan-ipv6-fabric", overlay.VXLAN, overlay.UnderlayIPv6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startThreeNodes(t, tc.mode, tc.underlay)
			a := c.add(t, 0, "app", "a")
			b := c.add(t, 1, "app", "b")
			s := c.add(t, 2, "sec", "s", "--monitor")
			aIP, bIP := netip.MustParseAddr(a.IP), netip.MustParseAddr(b.IP)
			sniff := testenv.NewSniffer(t, s.Netns, endpoint.MonitorRxIfName)
			c.n[0].MustCLI("tap", "add", "a-udp", "--endpoint", "app/a", "--monitor", "sec/s",
				"--action", "mirror", "--direction", "egress", "--protocol", "UDP", "--peer-port", "5353")
			conn, err := testenv.Dial(a.Netns, "udp", netip.AddrPortFrom(bIP, 5353), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// The datagram is sent again until the monitor reads one whole: the monitor's
			// node refuses copies until its check (every second) has seen the sniffer read
			// (a monitor that does not read is down), and that may come after the first.
			const size = 6000 // five fragments at the pods' MTU
			byID := map[uint16]fragmentCount{}
			var whole fragmentCount
			ok := testenv.Eventually(10*time.Second, func() bool {
				// b has no server there: its port unreachable fails the next write, not
				// the one after.
				if _, err := conn.Write(make([]byte, size)); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
					t.Fatal(err)
				}
				for id, c := range fragmentsOf(sniff.Frames(t), aIP, bIP) {
					c.n += byID[id].n
					c.payload += byID[id].payload
					byID[id] = c
					if c.payload >= size+8 { // the UDP header travels in the first fragment
						whole = c
					}
				}
				return whole.payload > 0
			})
			if !ok || whole.n < 5 {
				t.Errorf("monitor on node 3 read no whole %d-byte datagram of a's to b in fragments: %v", size, byID)
			}
			frags := 0
			for _, c := range byID {
				frags += c.n
			}
			if tp := tapOf(t, c.n[0], "a-udp"); tp.Counters.MirroredPackets < uint64(frags) || tp.Counters.CopiesLost != 0 {
				t.Errorf("a's counters %+v after %d fragments read", tp.Counters, frags)
			}
		})
	}
}

// fragmentCount is how many fragments of one datagram were read, and the bytes they
// carry after their IP headers.
type fragmentCount struct{ n, payload int }

// fragmentsOf counts the IPv4 fragments from a to b among frames (Ethernet), by datagram
// (IP identification).
func fragmentsOf(frames [][]byte, a, b netip.Addr) map[uint16]fragmentCount {
	out := map[uint16]fragmentCount{}
	for _, f := range frames {
		if len(f) < 34 || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
			continue
		}
		ihl := int(f[14]&0x0f) * 4
		flags := binary.BigEndian.Uint16(f[20:])
		src, dst := netip.AddrFrom4([4]byte(f[26:30])), netip.AddrFrom4([4]byte(f[30:34]))
		if src == a && dst == b && flags&0x3fff != 0 { // more fragments, or an offset
			id := binary.BigEndian.Uint16(f[18:])
			c := out[id]
			c.n++
			c.payload += int(binary.BigEndian.Uint16(f[16:])) - ihl
			out[id] = c
		}
	}
	return out
}
