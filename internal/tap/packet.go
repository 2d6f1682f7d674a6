package tap

import "net/netip"

// Packet is one packet as a tapped endpoint sees it: whether it arrives (Ingress) or
// leaves (Egress), its protocol, and its two sides, the endpoint's and the peer's. It is
// what a rule's match is evaluated on, per side rather than per packet field (see Match).
type Packet struct {
	Direction Direction // Ingress or Egress
	Protocol  Protocol
	Peer      netip.Addr
	// Port is the endpoint's port, PeerPort the peer's (TCP, UDP); 0 for other protocols.
	Port, PeerPort uint16
	// ICMPType and ICMPCode, for ICMP.
	ICMPType, ICMPCode uint8
}

// NewPacket is the packet from src to dst (addresses and ports as on the wire) seen from
// the endpoint at local, which must be src or dst. ok is false when it is neither.
func NewPacket(proto Protocol, src, dst netip.AddrPort, local netip.Addr) (p Packet, ok bool) {
	p.Protocol = proto
	switch local {
	case src.Addr():
		p.Direction, p.Peer, p.Port, p.PeerPort = Egress, dst.Addr(), src.Port(), dst.Port()
	case dst.Addr():
		p.Direction, p.Peer, p.Port, p.PeerPort = Ingress, src.Addr(), dst.Port(), src.Port()
	default:
		return Packet{}, false
	}
	return p, true
}

// Matches reports whether m matches the packet: its direction is one of m's, its protocol
// m's (or m's is any), its peer in one of m's peer prefixes, its ports in m's ranges and
// its ICMP type and code m's, each field only where m sets it. This is the Go statement of
// what the dataplane's tap rules match (bpf/include/tap.h); a packet that is in two
// contracts' matches is a witness of their Overlaps.
func (m Match) Matches(p Packet) bool {
	if m.Direction&p.Direction == 0 || p.Direction == Both {
		return false
	}
	if m.Protocol != ProtoAny && m.Protocol != p.Protocol {
		return false
	}
	if len(m.PeerCIDRs) > 0 && !anyPrefixContains(m.PeerCIDRs, p.Peer) {
		return false
	}
	if !inRanges(m.Ports, p.Port) || !inRanges(m.PeerPorts, p.PeerPort) {
		return false
	}
	if m.ICMPType != nil && *m.ICMPType != p.ICMPType || m.ICMPCode != nil && *m.ICMPCode != p.ICMPCode {
		return false
	}
	return true
}

func anyPrefixContains(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

// inRanges: an empty list is every port.
func inRanges(rs []PortRange, port uint16) bool {
	if len(rs) == 0 {
		return true
	}
	for _, r := range rs {
		if r.First <= port && port <= r.Last {
			return true
		}
	}
	return false
}
