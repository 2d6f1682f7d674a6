package tap

import "net/netip"

// Overlaps reports whether one packet can match both a and b. A match is a product of
// independent per-field sets (directions, protocol, peer address, endpoint port, peer port,
// ICMP type, ICMP code; an empty list or an unset field is the whole field), so two
// matches share a packet exactly when every field's sets intersect. Ports and ICMP fields
// are only ever set together with a specific protocol (Validate), so a match of protocol
// "any" constrains neither.
func Overlaps(a, b Match) bool {
	if a.Direction&b.Direction == 0 {
		return false
	}
	if a.Protocol != ProtoAny && b.Protocol != ProtoAny && a.Protocol != b.Protocol {
		return false
	}
	if !prefixesIntersect(a.PeerCIDRs, b.PeerCIDRs) {
		return false
	}
	if !rangesIntersect(a.Ports, b.Ports) || !rangesIntersect(a.PeerPorts, b.PeerPorts) {
		return false
	}
	if !optionalEqual(a.ICMPType, b.ICMPType) || !optionalEqual(a.ICMPCode, b.ICMPCode) {
		return false
	}
	return true
}

// prefixesIntersect: two unions of prefixes share an address when some pair does (two
// prefixes share one when one contains the other). No prefix is every address.
func prefixesIntersect(a, b []netip.Prefix) bool {
	if len(a) == 0 || len(b) == 0 {
		return true
	}
	for _, p := range a {
		for _, q := range b {
			if p.Overlaps(q) {
				return true
			}
		}
	}
	return false
}

// rangesIntersect: two unions of port ranges share a port when some pair does. No range is
// every port.
func rangesIntersect(a, b []PortRange) bool {
	if len(a) == 0 || len(b) == 0 {
		return true
	}
	for _, r := range a {
		for _, s := range b {
			if r.First <= s.Last && s.First <= r.Last {
				return true
			}
		}
	}
	return false
}

// optionalEqual: nil is any value.
func optionalEqual(a, b *uint8) bool {
	return a == nil || b == nil || *a == *b
}
