package tap

import (
	"net/netip"
	"testing"
)

func TestMatchesPacket(t *testing.T) {
	web := netip.MustParseAddr("198.18.0.10")
	client := netip.MustParseAddr("198.18.0.20")
	req := func(local netip.Addr) Packet { // client:40000 -> web:80
		p, ok := NewPacket(ProtoTCP, netip.AddrPortFrom(client, 40000), netip.AddrPortFrom(web, 80), local)
		if !ok {
			t.Fatalf("NewPacket: %s is neither side", local)
		}
		return p
	}
	serverSide := Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{80, 80}}}
	for _, tc := range []struct {
		name string
		m    Match
		p    Packet
		want bool
	}{
		{"request at the server", serverSide, req(web), true},
		{"answer at the server", serverSide, Packet{Direction: Egress, Protocol: ProtoTCP, Peer: client, Port: 80, PeerPort: 40000}, true},
		{"request at the client: its own port is not 80", serverSide, req(client), false},
		{"client egress to peer port 80", Match{Direction: Egress, Protocol: ProtoTCP, PeerPorts: []PortRange{{80, 80}}}, req(client), true},
		{"ingress only, packet leaves", Match{Direction: Ingress}, req(client), false},
		{"protocol differs", Match{Direction: Both, Protocol: ProtoUDP}, req(web), false},
		{"peer inside prefix", Match{Direction: Both, PeerCIDRs: pfx("198.18.0.0/27")}, req(web), true},
		{"peer outside prefix", Match{Direction: Both, PeerCIDRs: pfx("198.18.1.0/24")}, req(web), false},
		{"port range", Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{79, 81}}}, req(web), true},
		{"ICMP type", Match{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(8)}, Packet{Direction: Ingress, Protocol: ProtoICMP, Peer: client, ICMPType: 8}, true},
		{"ICMP other type", Match{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(8)}, Packet{Direction: Ingress, Protocol: ProtoICMP, Peer: client}, false},
		{"ICMP code", Match{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(3), ICMPCode: u8(1)}, Packet{Direction: Ingress, Protocol: ProtoICMP, Peer: client, ICMPType: 3, ICMPCode: 4}, false},
		{"a packet has one direction", Match{Direction: Both}, Packet{Direction: Both, Protocol: ProtoTCP}, false},
	} {
		if got := tc.m.Matches(tc.p); got != tc.want {
			t.Errorf("%s: %v matches %+v = %v, want %v", tc.name, tc.m, tc.p, got, tc.want)
		}
	}
	if _, ok := NewPacket(ProtoTCP, netip.AddrPortFrom(client, 1), netip.AddrPortFrom(web, 2), netip.MustParseAddr("198.18.0.30")); ok {
		t.Error("NewPacket accepted an endpoint that is neither side")
	}
}

// Matches and Overlaps are two statements of one match semantics: two matches overlap
// exactly when some packet matches both. Checked over a packet space that holds a
// witness for every pair of the matches below.
func TestMatchesAgreesWithOverlaps(t *testing.T) {
	matches := []Match{
		{Direction: Both},
		{Direction: Ingress},
		{Direction: Egress, Protocol: ProtoUDP},
		{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{80, 80}}},
		{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{81, 443}}},
		{Direction: Both, Protocol: ProtoTCP, PeerPorts: []PortRange{{1000, 2000}}},
		{Direction: Ingress, Protocol: ProtoTCP, PeerPorts: []PortRange{{2001, 3000}}, Ports: []PortRange{{80, 90}}},
		{Direction: Both, PeerCIDRs: pfx("198.18.0.0/24")},
		{Direction: Both, PeerCIDRs: pfx("198.18.1.0/24", "198.19.0.0/16")},
		{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(8)},
		{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(3), ICMPCode: u8(1)},
	}
	var packets []Packet
	for _, d := range []Direction{Ingress, Egress} {
		for _, peer := range []string{"198.18.0.1", "198.18.1.1", "198.19.5.5", "10.0.0.1"} {
			for _, proto := range []Protocol{ProtoTCP, ProtoUDP} {
				for _, port := range []uint16{80, 90, 443, 5000} {
					for _, pp := range []uint16{1500, 2500, 9999} {
						packets = append(packets, Packet{Direction: d, Protocol: proto, Peer: netip.MustParseAddr(peer), Port: port, PeerPort: pp})
					}
				}
			}
			for _, typ := range []uint8{0, 3, 8} {
				packets = append(packets, Packet{Direction: d, Protocol: ProtoICMP, Peer: netip.MustParseAddr(peer), ICMPType: typ, ICMPCode: 1})
			}
		}
	}
	for _, a := range matches {
		for _, b := range matches {
			witness := false
			for _, p := range packets {
				if a.Matches(p) && b.Matches(p) {
					witness = true
					break
				}
			}
			if witness != Overlaps(a, b) {
				t.Errorf("%v and %v: a packet matches both: %v, Overlaps: %v", a, b, witness, Overlaps(a, b))
			}
		}
	}
}
