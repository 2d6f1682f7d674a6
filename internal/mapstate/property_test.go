package mapstate

import (
	"flag"
	"fmt"
	"maps"
	"math/rand"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
)

var (
	propSeed  = flag.Int64("mapstate.seed", 1, "seed of the random policy property test")
	propCases = flag.Int("mapstate.cases", 3000, "number of random worlds in the property test")
)

// The property test: for random endpoints, rules and packets, Compute followed by Lookup
// (the dataplane's algorithm) must give the verdict of a reference evaluator that applies
// the rule semantics directly to addresses and labels, without identities, CIDR identities,
// port prefixes or deny rewriting. With L7 rules: a packet that no deny matches and that
// some allow rule matches through an L7 port rule is redirected to the proxy, and the L7
// rules Lookup reports must allow, per rule, exactly the requests the reference says: the
// union of that rule's HTTP rules on the port, or every request when the rule matches the
// packet without L7 rules too.

// refVerdict is what the reference evaluator decides.
type refVerdict struct {
	enforced  bool
	denies    []uint32 // rules that deny the packet
	allows    []uint32 // rules that allow the packet (redirecting or not)
	redirects []uint32 // allow rules that match it through an L7 port rule
	// http is, per allow rule, the requests it allows if the packet is redirected: the
	// canonical form of canonHTTP.
	http map[uint32]string
}

// canonHTTP renders a set of HTTP rules for comparison: "*" when one of them matches every
// request, else the distinct rules, sorted.
func canonHTTP(hs []policy.HTTPRule) string {
	var out []string
	for _, h := range hs {
		if h.MatchesAll() {
			return "*"
		}
		out = append(out, fmt.Sprintf("%q", h))
	}
	slices.Sort(out)
	return strings.Join(slices.Compact(out), " | ")
}

// refPeer is the other end of a packet as the semantics see it.
type refPeer struct {
	addr netip.Addr
	ep   *Endpoint // the endpoint with this address, if any
	host bool      // a host address (and not an endpoint's)
	// groups are the prefixes of every CIDR group that exists (a group absent here does
	// not exist, whatever rules say).
	groups map[string][]netip.Prefix
}

func classify(in *Input, a netip.Addr) refPeer {
	p := refPeer{addr: a}
	for i := range in.Endpoints {
		if in.Endpoints[i].IP == a {
			p.ep = &in.Endpoints[i]
			return p
		}
	}
	p.host = slices.Contains(in.HostIPs, a)
	return p
}

// portScope says where a matched peer's named ports come from on egress.
type portScope int

const (
	scopeAll   portScope = iota // any endpoint's declarations
	scopeGroup                  // the declarations of the endpoints sharing the peer's labels
)

// peerScopes returns how the rule's peers match the peer (empty when they do not).
func peerScopes(r *policy.Rule, peer refPeer) []portScope {
	if r.AllPeers {
		return []portScope{scopeAll}
	}
	var out []portScope
	for _, p := range r.Peers {
		switch p.Kind {
		case policy.PeerEndpoints:
			if peer.ep != nil && p.Selector.Matches(peer.ep.Labels) {
				out = append(out, scopeGroup)
			}
		case policy.PeerCIDR:
			if p.CIDR.Contains(peer.addr) && !slices.ContainsFunc(p.Except, func(e netip.Prefix) bool { return e.Contains(peer.addr) }) {
				out = append(out, scopeAll)
			}
		case policy.PeerCIDRGroup:
			// Any address inside any prefix of the group, whoever owns it.
			if slices.ContainsFunc(peer.groups[p.Group], func(q netip.Prefix) bool { return q.Contains(peer.addr) }) {
				out = append(out, scopeAll)
			}
		case policy.PeerEntity:
			switch p.Entity {
			case policy.EntityAll:
				out = append(out, scopeAll)
			case policy.EntityWorld:
				if peer.ep == nil && !peer.host {
					out = append(out, scopeAll)
				}
			case policy.EntityHost:
				if peer.host {
					out = append(out, scopeAll)
				}
			case policy.EntityCluster:
				if peer.ep != nil {
					out = append(out, scopeGroup)
				} else if peer.host {
					out = append(out, scopeAll)
				}
			}
			// remote-node, health, init, unmanaged, kube-apiserver, ingress: no address in
			// this world has those identities.
		}
	}
	return out
}

func isPortProto(p policy.Protocol) bool {
	return p == policy.ProtoTCP || p == policy.ProtoUDP || p == policy.ProtoSCTP
}

func refPortMatch(pr policy.PortRule, proto policy.Protocol, port uint16, named []NamedPort) bool {
	switch {
	case pr.Name != "":
		for _, np := range named {
			if np.Port != 0 && np.Port == port && np.Protocol == proto &&
				(pr.Protocol == np.Protocol || pr.Protocol == policy.ProtoAny && isPortProto(np.Protocol)) {
				return true
			}
		}
		return false
	case pr.ICMPType:
		want := policy.ProtoICMP
		if pr.Protocol == policy.ProtoICMPv6 {
			want = policy.ProtoICMPv6
		}
		return proto == want && port == pr.Port
	}
	if pr.Protocol == policy.ProtoAny && !isPortProto(proto) || pr.Protocol != policy.ProtoAny && pr.Protocol != proto {
		return false
	}
	switch {
	case pr.Port == 0:
		return true
	case pr.EndPort > pr.Port:
		return pr.Port <= port && port <= pr.EndPort
	}
	return port == pr.Port
}

func reference(in *Input, groups map[string][]netip.Prefix, ep *Endpoint, dir policy.Direction, peerAddr netip.Addr, proto policy.Protocol, port uint16) refVerdict {
	var v refVerdict
	peer := classify(in, peerAddr)
	peer.groups = groups
	namedFor := func(scope portScope, name string) []NamedPort {
		if dir == policy.Ingress {
			if np, ok := ep.NamedPorts[name]; ok {
				return []NamedPort{np}
			}
			return nil
		}
		var out []NamedPort
		for i := range in.Endpoints {
			other := &in.Endpoints[i]
			if scope == scopeGroup && !other.Labels.Equal(peer.ep.Labels) {
				continue
			}
			if np, ok := other.NamedPorts[name]; ok {
				out = append(out, np)
			}
		}
		return out
	}
	v.http = map[uint32]string{}
	for i := range in.Rules {
		r := &in.Rules[i]
		if r.Direction != dir || !r.Subject.Matches(ep.Labels) {
			continue
		}
		if r.EnableDefaultDeny {
			v.enforced = true
		}
		matched, redirect := false, false
		var http []policy.HTTPRule
		for _, scope := range peerScopes(r, peer) {
			if len(r.Ports) == 0 {
				matched = true
				http = append(http, policy.HTTPRule{})
			}
			for _, pr := range r.Ports {
				if !refPortMatch(pr, proto, port, namedFor(scope, pr.Name)) {
					continue
				}
				matched = true
				if pr.HTTP != nil && !r.Deny {
					redirect = true
					http = append(http, pr.HTTP...)
				} else {
					http = append(http, policy.HTTPRule{})
				}
			}
		}
		switch {
		case !matched:
		case r.Deny:
			v.denies = append(v.denies, r.ID)
		default:
			v.allows = append(v.allows, r.ID)
			v.http[r.ID] = canonHTTP(http)
			if redirect {
				v.redirects = append(v.redirects, r.ID)
			}
		}
	}
	return v
}

// gen makes random worlds from small alphabets, so selectors, CIDRs, excepts, ports and
// named ports overlap often.
type gen struct {
	rng *rand.Rand
	t   testing.TB
	// groups are the CIDR groups of the current world that exist, by name.
	groups map[string][]netip.Prefix
}

// groupNames are the names rules refer to; gx never exists, the others usually do.
var groupNames = []string{"g0", "g1", "g2", "gx"}

// cidrGroups makes the CIDR sets of a world: each of g0..g2 exists with a random distinct
// index and a few prefixes (often around the address pool, so they overlap each other,
// rule CIDRs and endpoint addresses; sometimes /0, /32 or IPv6).
func (g *gen) cidrGroups() (map[string][]netip.Prefix, map[string]uint8) {
	groups := map[string][]netip.Prefix{}
	index := map[string]uint8{}
	perm := g.rng.Perm(MaxCIDRSets)
	for i, name := range groupNames[:3] {
		if !g.chance(0.85) {
			continue
		}
		index[name] = uint8(perm[i])
		var ps []netip.Prefix
		for n := g.pick(4); n >= 0; n-- {
			switch {
			case g.chance(0.05):
				ps = append(ps, netip.MustParsePrefix("2001:db8::/32"))
			case g.chance(0.03):
				ps = append(ps, netip.MustParsePrefix("0.0.0.0/0"))
			default:
				ps = append(ps, netip.PrefixFrom(g.addr(), prefixBits[1+g.pick(len(prefixBits)-1)]).Masked())
			}
		}
		groups[name] = ps
	}
	return groups, index
}

// membershipOf is the dataplane's set mask computation, done the slow way.
func membershipOf(groups map[string][]netip.Prefix, index map[string]uint8) func(netip.Addr) uint32 {
	return func(a netip.Addr) uint32 {
		var m uint32
		for name, ps := range groups {
			if slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) }) {
				m |= 1 << index[name]
			}
		}
		return m
	}
}

func (g *gen) pick(n int) int { return g.rng.Intn(n) }

func (g *gen) chance(p float64) bool { return g.rng.Float64() < p }

var (
	namespaces = []string{"x", "y", "z"}
	podValues  = []string{"a", "b", "c"}
	namedPorts = []map[string]NamedPort{
		nil,
		{"http": {Port: 80, Protocol: policy.ProtoTCP}},
		{"http": {Port: 8080, Protocol: policy.ProtoTCP}, "dns": {Port: 53, Protocol: policy.ProtoUDP}},
		{"alt": {Port: 81, Protocol: policy.ProtoTCP}, "dns": {Port: 53, Protocol: policy.ProtoTCP}},
		{"http": {Port: 81, Protocol: policy.ProtoSCTP}},
	}
	addrPool = []string{
		"198.18.0.1", "198.18.0.10", "198.18.0.11", "198.18.0.200", "198.18.1.5", "198.18.1.77",
		"198.19.255.254", "10.0.0.1", "10.0.0.130", "10.1.2.3", "10.200.0.9", "8.8.8.8", "8.8.4.4",
		"1.2.3.4", "0.0.0.1", "255.255.255.255",
	}
	prefixBits = []int{0, 1, 8, 12, 15, 16, 23, 24, 25, 26, 30, 31, 32}
	protocols  = []policy.Protocol{policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP, policy.ProtoICMP, 47}
	ports      = []uint16{0, 8, 53, 79, 80, 81, 83, 85, 443, 8080, 65535}
)

func (g *gen) addr() netip.Addr {
	if g.chance(0.1) {
		var b [4]byte
		g.rng.Read(b[:])
		return netip.AddrFrom4(b)
	}
	return netip.MustParseAddr(addrPool[g.pick(len(addrPool))])
}

func (g *gen) selector() labels.Selector {
	req := func(key, op string, values ...string) labels.Requirement {
		r, err := labels.NewRequirement(key, op, values)
		if err != nil {
			g.t.Fatal(err)
		}
		return r
	}
	var s labels.Selector
	switch g.pick(10) {
	case 0: // everything
	case 1:
		return labels.None()
	case 2:
		s = s.With(req("pod", "In", podValues[g.pick(3)]))
	case 3:
		s = s.With(req(labels.KeyNamespace, "In", namespaces[g.pick(3)]))
	case 4:
		s = s.With(req("pod", "In", podValues[g.pick(3)])).With(req(labels.KeyNamespace, "In", namespaces[g.pick(3)]))
	case 5:
		s = s.With(req("pod", "NotIn", podValues[g.pick(3)]))
	case 6:
		s = s.With(req("tier", "Exists"))
	case 7:
		s = s.With(req("tier", "DoesNotExist"))
	case 8:
		s = s.With(req(labels.KeyNamespaceLabelPrefix+"team", "In", "blue"))
	case 9:
		s = s.With(req("pod", "In", "a", "b")).With(req("tier", "NotIn", "back"))
	}
	return s
}

func (g *gen) cidrPeer() policy.Peer {
	if g.chance(0.05) {
		// IPv6 prefixes: they must not change anything for IPv4 packets.
		return cidrPeer([]string{"::/0", "2001:db8::/32"}[g.pick(2)])
	}
	base := g.addr()
	p := netip.PrefixFrom(base, prefixBits[g.pick(len(prefixBits))]).Masked()
	peer := policy.Peer{Kind: policy.PeerCIDR, CIDR: p}
	for n := g.pick(3); n > 0; n-- {
		a := g.addr()
		if !p.Contains(a) {
			a = p.Addr()
		}
		bits := p.Bits() + g.pick(33-p.Bits())
		peer.Except = append(peer.Except, netip.PrefixFrom(a, bits).Masked())
	}
	return peer
}

var entities = []string{
	policy.EntityWorld, policy.EntityHost, policy.EntityCluster, policy.EntityAll, policy.EntityRemoteNode,
	policy.EntityHealth, policy.EntityInit, policy.EntityUnmanaged, policy.EntityKubeAPIServer, policy.EntityIngress,
}

func (g *gen) peer() policy.Peer {
	if g.chance(0.2) {
		return policy.Peer{Kind: policy.PeerCIDRGroup, Group: groupNames[g.pick(len(groupNames))]}
	}
	switch g.pick(3) {
	case 0:
		return endpointsPeer(g.selector())
	case 1:
		return g.cidrPeer()
	}
	return entityPeer(entities[g.pick(len(entities))])
}

// httpPool are the HTTP rules L7 port rules are made of; the reference never interprets
// them, so a few distinct ones (and the empty rule, which allows every request) suffice.
var httpPool = []policy.HTTPRule{
	{},
	{Method: "GET"},
	{Path: "/a/.*"},
	{Method: "POST", Path: "/b", Headers: []policy.HeaderMatch{{Name: "x-k", Value: "v"}}},
	{Host: "h"},
}

// l7PortRule makes an L7 port rule: one TCP port (a number the packets often use, or a
// name) with one to three HTTP rules.
func (g *gen) l7PortRule() policy.PortRule {
	pr := policy.PortRule{Protocol: policy.ProtoTCP}
	if g.chance(0.3) {
		pr.Name = []string{"http", "dns", "alt", "nope"}[g.pick(4)]
	} else {
		pr.Port = []uint16{53, 80, 81, 443, 8080}[g.pick(5)]
	}
	for n := 1 + g.pick(3); n > 0; n-- {
		pr.HTTP = append(pr.HTTP, httpPool[g.pick(len(httpPool))])
	}
	return pr
}

func (g *gen) portRule(deny bool) policy.PortRule {
	if !deny && g.chance(0.4) {
		return g.l7PortRule()
	}
	protos := []policy.Protocol{policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP, policy.ProtoAny}
	proto := protos[g.pick(len(protos))]
	switch g.pick(6) {
	case 0:
		return policy.PortRule{Protocol: proto, Name: []string{"http", "dns", "alt", "nope"}[g.pick(4)]}
	case 1:
		return policy.PortRule{Protocol: policy.ProtoICMP, Port: []uint16{0, 8}[g.pick(2)], ICMPType: true}
	case 2: // small range around the probed ports
		// Often aligned starts, so ranges split into wide prefixes that nest with exact
		// ports of other rules.
		lo := []uint16{64, 72, 76, 78, 80, uint16(70 + g.pick(20))}[g.pick(6)]
		return policy.PortRule{Protocol: proto, Port: lo, EndPort: lo + uint16(g.pick(15))}
	case 3: // large random range
		lo := uint16(1 + g.pick(65535))
		return policy.PortRule{Protocol: proto, Port: lo, EndPort: lo + uint16(g.pick(65536-int(lo)))}
	}
	return policy.PortRule{Protocol: proto, Port: ports[g.pick(len(ports))]}
}

func (g *gen) world() (*identity.Allocator, Input) {
	alloc := identity.NewAllocator()
	var in Input
	teams := map[string]string{}
	for _, ns := range namespaces {
		if g.chance(0.5) {
			teams[ns] = "blue"
		}
	}
	// Distinct addresses from the pool (some inside the CIDRs the rules use), never the
	// host's.
	hostIP := netip.MustParseAddr("198.18.0.1")
	in.HostIPs = []netip.Addr{hostIP}
	used := map[netip.Addr]bool{hostIP: true}
	for n, id := 1+g.pick(7), uint32(1); id <= uint32(n); id++ {
		a := g.addr()
		for used[a] {
			a = g.addr()
		}
		used[a] = true
		ns := namespaces[g.pick(3)]
		kv := []string{"pod", podValues[g.pick(3)]}
		if g.chance(0.5) {
			kv = append(kv, "tier", []string{"front", "back"}[g.pick(2)])
		}
		if team, ok := teams[ns]; ok {
			kv = append(kv, labels.KeyNamespaceLabelPrefix+"team", team)
		}
		l := fullLabels(ns, kv...)
		in.Endpoints = append(in.Endpoints, Endpoint{
			ID: id, Namespace: ns, Name: fmt.Sprintf("e%d", id), Labels: l,
			Identity: alloc.ForLabels(l), IP: a, NamedPorts: namedPorts[g.pick(len(namedPorts))],
		})
	}
	for n, i := 1+g.pick(8), 0; i < n; i++ {
		r := policy.Rule{
			ID:                uint32(100 - 3*i - g.pick(3)), // distinct, not in rule order
			Description:       fmt.Sprintf("rule%d", i),
			Subject:           g.selector(),
			Direction:         []policy.Direction{policy.Ingress, policy.Egress}[g.pick(2)],
			Deny:              g.chance(0.3),
			EnableDefaultDeny: g.chance(0.6),
			AllPeers:          g.chance(0.1),
		}
		if !r.AllPeers {
			for k := g.pick(4); k > 0; k-- {
				r.Peers = append(r.Peers, g.peer())
			}
		}
		if g.chance(0.6) {
			for k := 1 + g.pick(3); k > 0; k-- {
				r.Ports = append(r.Ports, g.portRule(r.Deny))
			}
		}
		in.Rules = append(in.Rules, r)
	}
	in.CIDRIdentities = map[netip.Prefix]identity.Identity{}
	for _, p := range Prefixes(in.Rules) {
		in.CIDRIdentities[p] = alloc.ForCIDR(p)
	}
	g.groups, in.CIDRSets = g.cidrGroups()
	in.CIDRSetMembership = membershipOf(g.groups, in.CIDRSets)
	return alloc, in
}

// l7Target returns a random allow rule with an L7 port rule, or nil.
func l7Target(g *gen, in *Input) *policy.Rule {
	var out []*policy.Rule
	for i := range in.Rules {
		if slices.ContainsFunc(in.Rules[i].Ports, func(pr policy.PortRule) bool { return pr.HTTP != nil }) {
			out = append(out, &in.Rules[i])
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out[g.pick(len(out))]
}

// portEdges returns the ports at and around the ends of every port and range in the rules,
// where off-by-one and prefix-nesting mistakes show.
func portEdges(rules []policy.Rule) []uint16 {
	var out []uint16
	for _, r := range rules {
		for _, pr := range r.Ports {
			for _, p := range []uint16{pr.Port, pr.EndPort} {
				if p != 0 {
					out = append(out, p-1, p, p+1)
				}
			}
		}
	}
	return out
}

// addrEdges returns the IPv4 addresses at and just outside both ends of every CIDR and
// except in the rules, and of every prefix of the groups.
func addrEdges(rules []policy.Rule, groups map[string][]netip.Prefix) []netip.Addr {
	var out []netip.Addr
	add := func(p netip.Prefix) {
		if !p.Addr().Is4() {
			return
		}
		b := p.Addr().As4()
		first := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		last := first | uint32(uint64(1)<<(32-p.Bits())-1)
		for _, v := range []uint32{first - 1, first, last, last + 1} {
			out = append(out, netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}))
		}
	}
	for _, r := range rules {
		for _, p := range r.Peers {
			if p.Kind == policy.PeerCIDR {
				add(p.CIDR)
				for _, e := range p.Except {
					add(e)
				}
			}
		}
	}
	for _, ps := range groups {
		for _, p := range ps {
			add(p)
		}
	}
	return out
}

func describe(in *Input, groups map[string][]netip.Prefix) string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(in.CIDRSets)) {
		fmt.Fprintf(&b, "  cidr group %s index %d: %v\n", name, in.CIDRSets[name], groups[name])
	}
	for _, ep := range in.Endpoints {
		fmt.Fprintf(&b, "  endpoint %d %s/%s ip=%v id=%d labels=%s named=%v\n", ep.ID, ep.Namespace, ep.Name, ep.IP, ep.Identity, ep.Labels, ep.NamedPorts)
	}
	for _, r := range in.Rules {
		fmt.Fprintf(&b, "  rule %d %s subject=%s deny=%v defaultDeny=%v allPeers=%v\n", r.ID, r.Direction, r.Subject, r.Deny, r.EnableDefaultDeny, r.AllPeers)
		for _, p := range r.Peers {
			switch p.Kind {
			case policy.PeerEndpoints:
				fmt.Fprintf(&b, "    peer endpoints %s\n", p.Selector)
			case policy.PeerCIDR:
				fmt.Fprintf(&b, "    peer cidr %v except %v\n", p.CIDR, p.Except)
			case policy.PeerEntity:
				fmt.Fprintf(&b, "    peer entity %s\n", p.Entity)
			case policy.PeerCIDRGroup:
				fmt.Fprintf(&b, "    peer cidrGroupRef %s\n", p.Group)
			}
		}
		for _, pr := range r.Ports {
			fmt.Fprintf(&b, "    port %+v\n", pr)
		}
	}
	return b.String()
}

func TestComputeLookupMatchesReference(t *testing.T) {
	g := &gen{rng: rand.New(rand.NewSource(*propSeed)), t: t}
	cases := *propCases
	if testing.Short() {
		cases /= 10
	}
	// mixed counts redirected packets that a plain allow matches too (its rule must then
	// allow every request through the proxy).
	// bySet counts packets decided by an entry of a CIDR set identity, inSet packets whose
	// peer is in some set.
	var packets, denied, byRule, defaults, redirected, mixed, bySet, inSet int
	for c := 0; c < cases; c++ {
		_, in := g.world()
		if err := in.Check(); err != nil {
			t.Fatalf("case %d: generated input fails Check: %v", c, err)
		}
		st := Compute(in)
		edges, addrs := portEdges(in.Rules), addrEdges(in.Rules, g.groups)

		// Rule order must not matter: merges keep the lowest rule ID.
		shuffled := in
		shuffled.Rules = slices.Clone(in.Rules)
		g.rng.Shuffle(len(shuffled.Rules), func(i, j int) { shuffled.Rules[i], shuffled.Rules[j] = shuffled.Rules[j], shuffled.Rules[i] })
		if st2 := Compute(shuffled); !reflect.DeepEqual(st, st2) {
			t.Fatalf("case %d (seed %d): state depends on rule order\n%s", c, *propSeed, describe(&in, g.groups))
		}

		for p := 0; p < 150; p++ {
			ep := &in.Endpoints[g.pick(len(in.Endpoints))]
			dir := []policy.Direction{policy.Ingress, policy.Egress}[g.pick(2)]
			var peer netip.Addr
			switch g.pick(3) {
			case 0:
				peer = in.Endpoints[g.pick(len(in.Endpoints))].IP
			case 1:
				peer = in.HostIPs[0]
			default:
				peer = g.addr()
				if g.chance(0.4) && len(addrs) > 0 {
					peer = addrs[g.pick(len(addrs))]
				}
			}
			proto := protocols[g.pick(len(protocols))]
			port := ports[g.pick(len(ports))]
			switch {
			case g.chance(0.3) && len(edges) > 0:
				port = edges[g.pick(len(edges))]
			case g.chance(0.2):
				port = uint16(g.rng.Intn(65536))
			}
			if g.chance(0.3) {
				// The ports L7 rules use, by number or by a name some endpoint declares.
				proto, port = policy.ProtoTCP, []uint16{53, 80, 81, 443, 8080}[g.pick(5)]
				// Often at an endpoint and in a direction an L7 rule applies to, so that
				// redirects meet other rules' allows and denies.
				if r := l7Target(g, &in); r != nil && g.chance(0.7) {
					dir = r.Direction
					var subjects []*Endpoint
					for i := range in.Endpoints {
						if r.Subject.Matches(in.Endpoints[i].Labels) {
							subjects = append(subjects, &in.Endpoints[i])
						}
					}
					if len(subjects) > 0 {
						ep = subjects[g.pick(len(subjects))]
					}
				}
			}
			if proto == 47 {
				port = 0
			}

			want := reference(&in, g.groups, ep, dir, peer, proto, port)
			sets := in.CIDRSetMembership(peer)
			got := LookupSets(st, ep.ID, dir, peer, sets, proto, port)
			packets++
			if sets != 0 {
				inSet++
			}
			if got.Entry != nil {
				if _, ok := identity.IsCIDRSet(got.Entry.Identity); ok {
					bySet++
				}
			}
			fail := func(msg string) {
				t.Fatalf("case %d (seed %d): endpoint %s/%s %s peer %v proto %d port %d: %s\n"+
					"got %+v\nreference: enforced=%v denies=%v allows=%v\nworld:\n%s",
					c, *propSeed, ep.Namespace, ep.Name, dir, peer, proto, port, msg,
					got, want.enforced, want.denies, want.allows, describe(&in, g.groups))
			}
			switch {
			case len(want.denies) > 0:
				if got.Verdict != Denied || got.Reason != ReasonDeniedByRule || !slices.Contains(want.denies, got.RuleID) {
					fail("want denied by one of the deny rules")
				}
				denied++
				byRule++
			case len(want.redirects) > 0:
				if got.Verdict != Redirected || got.Reason != ReasonRedirected || !slices.Contains(want.redirects, got.RuleID) {
					fail("want redirected by one of the L7 rules")
				}
				// The proxy's rules: per allow rule, the union of its L7 rules' HTTP.
				gotHTTP := map[uint32][]policy.HTTPRule{}
				for _, r := range got.L7 {
					if r.EndpointID != ep.ID || r.Direction != dir || r.Port != port || len(r.HTTP) == 0 {
						fail(fmt.Sprintf("L7 rule %+v is not for this flow or has no HTTP rules", r))
					}
					gotHTTP[r.RuleID] = append(gotHTTP[r.RuleID], r.HTTP...)
				}
				gotCanon := map[uint32]string{}
				for id, hs := range gotHTTP {
					gotCanon[id] = canonHTTP(hs)
				}
				if !maps.Equal(gotCanon, want.http) {
					fail(fmt.Sprintf("L7 rules allow %v, want %v", gotCanon, want.http))
				}
				redirected++
				if len(want.allows) > len(want.redirects) {
					mixed++
				}
				byRule++
			case len(want.allows) > 0:
				if got.Verdict != Allowed || got.Reason != ReasonAllowedByRule || !slices.Contains(want.allows, got.RuleID) || got.L7 != nil {
					fail("want allowed by one of the allow rules")
				}
				byRule++
			case want.enforced:
				if got.Verdict != Denied || got.Reason != ReasonDefaultDeny || got.RuleID != 0 {
					fail("want default deny")
				}
				denied++
				defaults++
			default:
				if got.Verdict != Allowed || got.Reason != ReasonNoEnforcement || got.RuleID != 0 {
					fail("want allowed without enforcement")
				}
			}
		}
	}
	// The generator must exercise every outcome, or the comparison proves little.
	t.Logf("%d worlds, %d packets: %d denied, %d decided by a rule, %d default-denied, %d redirected (%d also allowed by a plain rule), %d with a peer in a CIDR set, %d decided by a set's entry",
		cases, packets, denied, byRule, defaults, redirected, mixed, inSet, bySet)
	if byRule < packets/20 || defaults < packets/20 || denied < packets/10 || packets-denied < packets/10 || redirected < packets/200 || mixed < packets/2000 ||
		inSet < packets/10 || bySet < packets/100 {
		t.Fatalf("generator too skewed: %d packets, %d denied, %d by rule, %d default, %d redirected, %d mixed, %d in a set, %d by a set", packets, denied, byRule, defaults, redirected, mixed, inSet, bySet)
	}
}
