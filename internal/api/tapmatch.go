package api

import (
	"fmt"
	"net/netip"

	"github.com/rampartnet/rampart/internal/tap"
)

// TapMatch is a tap contract's match as data (Tap.Match renders it as text): what a
// client needs to decide itself whether a flow is in the contract, with tap.Match.Matches,
// for every contract, including the tap policy's, which have no manifest.
type TapMatch struct {
	Direction string   `json:"direction"`           // ingress, egress, both
	Protocol  string   `json:"protocol"`            // TCP, UDP, ICMP, any
	PeerCIDRs []string `json:"peerCIDRs,omitempty"` // prefixes
	Ports     []string `json:"ports,omitempty"`     // "80", "8000-8080"
	PeerPorts []string `json:"peerPorts,omitempty"`
	ICMPType  *uint8   `json:"icmpType,omitempty"`
	ICMPCode  *uint8   `json:"icmpCode,omitempty"`
}

// TapMatchOf is m as data.
func TapMatchOf(m tap.Match) TapMatch {
	out := TapMatch{Direction: m.Direction.String(), Protocol: m.Protocol.String(), ICMPType: m.ICMPType, ICMPCode: m.ICMPCode}
	for _, p := range m.PeerCIDRs {
		out.PeerCIDRs = append(out.PeerCIDRs, p.String())
	}
	for _, r := range m.Ports {
		out.Ports = append(out.Ports, r.String())
	}
	for _, r := range m.PeerPorts {
		out.PeerPorts = append(out.PeerPorts, r.String())
	}
	return out
}

// Match reads the match back.
func (m TapMatch) Match() (tap.Match, error) {
	d, err := tap.ParseDirection(m.Direction)
	if err != nil {
		return tap.Match{}, fmt.Errorf("tap match: %w", err)
	}
	p, err := tap.ParseProtocol(m.Protocol)
	if err != nil {
		return tap.Match{}, fmt.Errorf("tap match: %w", err)
	}
	out := tap.Match{Direction: d, Protocol: p, ICMPType: m.ICMPType, ICMPCode: m.ICMPCode}
	for _, s := range m.PeerCIDRs {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return tap.Match{}, fmt.Errorf("tap match: peer %q: %w", s, err)
		}
		out.PeerCIDRs = append(out.PeerCIDRs, pfx)
	}
	for _, l := range []struct {
		from []string
		to   *[]tap.PortRange
	}{{m.Ports, &out.Ports}, {m.PeerPorts, &out.PeerPorts}} {
		for _, s := range l.from {
			r, err := tap.ParsePortRange(s)
			if err != nil {
				return tap.Match{}, fmt.Errorf("tap match: %w", err)
			}
			*l.to = append(*l.to, r)
		}
	}
	return out, nil
}
