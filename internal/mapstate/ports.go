package mapstate

import (
	"cmp"
	"slices"

	"github.com/rampartnet/rampart/internal/policy"
)

// l4 is the protocol/port part of a policy key.
type l4 struct {
	proto policy.Protocol
	port  uint16
	plen  uint8
}

// anyL4 matches every protocol and port (a rule without ports).
var anyL4 = l4{proto: policy.ProtoAny}

// anyProtocols is what Cilium's "ANY" protocol means for port rules: the protocols that have
// ports. ICMP and others are matched only by a rule without ports.
var anyProtocols = []policy.Protocol{policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP}

// portMask returns the mask that keeps the first plen bits of a port.
func portMask(plen uint8) uint16 {
	if plen == 0 {
		return 0
	}
	if plen >= 16 {
		return 0xffff
	}
	return ^uint16(0) << (16 - plen)
}

// PortPrefix is a block of ports sharing their first Len bits with Port.
type PortPrefix struct {
	Port uint16
	Len  uint8
}

// SplitPortRange returns the fewest port prefixes that together cover exactly lo..hi
// (inclusive), in increasing port order. It returns nil when hi < lo.
func SplitPortRange(lo, hi uint16) []PortPrefix {
	var out []PortPrefix
	cur, end := uint32(lo), uint32(hi)
	for cur <= end {
		// The largest aligned block starting at cur that does not pass end: its size is
		// limited by cur's alignment (lowest set bit) and by the ports left.
		size := uint32(1) << 16
		if cur != 0 {
			size = cur & -cur
		}
		for size > end-cur+1 {
			size >>= 1
		}
		plen := uint8(16)
		for s := size; s > 1; s >>= 1 {
			plen--
		}
		out = append(out, PortPrefix{Port: uint16(cur), Len: plen})
		cur += size
	}
	return out
}

// staticL4 expands the port rules that do not depend on named ports. names lists the named
// port rules, resolved later per subject or peer.
func staticL4(ports []policy.PortRule) (keys []l4, named []policy.PortRule) {
	if len(ports) == 0 {
		return []l4{anyL4}, nil
	}
	for _, pr := range ports {
		if pr.Name != "" {
			named = append(named, pr)
			continue
		}
		keys = append(keys, expandPort(pr)...)
	}
	return dedupL4(keys), named
}

func expandPort(pr policy.PortRule) []l4 {
	if pr.ICMPType {
		proto := pr.Protocol
		if proto != policy.ProtoICMPv6 {
			proto = policy.ProtoICMP
		}
		// The type is matched exactly, and type 0 (echo reply) is a real type, not "all".
		return []l4{{proto: proto, port: pr.Port, plen: 16}}
	}
	protos := []policy.Protocol{pr.Protocol}
	if pr.Protocol == policy.ProtoAny {
		protos = anyProtocols
	}
	var blocks []PortPrefix
	switch {
	case pr.Port == 0:
		blocks = []PortPrefix{{Port: 0, Len: 0}}
	case pr.EndPort > pr.Port:
		blocks = SplitPortRange(pr.Port, pr.EndPort)
	default:
		blocks = []PortPrefix{{Port: pr.Port, Len: 16}}
	}
	out := make([]l4, 0, len(protos)*len(blocks))
	for _, p := range protos {
		for _, b := range blocks {
			out = append(out, l4{proto: p, port: b.Port, plen: b.Len})
		}
	}
	return out
}

// namedPortSet is the union of named port declarations of some endpoints.
type namedPortSet map[string][]NamedPort

func (s namedPortSet) add(ports map[string]NamedPort) {
	for name, np := range ports {
		if np.Port == 0 || containsNamedPort(s[name], np) {
			continue
		}
		s[name] = append(s[name], np)
	}
}

func containsNamedPort(list []NamedPort, np NamedPort) bool {
	for _, x := range list {
		if x == np {
			return true
		}
	}
	return false
}

// resolveNamed turns named port rules into keys using the declarations in set. A name that
// no endpoint declares, or declares for another protocol than the rule's, adds nothing
// (as in Kubernetes: the rule cannot match such traffic).
func resolveNamed(named []policy.PortRule, set namedPortSet) []l4 {
	var out []l4
	for _, pr := range named {
		for _, np := range set[pr.Name] {
			switch {
			case np.Protocol == policy.ProtoAny:
				out = append(out, expandPort(policy.PortRule{Protocol: pr.Protocol, Port: np.Port})...)
			case pr.Protocol == policy.ProtoAny:
				if np.Protocol == policy.ProtoTCP || np.Protocol == policy.ProtoUDP || np.Protocol == policy.ProtoSCTP {
					out = append(out, l4{proto: np.Protocol, port: np.Port, plen: 16})
				}
			case pr.Protocol == np.Protocol:
				out = append(out, l4{proto: np.Protocol, port: np.Port, plen: 16})
			}
		}
	}
	return out
}

func dedupL4(keys []l4) []l4 {
	slices.SortFunc(keys, func(a, b l4) int {
		if c := cmp.Compare(a.proto, b.proto); c != 0 {
			return c
		}
		if c := cmp.Compare(a.plen, b.plen); c != 0 {
			return c
		}
		return cmp.Compare(a.port, b.port)
	})
	return slices.Compact(keys)
}
