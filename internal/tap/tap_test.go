package tap

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/labels"
)

func u8(v uint8) *uint8 { return &v }

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestOverlaps(t *testing.T) {
	web := Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{80, 80}}}
	for _, tc := range []struct {
		name string
		a, b Match
		want bool
	}{
		{"same match", web, web, true},
		{"opposite directions", Match{Direction: Ingress}, Match{Direction: Egress}, false},
		{"both meets ingress", Match{Direction: Both}, Match{Direction: Ingress}, true},
		{"TCP and UDP", Match{Direction: Both, Protocol: ProtoTCP}, Match{Direction: Both, Protocol: ProtoUDP}, false},
		{"any protocol meets TCP with ports", Match{Direction: Both}, web, true},
		{"disjoint port ranges", web, Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{81, 443}}}, false},
		{"touching port ranges", Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{1, 80}}}, Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{80, 90}}}, true},
		{"one of several ranges meets", Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{22, 22}, {8000, 8080}}}, Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{8080, 9000}}}, true},
		{"endpoint ports meet, peer ports do not", Match{Direction: Both, Protocol: ProtoTCP, PeerPorts: []PortRange{{1000, 2000}}}, Match{Direction: Both, Protocol: ProtoTCP, PeerPorts: []PortRange{{2001, 3000}}}, false},
		{"peer ports of one, endpoint ports of the other", Match{Direction: Both, Protocol: ProtoTCP, PeerPorts: []PortRange{{1000, 2000}}}, Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{80, 80}}}, true},
		{"disjoint peers", Match{Direction: Both, PeerCIDRs: pfx("198.18.0.0/24")}, Match{Direction: Both, PeerCIDRs: pfx("198.18.1.0/24")}, false},
		{"nested peers", Match{Direction: Both, PeerCIDRs: pfx("198.18.0.0/15")}, Match{Direction: Both, PeerCIDRs: pfx("198.19.3.4/32")}, true},
		{"peers against any peer", Match{Direction: Both, PeerCIDRs: pfx("198.18.0.0/24")}, Match{Direction: Both}, true},
		{"ICMP types differ", Match{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(8)}, Match{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(0)}, false},
		{"ICMP type against any type", Match{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(8)}, Match{Direction: Both, Protocol: ProtoICMP}, true},
		{"ICMP codes differ", Match{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(3), ICMPCode: u8(1)}, Match{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(3), ICMPCode: u8(4)}, false},
		{"ICMP code against any code", Match{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(3), ICMPCode: u8(1)}, Match{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(3)}, true},
		{"ICMP against TCP", Match{Direction: Both, Protocol: ProtoICMP}, web, false},
		{"ICMP type against any protocol", Match{Direction: Both, Protocol: ProtoICMP, ICMPType: u8(8)}, Match{Direction: Ingress}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Overlaps(tc.a, tc.b); got != tc.want {
				t.Errorf("Overlaps(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
			if got := Overlaps(tc.b, tc.a); got != tc.want {
				t.Errorf("Overlaps(%v, %v) = %v, want %v (not symmetric)", tc.b, tc.a, got, tc.want)
			}
		})
	}
}

// matches is the reference: whether one concrete packet matches m.
type packet struct {
	dir              Direction
	proto            Protocol
	peer             netip.Addr
	port, peerPort   uint16
	icmpType, icmpCd uint8
}

func (p packet) matches(m Match) bool {
	if m.Direction&p.dir == 0 || m.Protocol != ProtoAny && m.Protocol != p.proto {
		return false
	}
	if len(m.PeerCIDRs) > 0 && !slices.ContainsFunc(m.PeerCIDRs, func(q netip.Prefix) bool { return q.Contains(p.peer) }) {
		return false
	}
	in := func(rs []PortRange, v uint16) bool {
		return len(rs) == 0 || slices.ContainsFunc(rs, func(r PortRange) bool { return r.First <= v && v <= r.Last })
	}
	if !in(m.Ports, p.port) || !in(m.PeerPorts, p.peerPort) {
		return false
	}
	return (m.ICMPType == nil || *m.ICMPType == p.icmpType) && (m.ICMPCode == nil || *m.ICMPCode == p.icmpCd)
}

// Overlaps agrees with a search over every packet of a small universe, for every pair of
// matches built from the same small sets: it is exact, neither more nor less.
func TestOverlapsIsExact(t *testing.T) {
	dirs := []Direction{Ingress, Egress, Both}
	peers := [][]netip.Prefix{nil, pfx("198.18.0.0/31"), pfx("198.18.0.1/32"), pfx("198.18.0.2/31")}
	ranges := [][]PortRange{nil, {{1, 2}}, {{2, 3}}, {{3, 3}, {1, 1}}}
	var ms []Match
	for _, d := range dirs {
		for _, p := range peers {
			ms = append(ms, Match{Direction: d, PeerCIDRs: p})
			ms = append(ms, Match{Direction: d, Protocol: ProtoICMP, PeerCIDRs: p})
			ms = append(ms, Match{Direction: d, Protocol: ProtoICMP, PeerCIDRs: p, ICMPType: u8(1)})
			ms = append(ms, Match{Direction: d, Protocol: ProtoICMP, ICMPType: u8(2), ICMPCode: u8(1)})
			for _, r := range ranges {
				for _, pr := range ranges[:2] {
					ms = append(ms, Match{Direction: d, Protocol: ProtoTCP, PeerCIDRs: p, Ports: r, PeerPorts: pr})
				}
				ms = append(ms, Match{Direction: d, Protocol: ProtoUDP, Ports: r})
			}
		}
	}
	var pkts []packet
	for _, d := range []Direction{Ingress, Egress} {
		for a := range 4 {
			peer := netip.AddrFrom4([4]byte{198, 18, 0, byte(a)})
			for port := uint16(1); port <= 3; port++ {
				for pp := uint16(1); pp <= 3; pp++ {
					pkts = append(pkts, packet{dir: d, proto: ProtoTCP, peer: peer, port: port, peerPort: pp})
					pkts = append(pkts, packet{dir: d, proto: ProtoUDP, peer: peer, port: port, peerPort: pp})
				}
			}
			for ty := uint8(0); ty <= 2; ty++ {
				for cd := uint8(0); cd <= 1; cd++ {
					pkts = append(pkts, packet{dir: d, proto: ProtoICMP, peer: peer, icmpType: ty, icmpCd: cd})
				}
			}
		}
	}
	for _, a := range ms {
		if err := a.validate(); err != nil {
			t.Fatalf("%v: %v", a, err)
		}
		for _, b := range ms {
			want := slices.ContainsFunc(pkts, func(p packet) bool { return p.matches(a) && p.matches(b) })
			if got := Overlaps(a, b); got != want {
				t.Fatalf("Overlaps(%v, %v) = %v, a packet matching both exists: %v", a, b, got, want)
			}
		}
	}
}

func valid() *Contract {
	return &Contract{
		Kind: KindTapContract, Name: "web-http",
		Source:  Source{Endpoint: "shop/web"},
		Monitor: "security/ids",
		Match:   Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{80, 80}}},
		Action:  Mirror,
	}
}

func TestValidate(t *testing.T) {
	if err := valid().Validate(); err != nil {
		t.Fatalf("valid contract: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(c *Contract)
		field  string
		reason string
	}{
		{"bad name", func(c *Contract) { c.Name = "Web_HTTP" }, "metadata.name", "invalid name"},
		{"no monitor", func(c *Contract) { c.Monitor = "" }, "spec.monitor", "required"},
		{"bad monitor", func(c *Contract) { c.Monitor = "a/b/c" }, "spec.monitor", "want NAMESPACE/NAME"},
		{"monitor taps itself", func(c *Contract) { c.Monitor = "shop/web" }, "spec.monitor", "cannot tap itself"},
		{"endpoint and selector", func(c *Contract) {
			r, _ := labels.NewRequirement("app", "In", []string{"web"})
			c.Source.Selector = c.Source.Selector.With(r)
		}, "spec.source", "not both"},
		{"no direction", func(c *Contract) { c.Match.Direction = 0 }, "spec.match.direction", "want ingress"},
		{"ports without protocol", func(c *Contract) { c.Match.Protocol = ProtoAny }, "spec.match.ports", "need protocol TCP or UDP"},
		{"peer ports with ICMP", func(c *Contract) {
			c.Match.Protocol, c.Match.Ports, c.Match.PeerPorts = ProtoICMP, nil, []PortRange{{1, 2}}
		}, "spec.match.peerPorts", "need protocol TCP or UDP"},
		{"reversed range", func(c *Contract) { c.Match.Ports = []PortRange{{90, 80}} }, "spec.match.ports[0]", "ends before it starts"},
		{"port zero", func(c *Contract) { c.Match.PeerPorts = []PortRange{{0, 10}} }, "spec.match.peerPorts[0]", "port 0"},
		{"IPv4-mapped peer", func(c *Contract) { c.Match.PeerCIDRs = pfx("::ffff:198.18.0.0/112") }, "spec.match.peerCIDRs[0]", "IPv4-mapped"},
		{"host bits", func(c *Contract) { c.Match.PeerCIDRs = pfx("198.18.0.0/24", "198.18.1.1/24") }, "spec.match.peerCIDRs[1]", "host bits"},
		{"ICMP type with TCP", func(c *Contract) { c.Match.ICMPType = u8(8) }, "spec.match.icmpType", "needs protocol ICMP"},
		{"code without type", func(c *Contract) {
			c.Match = Match{Direction: Both, Protocol: ProtoICMP, ICMPCode: u8(0)}
		}, "spec.match.icmpCode", "needs an ICMP type"},
		{"no action", func(c *Contract) { c.Action = 0 }, "spec.action", "required"},
		{"fail-open mirror", func(c *Contract) { c.FailMode = FailOpen }, "spec.failMode", "redirect only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.change(c)
			err := c.Validate()
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Validate() = %v, want a *FieldError", err)
			}
			if fe.Field != tc.field || !strings.Contains(fe.Reason, tc.reason) || fe.Contract != c.Name {
				t.Errorf("Validate() = %q (field %q), want field %q and a reason with %q", err, fe.Field, tc.field, tc.reason)
			}
		})
	}
}

func TestParseHelpers(t *testing.T) {
	if r, err := ParsePortRange("8000-8080"); err != nil || r != (PortRange{8000, 8080}) {
		t.Errorf("ParsePortRange(8000-8080) = %v, %v", r, err)
	}
	for _, bad := range []string{"0", "65536", "80-", "x", "90-80"} {
		if _, err := ParsePortRange(bad); err == nil {
			t.Errorf("ParsePortRange(%q) succeeded", bad)
		}
	}
	if k, err := NormalizeKey("web"); err != nil || k != "default/web" {
		t.Errorf("NormalizeKey(web) = %q, %v", k, err)
	}
	m := Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{443, 443}, {80, 80}, {80, 80}}, PeerCIDRs: pfx("198.19.0.0/16", "198.18.0.0/16")}
	m.Normalize()
	if got, want := m.String(), "both TCP ports 80,443 peers 198.18.0.0/16,198.19.0.0/16"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
