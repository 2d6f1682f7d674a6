package mapstate

import (
	"cmp"
	"slices"

	"github.com/rampartnet/rampart/internal/fqdn"
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

// portKey is one l4 key a rule yields, with its L7 part.
type portKey struct {
	l4
	// redirect: an L7 port rule of an allow rule yields the key, so the traffic it matches
	// goes through the proxy. Such keys are always one TCP port (PortPrefixLen 16).
	redirect bool
	// http is, for redirect keys, what the rule allows on the port: the HTTP rules of the
	// L7 port rules that yield the key, or allowAllHTTP when a plain port rule yields it
	// too (that port rule allows every request).
	http []policy.HTTPRule
	// dns is, for redirect keys of DNS port rules, the selectors of the names the rule
	// allows queries for (allowAllDNS when a plain port rule yields the key too): such keys
	// steer to the DNS proxy, not the HTTP proxy.
	dns []fqdn.Selector
}

// allowAllHTTP is the HTTP rule list that allows every request: one empty rule.
var allowAllHTTP = []policy.HTTPRule{{}}

// allowAllDNS is the DNS selector list that allows every query.
var allowAllDNS = []fqdn.Selector{fqdn.MatchAll}

// l7Port reports whether pr is an L7 port rule of an allow rule, and whether it is one the
// dataplane can carry (one TCP port; see policy.PortRule.CheckL7). Deny rules have no L7
// part: their HTTP rules, which Input.Check reports, are ignored and the port is denied.
func l7Port(pr policy.PortRule, deny bool) (isL7, valid bool) {
	if pr.HTTP == nil && pr.DNS == nil || deny {
		return false, false
	}
	single := pr.Name != "" || pr.Port != 0 && pr.EndPort <= pr.Port
	if pr.DNS != nil {
		// DNS: UDP, TCP or both (ANY), one port.
		dnsProto := pr.Protocol == policy.ProtoUDP || pr.Protocol == policy.ProtoTCP || pr.Protocol == policy.ProtoAny
		return true, pr.HTTP == nil && dnsProto && !pr.ICMPType && single && len(pr.DNS) > 0
	}
	return true, pr.Protocol == policy.ProtoTCP && !pr.ICMPType && single && len(pr.HTTP) > 0
}

// l7Key makes k a redirect key carrying pr's L7 rules. A DNS port rule yields no SCTP key
// (ANY means UDP and TCP for DNS); ok is false for a key to leave out.
func l7Key(k l4, pr policy.PortRule) (pk portKey, ok bool) {
	pk = portKey{l4: k, redirect: true, http: pr.HTTP, dns: pr.DNS}
	if pr.DNS != nil && k.proto != policy.ProtoUDP && k.proto != policy.ProtoTCP {
		return pk, false
	}
	return pk, true
}

// staticL4 expands the port rules that do not depend on named ports. named lists the named
// port rules, resolved later per subject or peer. An invalid L7 port rule yields no key:
// the rule allows nothing through it (fail closed).
func staticL4(ports []policy.PortRule, deny bool) (keys []portKey, named []policy.PortRule) {
	if len(ports) == 0 {
		return []portKey{{l4: anyL4}}, nil
	}
	for _, pr := range ports {
		if pr.Name != "" {
			named = append(named, pr)
			continue
		}
		isL7, valid := l7Port(pr, deny)
		if isL7 && !valid {
			continue
		}
		for _, k := range expandPort(pr) {
			pk, ok := portKey{l4: k}, true
			if isL7 {
				pk, ok = l7Key(k, pr)
			}
			if ok {
				keys = append(keys, pk)
			}
		}
	}
	return dedupKeys(keys), named
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
func resolveNamed(named []policy.PortRule, set namedPortSet, deny bool) []portKey {
	var out []portKey
	for _, pr := range named {
		isL7, valid := l7Port(pr, deny)
		if isL7 && !valid {
			continue
		}
		var keys []l4
		for _, np := range set[pr.Name] {
			switch {
			case np.Protocol == policy.ProtoAny:
				keys = append(keys, expandPort(policy.PortRule{Protocol: pr.Protocol, Port: np.Port})...)
			case pr.Protocol == policy.ProtoAny:
				if np.Protocol == policy.ProtoTCP || np.Protocol == policy.ProtoUDP || np.Protocol == policy.ProtoSCTP {
					keys = append(keys, l4{proto: np.Protocol, port: np.Port, plen: 16})
				}
			case pr.Protocol == np.Protocol:
				keys = append(keys, l4{proto: np.Protocol, port: np.Port, plen: 16})
			}
		}
		for _, k := range keys {
			pk, ok := portKey{l4: k}, true
			if isL7 {
				pk, ok = l7Key(k, pr)
			}
			if ok {
				out = append(out, pk)
			}
		}
	}
	return out
}

func compareL4(a, b l4) int {
	if c := cmp.Compare(a.proto, b.proto); c != 0 {
		return c
	}
	if c := cmp.Compare(a.plen, b.plen); c != 0 {
		return c
	}
	return cmp.Compare(a.port, b.port)
}

// dedupKeys sorts keys and merges equal ones: a key is a redirect if any of its sources is,
// and then allows every request if any source is a plain port rule, else the union of the
// sources' HTTP rules.
func dedupKeys(keys []portKey) []portKey {
	slices.SortStableFunc(keys, func(a, b portKey) int { return compareL4(a.l4, b.l4) })
	out := keys[:0]
	for _, k := range keys {
		if n := len(out); n > 0 && out[n-1].l4 == k.l4 {
			out[n-1] = mergeKey(out[n-1], k)
			continue
		}
		out = append(out, k)
	}
	return out
}

// A key with DNS rules from any source steers to the DNS proxy; HTTP rules merged into it
// then have no effect but to let nothing else through (the DNS proxy refuses what is not
// DNS), so the merge fails closed.
func mergeKey(a, b portKey) portKey {
	switch {
	case a.redirect && b.redirect:
		if a.http != nil || b.http != nil {
			a.http = unionHTTP(a.http, b.http)
		}
		if a.dns != nil || b.dns != nil {
			a.dns = unionDNS(a.dns, b.dns)
		}
	case a.redirect || b.redirect:
		r := a
		if b.redirect {
			r = b
		}
		a.redirect, a.http, a.dns = true, allowAllHTTP, nil
		if r.dns != nil {
			a.http, a.dns = nil, allowAllDNS
		}
	}
	return a
}

// unionDNS returns the selectors of a and b without repeats, in order; a selector that
// matches every name makes the union allowAllDNS.
func unionDNS(a, b []fqdn.Selector) []fqdn.Selector {
	out := make([]fqdn.Selector, 0, len(a)+len(b))
	for _, list := range [][]fqdn.Selector{a, b} {
		for _, s := range list {
			if s.MatchesAll() {
				return allowAllDNS
			}
			if !slices.ContainsFunc(out, func(o fqdn.Selector) bool { return o.String() == s.String() }) {
				out = append(out, s)
			}
		}
	}
	return out
}

// unionHTTP returns the HTTP rules of a and b without repeats, in order; a rule that
// matches every request makes the union allowAllHTTP. The inputs are not modified.
func unionHTTP(a, b []policy.HTTPRule) []policy.HTTPRule {
	out := make([]policy.HTTPRule, 0, len(a)+len(b))
	for _, list := range [][]policy.HTTPRule{a, b} {
		for _, h := range list {
			if h.MatchesAll() {
				return allowAllHTTP
			}
			if !slices.ContainsFunc(out, h.Equal) {
				out = append(out, h)
			}
		}
	}
	return out
}
