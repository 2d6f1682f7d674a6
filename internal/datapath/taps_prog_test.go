package datapath

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv"
)

// tc verdicts the tap paths return besides actOK and actShot.
const (
	actStolen   = 4
	actRedirect = 7
)

// tapFixture is the fixture world with a monitor: its receive and return veths (host
// sides rx and tx, peers rxp and txp) in a network namespace of the test, where the
// programs run (BPF_PROG_RUN resolves interface indexes in the caller's namespace and
// bpf_clone_redirect really transmits).
type tapFixture struct {
	*fixture
	ns     string
	rx, tx uint32
	rxName string
}

func newTapFixture(t *testing.T) *tapFixture {
	t.Helper()
	testenv.RequireRoot(t)
	suffix := testenv.Suffix(8)
	ns := testenv.NewNetns(t, "rtapp-"+suffix)
	disableIPv6(t, ns)
	f := &tapFixture{fixture: newFixture(t, Config{}), ns: ns, rxName: "mrx" + suffix}
	addVethPair(t, ns, f.rxName, "mrxp"+suffix)
	addVethPair(t, ns, "mtx"+suffix, "mtxp"+suffix)
	rx, tx, err := f.d.Taps.AttachMonitor(ns, f.rxName, "mtx"+suffix, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.rx, f.tx = rx, tx
	return f
}

// addVethPair makes a veth pair a-b inside ns, both ends up.
func addVethPair(t *testing.T, ns, a, b string) {
	t.Helper()
	h := nlHandle(t, ns)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a}, PeerName: b}); err != nil {
		t.Fatalf("adding veth %s: %v", a, err)
	}
	for _, n := range []string{a, b} {
		l, err := h.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
}

// runProg runs prog on p inside the fixture's namespace, as received on ifindex (1:
// the namespace's loopback, the fixture endpoint's interface).
func (f *tapFixture) runProg(prog *ebpf.Program, p packet, ifindex uint32) uint32 {
	f.t.Helper()
	return f.runProgFrom(prog, p, ifindex, 0)
}

// runProgFrom is runProg for a packet the node received on interface iif (0: sent by the
// node itself).
func (f *tapFixture) runProgFrom(prog *ebpf.Program, p packet, ifindex, iif uint32) uint32 {
	f.t.Helper()
	return f.runFrame(prog, p.bytes(), ifindex, iif)
}

// runFrame is runProgFrom for an Ethernet frame.
func (f *tapFixture) runFrame(prog *ebpf.Program, frame []byte, ifindex, iif uint32) uint32 {
	f.t.Helper()
	var ret uint32
	err := testenv.InNetns(f.ns, func() error {
		ctx := skbContext{Ifindex: ifindex}
		ctx.Fields[6] = iif // ingress_ifindex
		if ifindex <= 1 {
			ctx.Ifindex = 0
		}
		var err error
		ret, err = prog.Run(&ebpf.RunOptions{Data: frame, Context: ctx, ContextOut: make([]byte, 256)})
		return err
	})
	if err != nil {
		f.t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret
}

func (f *tapFixture) from(p packet) uint32 { return f.runProg(f.d.objs.RampartFromEp, p, epIfindex) }
func (f *tapFixture) to(p packet) uint32   { return f.runProg(f.d.objs.RampartToEp, p, epIfindex) }

// back runs the monitor's return program on p as the monitor sent it out of ifindex.
func (f *tapFixture) back(p packet, ifindex uint32) uint32 {
	return f.runProg(f.d.objs.RampartFromMonitor, p, ifindex)
}

func (f *tapFixture) taps(rules ...TapRule) {
	f.t.Helper()
	for i := range rules {
		rules[i].Ifindex = epIfindex
		if rules[i].MonitorRx == 0 {
			rules[i].MonitorRx = f.rx
		}
		if rules[i].MonitorTx == 0 && rules[i].Action == TapRedirect {
			rules[i].MonitorTx = f.tx
		}
	}
	if err := f.d.Taps.ReplaceTaps(rules); err != nil {
		f.t.Fatalf("ReplaceTaps: %v", err)
	}
}

func (f *tapFixture) counters(id uint32) TapCounters {
	f.t.Helper()
	c, err := f.d.Taps.TapCounters(id)
	if err != nil {
		f.t.Fatal(err)
	}
	return c[id]
}

// txPackets is how many packets ifname (in the fixture's namespace) has sent.
func (f *tapFixture) txPackets(ifname string) uint64 {
	f.t.Helper()
	l, err := nlHandle(f.t, f.ns).LinkByName(ifname)
	if err != nil {
		f.t.Fatal(err)
	}
	return l.Attrs().Statistics.TxPackets
}

func u8(v uint8) *uint8 { return &v }

// ip4 is an IPv4 address as the maps hold it (network order in memory).
func ip4(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// TestTapMatch checks which packets a set of mirror rules copies: direction, protocol,
// addresses, port ranges, ICMP type and code, first match wins, and never a packet the
// policy drops.
func TestTapMatch(t *testing.T) {
	f := newTapFixture(t)
	f.apply(true, true,
		e(allow(0, out, policy.ProtoAny, 0, 0, 1)),
		e(allow(0, in, policy.ProtoAny, 0, 0, 2)),
		e(deny(idB, out, tcp, 0, 0, 3)))
	f.taps(
		TapRule{Direction: out, Protocol: tcp, Destination: netip.MustParsePrefix("198.18.0.0/24"), DestinationPorts: PortRange{8080, 8090}, Action: TapMirror, MonitorUp: true, ContractID: 1},
		TapRule{Direction: out, Protocol: tcp, Action: TapMirror, MonitorUp: true, ContractID: 9}, // shadowed for 8080-8090
		TapRule{Direction: out, Protocol: icmp, ICMPType: u8(8), ICMPCode: u8(0), Action: TapMirror, MonitorUp: true, ContractID: 2},
		TapRule{Direction: in, Protocol: udp, Source: netip.MustParsePrefix("198.18.0.20/31"), SourcePorts: PortRange{53, 53}, Action: TapMirror, MonitorUp: true, ContractID: 3},
	)
	before := f.txPackets(f.rxName)
	cases := []struct {
		name     string
		p        packet
		toEp     bool
		verdict  uint32
		contract uint32 // 0: not tapped
	}{
		{"tcp 8080 to A", packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 40001, dport: 8080, tcpFlags: 0x02}, false, actOK, 1},
		{"tcp 8090 to A", packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 40002, dport: 8090, tcpFlags: 0x02}, false, actOK, 1},
		{"tcp 8091 to A", packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 40003, dport: 8091, tcpFlags: 0x02}, false, actOK, 9},
		{"tcp 8080 to world", packet{src: epIP, dst: ipOut, proto: uint8(tcp), sport: 40004, dport: 8080, tcpFlags: 0x02}, false, actOK, 9},
		{"tcp to B denied", packet{src: epIP, dst: ipB, proto: uint8(tcp), sport: 40005, dport: 8080, tcpFlags: 0x02}, false, actShot, 0},
		{"echo request", packet{src: epIP, dst: ipA, proto: uint8(icmp), icmpType: 8, icmpID: 77}, false, actOK, 2},
		{"timestamp request", packet{src: epIP, dst: ipA, proto: uint8(icmp), icmpType: 13, icmpID: 78}, false, actOK, 0},
		{"udp egress", packet{src: epIP, dst: ipA, proto: uint8(udp), sport: 53, dport: 53}, false, actOK, 0},
		{"dns answer from A", packet{src: ipA, dst: epIP, proto: uint8(udp), sport: 53, dport: 5353}, true, actOK, 3},
		{"udp from A, port 54", packet{src: ipA, dst: epIP, proto: uint8(udp), sport: 54, dport: 5353}, true, actOK, 0},
		{"dns answer from B", packet{src: ipB, dst: epIP, proto: uint8(udp), sport: 53, dport: 5353}, true, actOK, 0},
		// A fragmented datagram: its first fragment is tapped by its ports, the later
		// ones (no ports) go where it went (TestTapFragments).
		{"first fragment", packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 40010, dport: 8080, tcpFlags: 0x02, ipID: 9, mf: true, payload: make([]byte, 16)}, false, actOK, 1},
		{"later fragment", packet{src: epIP, dst: ipA, proto: uint8(tcp), ipID: 9, fragOffset: 5, payload: make([]byte, 16)}, false, actOK, 1},
	}
	want := map[uint32]uint64{}
	var copies uint64
	for _, c := range cases {
		var got uint32
		if c.toEp {
			got = f.to(c.p)
		} else {
			got = f.from(c.p)
		}
		if got != c.verdict {
			t.Errorf("%s: verdict %d, want %d", c.name, got, c.verdict)
		}
		if c.contract != 0 {
			want[c.contract]++
			copies++
		}
		f.drain()
	}
	for _, id := range []uint32{1, 2, 3, 9} {
		if got := f.counters(id); got.MirroredPackets != want[id] || got.CopiesLost != 0 {
			t.Errorf("contract %d: %+v, want %d mirrored", id, got, want[id])
		}
	}
	if got := f.txPackets(f.rxName) - before; got != copies {
		t.Errorf("monitor receive interface sent %d packets, want %d copies", got, copies)
	}

	// The event of a new tapped flow says so; an untapped one's does not.
	f.from(packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 41000, dport: 8085, tcpFlags: 0x02})
	want[1]++
	if ev := nextEvent(t, f.ev); ev.Type != flow.EventNew || !ev.Flags.Has(flow.FlagTapped) {
		t.Errorf("tapped new flow: event %+v, want new with flag tapped", ev)
	}
	f.from(packet{src: epIP, dst: ipA, proto: uint8(udp), sport: 41001, dport: 9})
	if ev := nextEvent(t, f.ev); ev.Type != flow.EventNew || ev.Flags.Has(flow.FlagTapped) {
		t.Errorf("untapped new flow: event %+v, want new without flag tapped", ev)
	}

	// Rules go away with ReplaceTaps: nothing is copied any more.
	f.taps()
	f.from(packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 40001, dport: 8080, tcpFlags: 0x10})
	if got := f.counters(1); got.MirroredPackets != want[1] {
		t.Errorf("after removing the taps: %+v", got)
	}
	if info := f.d.Endpoints.InstalledEndpoints()[epIfindex]; info.EpID != epID {
		t.Fatalf("endpoint gone: %+v", info)
	}
	if f.d.endpoints[epIfindex].Flags&epTapMask != 0 {
		t.Errorf("tap flags left on: %#x", f.d.endpoints[epIfindex].Flags)
	}
}

// TestTapRules checks ReplaceTaps's refusals: nothing is written for an invalid set.
func TestTapRules(t *testing.T) {
	f := newTapFixture(t)
	f.apply(false, false)
	ok := TapRule{Ifindex: epIfindex, Direction: out, Action: TapMirror, MonitorRx: f.rx, ContractID: 1}
	many := make([]TapRule, MaxTapRules+1)
	for i := range many {
		many[i] = ok
	}
	for name, r := range map[string][]TapRule{
		"too many":          many,
		"no endpoint":       {{Ifindex: 999, Direction: out, Action: TapMirror, MonitorRx: f.rx, ContractID: 1}},
		"no direction":      {{Ifindex: epIfindex, Action: TapMirror, MonitorRx: f.rx, ContractID: 1}},
		"contract 0":        {{Ifindex: epIfindex, Direction: out, Action: TapMirror, MonitorRx: f.rx}},
		"redirect, no tx":   {{Ifindex: epIfindex, Direction: out, Action: TapRedirect, MonitorRx: f.rx, MonitorUp: true, ContractID: 1}},
		"ports, any proto":  {{Ifindex: epIfindex, Direction: out, DestinationPorts: PortRange{80, 80}, Action: TapMirror, MonitorRx: f.rx, ContractID: 1}},
		"icmp type on tcp":  {{Ifindex: epIfindex, Direction: out, Protocol: tcp, ICMPType: u8(8), Action: TapMirror, MonitorRx: f.rx, ContractID: 1}},
		"empty port range":  {{Ifindex: epIfindex, Direction: out, Protocol: tcp, DestinationPorts: PortRange{90, 80}, Action: TapMirror, MonitorRx: f.rx, ContractID: 1}},
		"two families":      {{Ifindex: epIfindex, Direction: out, Source: netip.MustParsePrefix("198.18.0.0/16"), Destination: netip.MustParsePrefix("2001:db8::/32"), Action: TapMirror, MonitorRx: f.rx, ContractID: 1}},
		"no monitor rx":     {{Ifindex: epIfindex, Direction: out, Action: TapMirror, MonitorUp: true, ContractID: 1}},
		"contract too high": {{Ifindex: epIfindex, Direction: out, Action: TapMirror, MonitorRx: f.rx, ContractID: MaxTapContracts}},
	} {
		if err := f.d.Taps.ReplaceTaps(r); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if f.d.endpoints[epIfindex].Flags&epTapMask != 0 {
		t.Errorf("refused rules turned taps on")
	}
	// A monitor that is down needs no interfaces: the rule drops or passes, or loses copies.
	if err := f.d.Taps.ReplaceTaps([]TapRule{{Ifindex: epIfindex, Direction: out, Action: TapRedirect, ContractID: 1}}); err != nil {
		t.Errorf("redirect to a monitor that is down: %v", err)
	}
	if err := f.d.Taps.ReplaceTaps(many[:MaxTapRules]); err != nil {
		t.Errorf("%d rules: %v", MaxTapRules, err)
	}
	// ApplyEndpoint keeps the taps on.
	f.apply(true, false)
	if f.d.endpoints[epIfindex].Flags&epTapEgress == 0 {
		t.Errorf("ApplyEndpoint turned the taps off")
	}
	// RemoveEndpoint removes its rules: an endpoint reusing the ID does not find them.
	if err := f.d.Endpoints.RemoveEndpoint(epIfindex, epID); err != nil {
		t.Fatal(err)
	}
	var set rampartTapSet
	id := uint32(epID)
	if err := f.d.objs.TapSets.Lookup(&id, &set); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("tap rules of a removed endpoint: %v", err)
	}
	var set6 rampartTapSet6
	if err := f.d.objs.TapSets6.Lookup(&id, &set6); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("IPv6 tap rules of a removed endpoint: %v", err)
	}
}

// TestTapRedirectRecord checks the redirect path: a diverted packet is recorded and sent
// to the monitor; what the monitor sends back is accepted only with the same tuple on its
// return interface; an ingress tap's packet goes back to the endpoint's veth.
func TestTapRedirectRecord(t *testing.T) {
	f := newTapFixture(t)
	f.apply(true, true, e(allow(0, out, policy.ProtoAny, 0, 0, 1)), e(allow(0, in, policy.ProtoAny, 0, 0, 2)))
	f.taps(
		TapRule{Direction: out, Protocol: tcp, DestinationPorts: PortRange{80, 80}, Action: TapRedirect, MonitorUp: true, ContractID: 4},
		TapRule{Direction: in, Protocol: tcp, SourcePorts: PortRange{80, 80}, Action: TapRedirect, MonitorUp: true, ContractID: 5},
	)
	before := f.txPackets(f.rxName)
	syn := packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 42000, dport: 80, tcpFlags: 0x02}
	if got := f.from(syn); got != actStolen {
		t.Fatalf("diverted packet: verdict %d, want stolen (%d)", got, actStolen)
	}
	f.drain()
	if got := f.txPackets(f.rxName) - before; got != 1 {
		t.Errorf("monitor receive interface sent %d packets, want 1", got)
	}
	var v rampartTapFlowValue
	key := rampartTapFlowKey{Saddr: ip4(epIP), Daddr: ip4(ipA), Sport: htons(42000), Dport: htons(80), Ifindex: f.tx, Protocol: uint8(tcp)}
	if err := f.d.objs.TapFlows.Lookup(&key, &v); err != nil {
		t.Fatalf("no record of the diverted flow: %v", err)
	}
	if v.SrcIdentity != uint32(epIdent) || v.EpId != epID || v.DeliverIfindex != 0 || v.ContractId != 4 || v.Direction != uint8(out) {
		t.Errorf("record: %+v", v)
	}

	// Back on the return interface: on to the node's routing.
	if got := f.back(syn, f.tx); got != actOK {
		t.Errorf("returned packet: verdict %d, want pass", got)
	}
	// The same packet on the receive interface, a rewritten one, and one never diverted.
	rewritten := syn
	rewritten.dport = 81
	other := packet{src: ipA, dst: ipB, proto: uint8(tcp), sport: 1, dport: 80, tcpFlags: 0x02}
	for name, c := range map[string]struct {
		p   packet
		idx uint32
	}{
		"on the receive interface": {syn, f.rx},
		"port rewritten":           {rewritten, f.tx},
		"injected":                 {other, f.tx},
	} {
		f.expectDrop(name, f.back(c.p, c.idx), flow.ReasonTapNotDiverted)
	}
	c := f.counters(4)
	if c.RedirectedPackets != 1 || c.ReturnedPackets != 1 || c.NotReturned() != 0 {
		t.Errorf("contract 4: %+v", c)
	}
	if r := f.counters(0); r.Rejected != 3 {
		t.Errorf("rejected returns: %d, want 3", r.Rejected)
	}

	// An ingress tap: the reply is diverted at the endpoint's veth and goes back to it.
	reply := packet{src: ipA, dst: epIP, proto: uint8(tcp), sport: 80, dport: 42000, tcpFlags: 0x12}
	if got := f.to(reply); got != actStolen {
		t.Fatalf("diverted reply: verdict %d, want stolen", got)
	}
	rkey := rampartTapFlowKey{Saddr: ip4(ipA), Daddr: ip4(epIP), Sport: htons(80), Dport: htons(42000), Ifindex: f.tx, Protocol: uint8(tcp)}
	if err := f.d.objs.TapFlows.Lookup(&rkey, &v); err != nil {
		t.Fatalf("no record of the diverted reply: %v", err)
	}
	if v.SrcIdentity != uint32(idA) || v.DeliverIfindex != 1 || v.ContractId != 5 || v.Direction != uint8(in) {
		t.Errorf("reply record: %+v", v)
	}
	if got := f.back(reply, f.tx); got != actRedirect {
		t.Errorf("returned reply: verdict %d, want redirect to the endpoint's veth (%d)", got, actRedirect)
	}

	// DetachMonitor forgets the monitor's flows: what it still sends back is dropped.
	if err := f.d.Taps.DetachMonitor(f.rx, f.tx); err != nil {
		t.Fatal(err)
	}
	f.expectDrop("after detach", f.back(syn, f.tx), flow.ReasonTapNotDiverted)
}

// TestTapFailClosed checks a redirect whose monitor is down or gone: dropped with
// tap-monitor-unavailable (the event marked tapped), or passed with FailOpen; a mirror with
// its monitor gone counts the copy as lost and passes the packet.
func TestTapFailClosed(t *testing.T) {
	f := newTapFixture(t)
	f.apply(true, true, e(allow(0, out, policy.ProtoAny, 0, 0, 1)))
	syn := func(dport uint16) packet {
		return packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: f.port(), dport: dport, tcpFlags: 0x02}
	}
	const gone = 1 << 30 // no such interface
	f.taps(
		TapRule{Direction: out, Protocol: tcp, DestinationPorts: PortRange{1, 1}, Action: TapRedirect, MonitorUp: false, ContractID: 1},
		TapRule{Direction: out, Protocol: tcp, DestinationPorts: PortRange{2, 2}, Action: TapRedirect, MonitorUp: false, FailOpen: true, ContractID: 2},
		TapRule{Direction: out, Protocol: tcp, DestinationPorts: PortRange{3, 3}, Action: TapRedirect, MonitorUp: true, MonitorRx: gone, MonitorTx: gone + 1, ContractID: 3},
		TapRule{Direction: out, Protocol: tcp, DestinationPorts: PortRange{4, 4}, Action: TapRedirect, MonitorUp: true, MonitorRx: gone, MonitorTx: gone + 1, FailOpen: true, ContractID: 4},
		TapRule{Direction: out, Protocol: tcp, DestinationPorts: PortRange{5, 5}, Action: TapMirror, MonitorUp: true, MonitorRx: gone, ContractID: 5},
	)
	// Each new flow's event comes first (the policy passed it), then the tap's drop.
	dropped := func(name string, ret uint32) {
		t.Helper()
		if ret != actShot {
			t.Errorf("%s: verdict %d, want drop", name, ret)
		}
		if ev := nextEvent(t, f.ev); ev.Type != flow.EventNew || !ev.Flags.Has(flow.FlagTapped) {
			t.Errorf("%s: first event %+v, want the new tapped flow", name, ev)
		}
		ev := nextEvent(t, f.ev)
		if ev.Type != flow.EventDrop || ev.Reason != flow.ReasonTapMonitorUnavailable || !ev.Flags.Has(flow.FlagTapped) ||
			ev.SrcIdentity != epIdent || ev.DstIdentity != idA || ev.Destination != ipA {
			t.Errorf("%s: drop event %+v", name, ev)
		}
	}
	dropped("monitor down", f.from(syn(1)))
	f.expectPass("monitor down, fail open", f.from(syn(2)))
	dropped("monitor gone", f.from(syn(3)))
	f.expectPass("monitor gone, fail open", f.from(syn(4)))
	f.expectPass("mirror, monitor gone", f.from(syn(5)))
	for id, want := range map[uint32]TapCounters{
		1: {UnavailableDrops: 1},
		2: {UnavailablePassed: 1},
		3: {UnavailableDrops: 1},
		4: {UnavailablePassed: 1},
		5: {CopiesLost: 1},
	} {
		if got := f.counters(id); got != want {
			t.Errorf("contract %d: %+v, want %+v", id, got, want)
		}
	}
}

// TestTapMonitorNotDestination checks that no new flow may enter a monitor endpoint from
// another interface, while the node itself may still reach it.
func TestTapMonitorNotDestination(t *testing.T) {
	f := newTapFixture(t)
	err := f.d.Endpoints.ApplyEndpoint(epIfindex, EndpointInfo{EpID: epID, Identity: epIdent, Addr: epIP, Monitor: true},
		mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(e(allow(0, in, policy.ProtoAny, 0, 0, 1)))})
	if err != nil {
		t.Fatal(err)
	}
	if !f.d.Endpoints.InstalledEndpoints()[epIfindex].Monitor {
		t.Fatal("monitor flag not installed")
	}
	syn := packet{src: ipA, dst: epIP, proto: uint8(tcp), sport: 1, dport: 80, tcpFlags: 0x02}
	f.expectDrop("from another interface", f.runProgFrom(f.d.objs.RampartToEp, syn, epIfindex, f.rx), flow.ReasonTapMonitorDestination)
	f.expectPass("from the node", f.runProgFrom(f.d.objs.RampartToEp, syn, epIfindex, 0))
}

// TestTapReturnedSource checks how a local endpoint's ingress judges a new flow whose
// packet came back from a monitor: with the source identity of its record; without a
// record, a local endpoint's address arriving on a monitor's interface is spoofed.
func TestTapReturnedSource(t *testing.T) {
	f := newTapFixture(t)
	ipc := fixtureIPCache()
	ipc[netip.MustParsePrefix("198.18.1.5/32")] = mapstate.IPCacheEntry{Identity: idPod, Secondary: flagged, EndpointID: 8}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	// The fixture endpoint is the destination: it admits only idPod on port 80.
	f.apply(true, false, e(allow(idPod, in, tcp, 80, 16, 1)))
	// The sender, endpoint 8 at ipPod, on interface rx (any interface that is not the
	// return interface), with a redirect tap through the monitor.
	if err := f.d.Endpoints.ApplyEndpoint(f.rx, EndpointInfo{EpID: 8, Identity: idPod, Addr: ipPod}, mapstate.EndpointPolicy{}); err != nil {
		t.Fatal(err)
	}
	if err := f.d.Taps.ReplaceTaps([]TapRule{{Ifindex: f.rx, Direction: out, Protocol: tcp, Action: TapRedirect,
		MonitorRx: f.rx, MonitorTx: f.tx, MonitorUp: true, ContractID: 6}}); err != nil {
		t.Fatal(err)
	}
	syn := packet{src: ipPod, dst: epIP, proto: uint8(tcp), sport: 43000, dport: 80, tcpFlags: 0x02}
	if got := f.runProg(f.d.objs.RampartFromEp, syn, f.rx); got != actStolen {
		t.Fatalf("sender's veth: verdict %d, want stolen", got)
	}
	f.drain()
	if got := f.back(syn, f.tx); got != actOK {
		t.Fatalf("return: verdict %d, want pass", got)
	}
	// At the destination, received on the return interface: judged as idPod.
	if got := f.runProgFrom(f.d.objs.RampartToEp, syn, epIfindex, f.tx); got != actOK {
		t.Fatalf("destination: verdict %d, want pass", got)
	}
	ev := nextEvent(t, f.ev)
	if ev.Type != flow.EventNew || ev.SrcIdentity != idPod || ev.EpID != epID || !ev.Flags.Has(flow.FlagTapped) {
		t.Errorf("destination event %+v", ev)
	}
	// A packet of a flow never diverted, with the sender's address, on the return
	// interface (only a rewrite could make one: the return program drops it first).
	other := syn
	other.sport = 43001
	f.expectDrop("no record", f.runProgFrom(f.d.objs.RampartToEp, other, epIfindex, f.tx), flow.ReasonSpoofedSource)
}

// TestTapRestart: tap rules and the endpoints' tap bits are pinned, so a restarted agent's
// freshly loaded programs tap as before, and its ReplaceTaps (state read back from the
// maps) turns them off.
func TestTapRestart(t *testing.T) {
	f := newTapFixture(t)
	f.apply(false, false)
	f.taps(TapRule{Direction: out, Protocol: udp, Action: TapMirror, MonitorUp: true, ContractID: 7})
	d2, err := Open(Config{PinDir: f.d.Pins.PinDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d2.Close() })
	dgram := packet{src: epIP, dst: ipA, proto: uint8(udp), sport: 5000, dport: 53}
	if got := f.runProg(d2.objs.RampartFromEp, dgram, epIfindex); got != actOK {
		t.Fatalf("verdict %d", got)
	}
	f.drain()
	c, err := d2.Taps.TapCounters(7)
	if err != nil {
		t.Fatal(err)
	}
	if c[7].MirroredPackets != 1 {
		t.Errorf("after the restart: %+v, want 1 mirrored", c[7])
	}
	if err := d2.Taps.ReplaceTaps(nil); err != nil {
		t.Fatal(err)
	}
	if got := f.runProg(d2.objs.RampartFromEp, dgram, epIfindex); got != actOK {
		t.Fatalf("verdict %d", got)
	}
	f.drain()
	if c, _ := d2.Taps.TapCounters(7); c[7].MirroredPackets != 1 {
		t.Errorf("tapped after the restarted agent removed the taps: %+v", c[7])
	}
}

// TestTapFragments: the later fragments of a datagram go where the tap sent its first
// fragment (they carry no ports to match): copied to a mirror's monitor, diverted through
// a redirect's (and admitted back by their IP ID), and not tapped when the first fragment
// was not. A later fragment whose first fragment's tap decision is unknown is dropped where
// a redirect could have diverted its datagram.
func TestTapFragments(t *testing.T) {
	f := newTapFixture(t)
	f.apply(true, true, e(allow(0, out, policy.ProtoAny, 0, 0, 1)), e(allow(0, in, policy.ProtoAny, 0, 0, 2)))
	f.taps(
		TapRule{Direction: out, Protocol: udp, DestinationPorts: PortRange{5000, 5000}, Action: TapMirror, MonitorUp: true, ContractID: 8},
		TapRule{Direction: out, Protocol: udp, DestinationPorts: PortRange{6000, 6000}, Action: TapRedirect, MonitorUp: true, ContractID: 9},
	)
	first := func(id, dport uint16) packet {
		return packet{src: epIP, dst: ipA, proto: uint8(udp), sport: 4000, dport: dport, ipID: id, mf: true, payload: make([]byte, 16)}
	}
	later := func(id uint16, more bool) packet {
		return packet{src: epIP, dst: ipA, proto: uint8(udp), ipID: id, mf: more, fragOffset: 3, payload: make([]byte, 24)}
	}

	// Mirror: every fragment is copied and goes on.
	before := f.txPackets(f.rxName)
	for i, p := range []packet{first(200, 5000), later(200, true), later(200, false)} {
		if got := f.from(p); got != actOK {
			t.Errorf("mirrored fragment %d: verdict %d, want pass", i, got)
		}
	}
	f.drain()
	if got := f.counters(8).MirroredPackets; got != 3 {
		t.Errorf("mirrored fragments counted: %d, want 3", got)
	}
	if got := f.txPackets(f.rxName) - before; got != 3 {
		t.Errorf("monitor receive interface sent %d packets, want 3", got)
	}

	// A datagram no rule matched: its later fragments are not tapped either.
	before = f.txPackets(f.rxName)
	if got := f.from(first(201, 7000)); got != actOK {
		t.Errorf("untapped first fragment: verdict %d", got)
	}
	if got := f.from(later(201, false)); got != actOK {
		t.Errorf("untapped later fragment: verdict %d", got)
	}
	f.drain()
	if got := f.txPackets(f.rxName) - before; got != 0 {
		t.Errorf("untapped datagram: %d packets to the monitor", got)
	}

	// Redirect: every fragment is diverted, and comes back by its record.
	before = f.txPackets(f.rxName)
	for i, p := range []packet{first(202, 6000), later(202, false)} {
		if got := f.from(p); got != actStolen {
			t.Errorf("diverted fragment %d: verdict %d, want stolen", i, got)
		}
	}
	f.drain()
	if got := f.txPackets(f.rxName) - before; got != 2 {
		t.Errorf("monitor receive interface sent %d packets, want 2", got)
	}
	if got := f.counters(9).RedirectedPackets; got != 2 {
		t.Errorf("diverted fragments counted: %d, want 2", got)
	}
	if got := f.back(first(202, 6000), f.tx); got != actOK {
		t.Errorf("returned first fragment: verdict %d, want pass", got)
	}
	if got := f.back(later(202, false), f.tx); got != actOK {
		t.Errorf("returned later fragment: verdict %d, want pass", got)
	}
	// A later fragment of a datagram never diverted is refused on return.
	if got := f.back(later(203, false), f.tx); got != actShot {
		t.Errorf("later fragment never diverted, returned: verdict %d, want drop", got)
	}
	f.drain()

	// The tap decision forgotten (evicted): fail closed where a redirect could apply.
	k := rampartFragKey{Id: 202, EpId: epID, Protocol: uint8(udp), Family: 4, Direction: uint8(out)}
	copy(k.Saddr[:], epIP.AsSlice())
	copy(k.Daddr[:], ipA.AsSlice())
	if err := f.d.objs.TapFrags.Delete(&k); err != nil {
		t.Fatalf("deleting the fragment tap record: %v", err)
	}
	f.expectDrop("later fragment, tap decision forgotten", f.from(later(202, false)), flow.ReasonFragmentUnknown)
}
