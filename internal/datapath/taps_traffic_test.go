package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/testenv"
)

// tapWorld is a node namespace with two application endpoints a and b and a monitor
// endpoint s (with its receive and return veths), made as the agent makes them
// (endpoint.Node), the programs attached, a allowed to reach b's TCP ports tapPort to
// tapPort+3 (echo servers on the first two).
type tapWorld struct {
	t       *testing.T
	d       *Datapath
	n       endpoint.Node
	node    string // node namespace path
	a, b, s endpoint.Endpoint
	ml      endpoint.MonitorLinks
	ev      *EventReader
}

const (
	tapPort          = 8080
	tapIDA, tapIDB   = identity.Identity(3101), identity.Identity(3102)
	tapIDS           = identity.Identity(3103)
	tapEpA, tapEpB   = 11, 12
	tapEpS           = 13
	tapContract      = 21
	tapOtherContract = 22
)

func newTapWorld(t *testing.T, cfg Config) *tapWorld {
	return newTapWorldOf(t, cfg, netip.Prefix{})
}

// newTapWorldOf is newTapWorld on a dual-stack node when cidr6 is set: the endpoints get
// their IPv6 addresses too (endpoint.Node), in the ipcache and the endpoint map, and b and
// s serve on them as well.
func newTapWorldOf(t *testing.T, cfg Config, cidr6 netip.Prefix) *tapWorld {
	t.Helper()
	testenv.RequireRoot(t)
	sfx := testenv.Suffix(6)
	w := &tapWorld{t: t, n: endpoint.Node{
		Instance: "tap" + sfx,
		Netns:    "rp-taptest-node-" + sfx,
		PodCIDR:  netip.MustParsePrefix("198.18.60.0/24"),
		PodCIDR6: cidr6,
	}}
	dual := cidr6.IsValid()
	t.Cleanup(func() {
		if err := w.n.Teardown(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	if err := w.n.Setup(); err != nil {
		t.Fatalf("node setup: %v", err)
	}
	w.node = w.n.NetnsPath()
	if !dual {
		disableIPv6(t, w.node)
	}
	w.d = openTest(t, cfg)
	attach := func(host string) error {
		_, err := w.d.Endpoints.Attach(w.node, host)
		return err
	}
	mk := func(name string, ip string) endpoint.Endpoint {
		ep, err := w.n.CreateAttached("tap", name, addr(ip), attach)
		if err != nil {
			t.Fatalf("creating endpoint %s: %v", name, err)
		}
		t.Cleanup(func() {
			if err := w.n.Delete("tap", name); err != nil {
				t.Errorf("deleting endpoint %s: %v", name, err)
			}
		})
		return ep
	}
	w.a = mk("a", "198.18.60.10")
	w.b = mk("b", "198.18.60.20")
	w.s = mk("s", "198.18.60.30")
	ml, err := w.n.CreateMonitorLinks(w.s, func(rx, tx string) error {
		_, _, err := w.d.Taps.AttachMonitor(w.node, rx, tx, tapEpS)
		return err
	})
	if err != nil {
		t.Fatalf("creating monitor links: %v", err)
	}
	w.ml = ml
	ipc := map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("0.0.0.0/0"): {Identity: identity.World},
		netip.PrefixFrom(w.n.Router(), 32): {Identity: identity.Host},
		netip.PrefixFrom(w.a.IP, 32):       {Identity: tapIDA, EndpointID: tapEpA},
		netip.PrefixFrom(w.b.IP, 32):       {Identity: tapIDB, EndpointID: tapEpB},
		netip.PrefixFrom(w.s.IP, 32):       {Identity: tapIDS, EndpointID: tapEpS},
	}
	if dual {
		ipc[netip.MustParsePrefix("::/0")] = mapstate.IPCacheEntry{Identity: identity.World}
		ipc[netip.PrefixFrom(w.n.Router6(), 128)] = mapstate.IPCacheEntry{Identity: identity.Host}
		ipc[netip.PrefixFrom(w.a.IP6, 128)] = mapstate.IPCacheEntry{Identity: tapIDA, EndpointID: tapEpA}
		ipc[netip.PrefixFrom(w.b.IP6, 128)] = mapstate.IPCacheEntry{Identity: tapIDB, EndpointID: tapEpB}
		ipc[netip.PrefixFrom(w.s.IP6, 128)] = mapstate.IPCacheEntry{Identity: tapIDS, EndpointID: tapEpS}
	} else {
		for _, ns := range []string{w.a.NetnsPath, w.b.NetnsPath, w.s.NetnsPath} {
			disableIPv6(t, ns)
		}
	}
	if err = w.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	polA := mapstate.EndpointPolicy{EnforceEgress: true, Entries: entries(
		e(allow(tapIDB, out, tcp, tapPort, 14, 1)), // tapPort .. tapPort+3
		e(allow(tapIDS, out, tcp, tapPort, 16, 2)),
	)}
	polB := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(e(allow(tapIDA, in, tcp, tapPort, 14, 3)))}
	// The monitor's own policy would admit a: the monitor flag refuses it anyway.
	polS := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(e(allow(tapIDA, in, tcp, tapPort, 16, 4)))}
	for _, x := range []struct {
		ep  endpoint.Endpoint
		id  uint32
		ide identity.Identity
		pol mapstate.EndpointPolicy
		mon bool
	}{{w.a, tapEpA, tapIDA, polA, false}, {w.b, tapEpB, tapIDB, polB, false}, {w.s, tapEpS, tapIDS, polS, true}} {
		info := EndpointInfo{EpID: x.id, Identity: x.ide, Addr: x.ep.IP, Addr6: x.ep.IP6, LinkLocal6: x.ep.LinkLocal6, Monitor: x.mon}
		if err := w.d.Endpoints.ApplyEndpoint(uint32(x.ep.HostIfIndex), info, x.pol); err != nil {
			t.Fatal(err)
		}
	}
	echoServer(t, w.b.NetnsPath, netip.AddrPortFrom(w.b.IP, tapPort))
	echoServer(t, w.b.NetnsPath, netip.AddrPortFrom(w.b.IP, tapPort+1))
	echoServer(t, w.s.NetnsPath, netip.AddrPortFrom(w.s.IP, tapPort))
	if dual {
		echoServer(t, w.b.NetnsPath, netip.AddrPortFrom(w.b.IP6, tapPort))
		echoServer(t, w.b.NetnsPath, netip.AddrPortFrom(w.b.IP6, tapPort+1))
		echoServer(t, w.s.NetnsPath, netip.AddrPortFrom(w.s.IP6, tapPort))
	}
	w.ev = eventsOf(t, w.d)
	return w
}

// rule is a tap of a's TCP traffic to b's tapPort (egress) and, for redirect, its
// replies (ingress), to the monitor.
func (w *tapWorld) rules(action TapAction, up, failOpen bool) []TapRule {
	base := TapRule{
		Ifindex: uint32(w.a.HostIfIndex), Protocol: tcp, Action: action,
		MonitorRx: uint32(w.ml.HostRxIndex), MonitorTx: uint32(w.ml.HostTxIndex),
		MonitorUp: up, FailOpen: failOpen, ContractID: tapContract,
	}
	eg := base
	eg.Direction = out
	eg.Destination = netip.PrefixFrom(w.b.IP, 32)
	eg.DestinationPorts = PortRange{tapPort, tapPort}
	if action == TapMirror {
		return []TapRule{eg}
	}
	ing := base
	ing.Direction = in
	ing.Source = netip.PrefixFrom(w.b.IP, 32)
	ing.SourcePorts = PortRange{tapPort, tapPort}
	return []TapRule{eg, ing}
}

func (w *tapWorld) replace(rules []TapRule) {
	w.t.Helper()
	if err := w.d.Taps.ReplaceTaps(rules); err != nil {
		w.t.Fatalf("ReplaceTaps: %v", err)
	}
}

func (w *tapWorld) counters() TapCounters {
	w.t.Helper()
	c, err := w.d.Taps.TapCounters(tapContract)
	if err != nil {
		w.t.Fatal(err)
	}
	return c[tapContract]
}

// converse connects a to b's port and exchanges n messages (error: the connection failed).
func (w *tapWorld) converse(port uint16, n int, timeout time.Duration) error {
	return w.converseAt(w.b.IP, port, n, timeout)
}

// converseAt is converse to b's address dst (IPv4 or IPv6).
func (w *tapWorld) converseAt(dst netip.Addr, port uint16, n int, timeout time.Duration) error {
	c, err := dial(w.a.NetnsPath, netip.AddrPortFrom(dst, port), timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	for i := range n {
		if err := roundTrip(c, "message "+string(rune('a'+i%26))); err != nil {
			return err
		}
	}
	return nil
}

// frameTuple reads an Ethernet/IPv4/TCP-or-UDP frame's addresses and ports, or an
// Ethernet/IPv6 one's with no extension headers.
func frameTuple(f []byte) (src, dst netip.Addr, proto uint8, sport, dport uint16, ok bool) {
	if len(f) < 14+20 {
		return
	}
	if binary.BigEndian.Uint16(f[12:]) != unix.ETH_P_IP {
		if len(f) < 14+40+4 || binary.BigEndian.Uint16(f[12:]) != unix.ETH_P_IPV6 {
			return
		}
		ip := f[14:]
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		proto = ip[6]
		if proto == unix.IPPROTO_TCP || proto == unix.IPPROTO_UDP {
			sport, dport = binary.BigEndian.Uint16(ip[40:]), binary.BigEndian.Uint16(ip[42:])
		}
		return src, dst, proto, sport, dport, true
	}
	ip := f[14:]
	ihl := int(ip[0]&0xf) * 4
	src = netip.AddrFrom4([4]byte(ip[12:16]))
	dst = netip.AddrFrom4([4]byte(ip[16:20]))
	proto = ip[9]
	if len(ip) >= ihl+4 && (proto == unix.IPPROTO_TCP || proto == unix.IPPROTO_UDP) {
		sport = binary.BigEndian.Uint16(ip[ihl:])
		dport = binary.BigEndian.Uint16(ip[ihl+2:])
	}
	return src, dst, proto, sport, dport, true
}

// TestTapMirrorTraffic: a mirror tap copies exactly a's packets of the matched flow to the
// monitor, which reads them on its receive interface, while the connection works; a flow
// the rule does not match is not copied.
func TestTapMirrorTraffic(t *testing.T) {
	w := newTapWorld(t, Config{})
	w.replace(w.rules(TapMirror, true, false))
	capt := testenv.NewSniffer(t, w.s.NetnsPath, endpoint.MonitorRxIfName)
	if err := w.converse(tapPort, 20, 5*time.Second); err != nil {
		t.Fatalf("mirrored connection: %v", err)
	}
	if err := w.converse(tapPort+1, 5, 5*time.Second); err != nil {
		t.Fatalf("untapped connection: %v", err)
	}
	var c TapCounters
	eventually(t, 5*time.Second, "copies counted", func() bool {
		c = w.counters()
		return c.MirroredPackets > 0
	})
	// The copies are counted as sent: wait until the monitor has read that many.
	var frames [][]byte
	eventually(t, 5*time.Second, "monitor read every copy", func() bool {
		frames = append(frames, capt.Frames(t)...)
		c = w.counters()
		return uint64(len(frames)) >= c.MirroredPackets
	})
	frames = append(frames, capt.Frames(t)...)
	if uint64(len(frames)) != c.MirroredPackets || c.CopiesLost != 0 {
		t.Errorf("monitor read %d frames; counters %+v", len(frames), c)
	}
	t.Logf("monitor read %d frames; counters %+v", len(frames), c)
	// 20 round trips: at least the SYN, 20 data segments and the FIN from a.
	if len(frames) < 22 {
		t.Errorf("monitor read %d frames, want at least 22", len(frames))
	}
	for i, f := range frames {
		src, dst, proto, _, dport, ok := frameTuple(f)
		if !ok || src != w.a.IP || dst != w.b.IP || proto != unix.IPPROTO_TCP || dport != tapPort {
			t.Errorf("frame %d: %v -> %v proto %d port %d: not the tapped flow", i, src, dst, proto, dport)
		}
	}
	nf := waitEvent(t, w.ev, "new flow at a", func(e flow.Event) bool {
		return e.Type == flow.EventNew && e.EpID == tapEpA && e.DestinationPort == tapPort
	})
	if !nf.Flags.Has(flow.FlagTapped) {
		t.Errorf("new flow event of the mirrored flow: %+v, want flag tapped", nf)
	}
}

// TestTapRedirectTraffic: a redirect tap sends a's connection to b through the monitor,
// which plays an inline IPS by forwarding from its receive to its return interface (tc
// mirred). The connection works through it, keeps its identity at b, and stops when the
// monitor drops, is marked down (fail closed) or loses its interfaces; with fail-open it
// passes untapped. A packet the monitor injects, or whose port it rewrites (a tc program
// in the monitor), is dropped, and no application endpoint can open a flow to the monitor.
func TestTapRedirectTraffic(t *testing.T) {
	w := newTapWorld(t, Config{})
	sh, rxp, txp, ips := w.inlineMonitor()

	w.replace(w.rules(TapRedirect, true, false))
	if err := w.converse(tapPort, 10, 5*time.Second); err != nil {
		t.Fatalf("connection through the monitor: %v", err)
	}
	var c TapCounters
	eventually(t, 5*time.Second, "diverted packets returned", func() bool {
		c = w.counters()
		return c.RedirectedPackets >= 20 && c.ReturnedPackets == c.RedirectedPackets
	})
	t.Logf("through the monitor: %+v", c)
	// At b the flow came from a, with a's identity, through the monitor's interface.
	nb := waitEvent(t, w.ev, "new flow at b", func(e flow.Event) bool {
		return e.Type == flow.EventNew && e.EpID == tapEpB && e.DestinationPort == tapPort
	})
	if nb.SrcIdentity != tapIDA || nb.Source != w.a.IP || !nb.Flags.Has(flow.FlagTapped) {
		t.Errorf("new flow at b: %+v, want source a with identity %d, flagged tapped", nb, tapIDA)
	}
	// The untapped port does not go through the monitor.
	before := w.counters()
	if err := w.converse(tapPort+1, 3, 5*time.Second); err != nil {
		t.Fatalf("untapped connection: %v", err)
	}
	if got := w.counters(); got.RedirectedPackets != before.RedirectedPackets {
		t.Errorf("untapped connection diverted: %+v", got)
	}

	// The monitor drops (an IPS verdict): the connection cannot be made.
	if err := sh.FilterDel(ips); err != nil {
		t.Fatal(err)
	}
	if err := w.converse(tapPort, 1, time.Second); err == nil {
		t.Fatal("connection made while the monitor drops everything")
	}
	if got := w.counters(); got.NotReturned() == 0 {
		t.Errorf("monitor drops not seen: %+v", got)
	}
	if err := sh.FilterAdd(ips); err != nil {
		t.Fatal(err)
	}

	// An established connection, then the monitor is marked down: fail closed.
	conn, err := dial(w.a.NetnsPath, netip.AddrPortFrom(w.b.IP, tapPort), 5*time.Second)
	if err != nil {
		t.Fatalf("connection before the monitor goes down: %v", err)
	}
	defer conn.Close()
	if err := roundTrip(conn, "up"); err != nil {
		t.Fatal(err)
	}
	w.replace(w.rules(TapRedirect, false, false))
	conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("down")); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Read(make([]byte, 4)); err == nil {
		t.Error("established connection went on with its monitor down")
	}
	drop := waitEvent(t, w.ev, "tap-monitor-unavailable drop", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.Reason == flow.ReasonTapMonitorUnavailable
	})
	if drop.EpID != tapEpA || !drop.Flags.Has(flow.FlagTapped) {
		t.Errorf("fail-closed drop event: %+v", drop)
	}
	if err := w.converse(tapPort, 1, time.Second); err == nil {
		t.Error("new connection made with the monitor down")
	}
	if got := w.counters(); got.UnavailableDrops == 0 {
		t.Errorf("fail-closed drops not counted: %+v", got)
	}
	// Fail open: the same connection passes untapped.
	w.replace(w.rules(TapRedirect, false, true))
	before = w.counters()
	if err := w.converse(tapPort, 3, 5*time.Second); err != nil {
		t.Fatalf("fail-open connection: %v", err)
	}
	if got := w.counters(); got.RedirectedPackets != before.RedirectedPackets || got.UnavailablePassed == before.UnavailablePassed {
		t.Errorf("fail-open: %+v (before %+v)", got, before)
	}

	// A monitor that injects a packet of a flow never diverted (here: to b's other port)
	// or rewrites a diverted one's port: dropped at its return interface.
	w.replace(w.rules(TapRedirect, true, false))
	if err := w.converse(tapPort, 1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	rejected := func() uint64 {
		r, err := w.d.Taps.TapCounters(0)
		if err != nil {
			t.Fatal(err)
		}
		return r[0].Rejected
	}
	r0 := rejected()
	syn := packet{src: w.a.IP, dst: w.b.IP, proto: uint8(tcp), sport: 40999, dport: tapPort + 1, tcpFlags: 0x02}
	sendRaw(t, w.s.NetnsPath, endpoint.MonitorTxIfName, unix.ETH_P_IP, syn.ipv4())
	inj := waitEvent(t, w.ev, "injected packet dropped", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.Reason == flow.ReasonTapNotDiverted
	})
	if inj.Source != w.a.IP || inj.DestinationPort != tapPort+1 || inj.EpID != tapEpS {
		t.Errorf("injected packet's drop event: %+v", inj)
	}
	if got := rejected(); got != r0+1 {
		t.Errorf("rejected: %d, want %d", got, r0+1)
	}

	// A monitor that rewrites the destination port of what it passes back: the packet
	// finds no record and is dropped, so the connection cannot be made.
	if err := sh.FilterDel(ips); err != nil {
		t.Fatal(err)
	}
	rewrite := rewritingMonitor(t, tapPort+3, txp.Attrs().Index)
	if err := sh.FilterReplace(bpfFilter(rxp.Attrs().Index, netlink.HANDLE_MIN_INGRESS, "monitor_rewrite", rewrite)); err != nil {
		t.Fatal(err)
	}
	if err := w.converse(tapPort, 1, time.Second); err == nil {
		t.Error("connection made through a monitor that rewrites the port")
	}
	rw := waitEvent(t, w.ev, "rewritten packet dropped", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.Reason == flow.ReasonTapNotDiverted
	})
	if rw.Source != w.a.IP || rw.Destination != w.b.IP || rw.DestinationPort != tapPort+3 {
		t.Errorf("rewritten packet's drop event: %+v", rw)
	}

	// The monitor's own address is no destination for a.
	if c, err := dial(w.a.NetnsPath, netip.AddrPortFrom(w.s.IP, tapPort), time.Second); err == nil {
		c.Close()
		t.Error("a reached the monitor endpoint")
	}
	waitEvent(t, w.ev, "monitor-destination drop", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.Reason == flow.ReasonTapMonitorDestination && e.EpID == tapEpS
	})

	// The monitor's interfaces go away (the monitor is gone) while the rule still says up:
	// the diverted packets have nowhere to go, and the flow stops (fail closed).
	if err := w.n.DeleteMonitorLinks("tap", "s"); err != nil {
		t.Fatal(err)
	}
	if err := w.converse(tapPort, 1, time.Second); err == nil {
		t.Error("connection made with the monitor's interfaces gone")
	}
	waitEvent(t, w.ev, "tap-monitor-unavailable drop, interfaces gone", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.Reason == flow.ReasonTapMonitorUnavailable
	})
	if err := w.d.Taps.DetachMonitor(uint32(w.ml.HostRxIndex), uint32(w.ml.HostTxIndex)); err != nil {
		t.Fatal(err)
	}
}

// inlineMonitor makes the monitor an inline IPS that passes everything: its receive
// interface's ingress forwards to its return interface (tc mirred; a u32 filter matching
// everything, as cls_matchall is not built into these kernels). It returns the monitor's
// netlink handle, its two interfaces and the filter (delete it: the monitor drops).
func (w *tapWorld) inlineMonitor() (*netlink.Handle, netlink.Link, netlink.Link, *netlink.U32) {
	t := w.t
	t.Helper()
	sh := nlHandle(t, w.s.NetnsPath)
	rxp, err := sh.LinkByName(endpoint.MonitorRxIfName)
	if err != nil {
		t.Fatal(err)
	}
	txp, err := sh.LinkByName(endpoint.MonitorTxIfName)
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.QdiscAdd(clsact(rxp.Attrs().Index)); err != nil {
		t.Fatal(err)
	}
	ips := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: rxp.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS, Priority: 1, Protocol: unix.ETH_P_ALL},
		Sel:         &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Nkeys: 1, Keys: []netlink.TcU32Key{{}}},
		Actions:     []netlink.Action{netlink.NewMirredAction(txp.Attrs().Index)},
	}
	if err := sh.FilterAdd(ips); err != nil {
		t.Fatalf("monitor forwarding: %v", err)
	}
	return sh, rxp, txp, ips
}

// eventually polls cond until it holds, failing the test after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !testenv.Eventually(timeout, cond) {
		t.Fatalf("timed out waiting: %s", what)
	}
}

// rewritingMonitor is a tc program for a monitor's receive interface that sets the TCP
// destination port of each packet (IPv4 without options) to port and sends it out of
// interface tx: a monitor that tampers with what it passes back.
func rewritingMonitor(t *testing.T, port uint16, tx int) *ebpf.Program {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SchedCLS,
		License: "Dual BSD/GPL",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.StoreImm(asm.RFP, -8, int64(htons(port)), asm.Half),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Imm(asm.R2, 14+20+2), // past Ethernet, IPv4 and the TCP source port
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -8),
			asm.Mov.Imm(asm.R4, 2),
			asm.Mov.Imm(asm.R5, 0),
			asm.FnSkbStoreBytes.Call(),
			asm.Mov.Imm(asm.R1, int32(tx)),
			asm.Mov.Imm(asm.R2, 0),
			asm.FnRedirect.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatalf("loading the rewriting monitor: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}
