package datapath

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/policy"
)

// TestTapIPv6Match checks which IPv6 packets a set of tap rules copies, as TestTapMatch does
// for IPv4: rules by IPv6 prefix match IPv6 packets only, rules with no prefix both
// families; ICMP rules match ICMPv6 by its own type numbers; a fragmented datagram's later
// fragments go where its first went. A redirect whose monitor is down drops (fail closed),
// and a later fragment whose first fragment's tap decision is unknown drops where a
// redirect could have diverted it.
func TestTapIPv6Match(t *testing.T) {
	f := newTapFixture(t)
	if err := f.d.IPCache.ApplyIPCache(fixtureIPCache6()); err != nil {
		t.Fatal(err)
	}
	f.apply6(true, true,
		e(allow(0, out, policy.ProtoAny, 0, 0, 1)),
		e(allow(0, in, policy.ProtoAny, 0, 0, 2)),
		e(deny(idB, out, tcp, 0, 0, 3)))
	f.taps(
		TapRule{Direction: out, Protocol: tcp, Destination: netip.MustParsePrefix("2001:2::/120"), DestinationPorts: PortRange{8080, 8090}, Action: TapMirror, MonitorUp: true, ContractID: 1},
		TapRule{Direction: out, Protocol: tcp, Action: TapMirror, MonitorUp: true, ContractID: 9},
		TapRule{Direction: out, Protocol: policy.ProtoICMP, ICMPType: u8(128), Action: TapMirror, MonitorUp: true, ContractID: 2},
		TapRule{Direction: in, Protocol: udp, Source: netip.MustParsePrefix("2001:2::14/127"), SourcePorts: PortRange{53, 53}, Action: TapMirror, MonitorUp: true, ContractID: 3},
	)
	before := f.txPackets(f.rxName)
	cases := []struct {
		name     string
		frame    []byte
		toEp     bool
		verdict  uint32
		contract uint32
	}{
		{"tcp 8080 to A", packet6{src: epIP6, dst: ipA6, proto: uint8(tcp), sport: 40001, dport: 8080, tcpFlags: 0x02}.bytes(), false, actOK, 1},
		{"tcp 8091 to A", packet6{src: epIP6, dst: ipA6, proto: uint8(tcp), sport: 40002, dport: 8091, tcpFlags: 0x02}.bytes(), false, actOK, 9},
		{"tcp 8080 to the world", packet6{src: epIP6, dst: ipOut6, proto: uint8(tcp), sport: 40003, dport: 8080, tcpFlags: 0x02}.bytes(), false, actOK, 9},
		{"IPv4 tcp 8080 to A", packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 40004, dport: 8080, tcpFlags: 0x02}.bytes(), false, actOK, 9},
		{"tcp to B denied", packet6{src: epIP6, dst: ipB6, proto: uint8(tcp), sport: 40005, dport: 8080, tcpFlags: 0x02}.bytes(), false, actShot, 0},
		{"echo request", packet6{src: epIP6, dst: ipA6, proto: uint8(icmp6), icmpType: 128, icmpID: 77}.bytes(), false, actOK, 2},
		{"IPv4 echo request (type 8)", packet{src: epIP, dst: ipA, proto: uint8(icmp), icmpType: 8, icmpID: 78}.bytes(), false, actOK, 0},
		{"dns answer from A", packet6{src: ipA6, dst: epIP6, proto: uint8(udp), sport: 53, dport: 5353}.bytes(), true, actOK, 3},
		{"dns answer from B", packet6{src: ipB6, dst: epIP6, proto: uint8(udp), sport: 53, dport: 5353}.bytes(), true, actOK, 0},
		{"first fragment", packet6{src: epIP6, dst: ipA6, proto: uint8(tcp), sport: 40010, dport: 8080, tcpFlags: 0x02, frag: true, fragID: 9, mf: true, payload: make([]byte, 16)}.bytes(), false, actOK, 1},
		{"later fragment", packet6{src: epIP6, dst: ipA6, proto: uint8(tcp), frag: true, fragID: 9, fragOffset: 5, payload: make([]byte, 16)}.bytes(), false, actOK, 1},
	}
	want := map[uint32]uint64{}
	var copies uint64
	for _, c := range cases {
		prog := f.d.objs.RampartFromEp
		if c.toEp {
			prog = f.d.objs.RampartToEp
		}
		if got := f.runFrame(prog, c.frame, epIfindex, 0); got != c.verdict {
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

	// A redirect whose monitor is down: the IPv6 flow drops, with the tap's event.
	f.taps(TapRule{Direction: out, Protocol: tcp, Destination: netip.MustParsePrefix("2001:2::/120"), Action: TapRedirect, ContractID: 4})
	f.drain()
	syn := packet6{src: epIP6, dst: ipA6, proto: uint8(tcp), sport: 40020, dport: 8080, tcpFlags: 0x02}
	if got := f.runFrame(f.d.objs.RampartFromEp, syn.bytes(), epIfindex, 0); got != actShot {
		t.Errorf("redirect, monitor down: verdict %d, want drop", got)
	}
	if ev := nextDrop(t, f); ev.Reason != flow.ReasonTapMonitorUnavailable || ev.Source != epIP6 || !ev.Flags.Has(flow.FlagTapped) {
		t.Errorf("redirect, monitor down: event %+v", ev)
	}
	if got := f.counters(4); got.UnavailableDrops != 1 {
		t.Errorf("contract 4: %+v, want one unavailable drop", got)
	}
	// A later fragment of a datagram whose first fragment this endpoint's tap never saw
	// (the rules came in between): a redirect could have diverted it, so it drops.
	f.taps(TapRule{Direction: out, Protocol: tcp, Destination: netip.MustParsePrefix("2001:2::/120"), Action: TapRedirect, MonitorUp: true, ContractID: 4})
	first := packet6{src: epIP6, dst: ipA6, proto: uint8(tcp), sport: 40030, dport: 9000, tcpFlags: 0x02, frag: true, fragID: 31, mf: true, payload: make([]byte, 16)}
	f.taps()
	if got := f.runFrame(f.d.objs.RampartFromEp, first.bytes(), epIfindex, 0); got != actOK {
		t.Fatalf("first fragment, no taps: verdict %d", got)
	}
	f.taps(TapRule{Direction: out, Protocol: tcp, Destination: netip.MustParsePrefix("2001:2::/120"), Action: TapRedirect, MonitorUp: true, ContractID: 4})
	f.drain()
	later := packet6{src: epIP6, dst: ipA6, proto: uint8(tcp), frag: true, fragID: 31, fragOffset: 5, payload: make([]byte, 16)}
	if got := f.runFrame(f.d.objs.RampartFromEp, later.bytes(), epIfindex, 0); got != actShot {
		t.Errorf("later fragment, tap decision unknown: verdict %d, want drop", got)
	}
	if ev := nextDrop(t, f); ev.Reason != flow.ReasonFragmentUnknown {
		t.Errorf("later fragment, tap decision unknown: event %+v", ev)
	}
}

// nextDrop is the next drop event (after the new-flow events before it).
func nextDrop(t *testing.T, f *tapFixture) flow.Event {
	t.Helper()
	for range 4 {
		if ev := nextEvent(t, f.ev); ev.Type == flow.EventDrop {
			return ev
		}
	}
	t.Fatal("no drop event")
	return flow.Event{}
}

// TestTapRulesOfFamilies: a rule goes to the rule set of its prefixes' family, a rule with
// none to both, ICMP becomes ICMPv6 in the IPv6 set, and a rule whose source and
// destination are of two families is refused.
func TestTapRulesOfFamilies(t *testing.T) {
	base := TapRule{Direction: out, Action: TapMirror, ContractID: 1}
	cases := []struct {
		name     string
		src, dst string
		proto    policy.Protocol
		v4, v6   bool
		wantErr  bool
	}{
		{"no prefix", "", "", tcp, true, true, false},
		{"IPv4 peer", "", "198.18.0.0/16", tcp, true, false, false},
		{"IPv6 peer", "", "2001:2::/64", tcp, false, true, false},
		{"IPv4 and IPv6", "198.18.0.1/32", "2001:2::/64", tcp, false, false, true},
		{"ICMP", "", "", policy.ProtoICMP, true, true, false},
	}
	for _, c := range cases {
		r := base
		r.Protocol = c.proto
		if c.src != "" {
			r.Source = netip.MustParsePrefix(c.src)
		}
		if c.dst != "" {
			r.Destination = netip.MustParsePrefix(c.dst)
		}
		v4, v6, err := tapRulesOf(r)
		if (err != nil) != c.wantErr || (v4 != nil) != c.v4 || (v6 != nil) != c.v6 {
			t.Errorf("%s: v4 %v, v6 %v, err %v", c.name, v4 != nil, v6 != nil, err)
			continue
		}
		if v6 != nil && c.proto == policy.ProtoICMP && v6.R.Protocol != 58 {
			t.Errorf("%s: IPv6 rule protocol %d, want 58", c.name, v6.R.Protocol)
		}
		if c.name == "IPv6 peer" {
			want := [4]uint32{0xffffffff, 0xffffffff, 0, 0}
			if v6.DstMask != want {
				t.Errorf("%s: mask %x, want %x", c.name, v6.DstMask, want)
			}
		}
	}
}
