package l7plan

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// Plan is what the proxy must enforce, derived from the desired state alone. It is the
// pure half of the translation: BuildPlan computes it, proxy.BuildResources turns it into
// Envoy configuration. Tests check its decisions against mapstate.Lookup.
type Plan struct {
	// Chains are the listener's filter chains, sorted by Name. A connection that matches
	// none is closed.
	Chains []Chain
}

// Chain is one filter chain of the proxy listener: the connections steered to the proxy
// for one TCP port from a source endpoint (Src valid), to a destination endpoint (Dst
// valid), or both. Egress holds the source endpoint's egress authorisation, Ingress the
// destination endpoint's ingress authorisation; a request passes only if every non-nil one
// lets it through.
type Chain struct {
	Name    string
	Port    uint16
	Src     netip.Addr // the source endpoint's address; invalid: any source
	Dst     netip.Addr // the destination endpoint's address; invalid: any destination
	Egress  *Authz
	Ingress *Authz
}

// Authz is what one endpoint's policy lets through the proxy in one direction on one port:
// a request passes if one of Grants matches it.
type Authz struct {
	EndpointID uint32
	Direction  policy.Direction
	Port       uint16
	Grants     []Grant
}

// Grant lets requests through from (ingress) or to (egress) Peers when they match one of
// HTTP (nil HTTP: every request).
type Grant struct {
	// Name is unique within an Authz: "l3l4" for peers a plain (non-L7) entry allows, or
	// "rule-<RuleID>-<n>" for the n-th L7 rule of that policy rule.
	Name   string
	RuleID uint32 // 0 for the l3l4 grant
	Peers  AddrSet
	HTTP   []policy.HTTPRule
}

// GrantL3L4 names the grant for peers that the endpoint's policy allows without L7 rules:
// they reach the proxy only when the other end's policy redirects the connection.
const GrantL3L4 = "l3l4"

// AddrSet is a set of addresses: the union of its ranges.
type AddrSet []AddrRange

// AddrRange is Prefix without the addresses of any prefix in Except.
type AddrRange struct {
	Prefix netip.Prefix
	Except []netip.Prefix
}

// Contains reports whether a is in the set.
func (s AddrSet) Contains(a netip.Addr) bool {
	for _, r := range s {
		if r.Prefix.Contains(a) && !slices.ContainsFunc(r.Except, func(p netip.Prefix) bool { return p.Contains(a) }) {
			return true
		}
	}
	return false
}

// Request is an HTTP request as the proxy's rules see it (for tests and explanations).
type Request struct {
	Src, Dst netip.Addr
	Port     uint16
	Method   string
	Path     string // without the query
	Host     string
	Header   map[string]string // lower-case names
}

// Allows reports whether the request passes the authorisation, and the grant that let it.
func (z *Authz) Allows(r Request) (bool, *Grant) {
	peer := r.Src
	if z.Direction == policy.Egress {
		peer = r.Dst
	}
	for i := range z.Grants {
		g := &z.Grants[i]
		if g.Peers.Contains(peer) && httpMatches(g.HTTP, r) {
			return true, g
		}
	}
	return false, nil
}

// Chain returns the filter chain Envoy would pick for a connection, as Envoy's filter chain
// match does it: destination port, then the most specific destination address, then the most
// specific source address. nil: no chain (the connection is closed).
func (p *Plan) Chain(src, dst netip.Addr, port uint16) *Chain {
	var best *Chain
	score := func(c *Chain) int {
		s := 0
		if c.Dst.IsValid() {
			s += 2
		}
		if c.Src.IsValid() {
			s++
		}
		return s
	}
	for i := range p.Chains {
		c := &p.Chains[i]
		if c.Port != port || (c.Dst.IsValid() && c.Dst != dst) || (c.Src.IsValid() && c.Src != src) {
			continue
		}
		if best == nil || score(c) > score(best) {
			best = c
		}
	}
	return best
}

// Allows reports whether the plan lets the request through.
func (p *Plan) Allows(r Request) bool {
	c := p.Chain(r.Src, r.Dst, r.Port)
	if c == nil || (c.Egress == nil && c.Ingress == nil) {
		return false
	}
	for _, z := range []*Authz{c.Egress, c.Ingress} {
		if z == nil {
			continue
		}
		if ok, _ := z.Allows(r); !ok {
			return false
		}
	}
	return true
}

// chainKey is one (endpoint, direction, port) with L7 rules.
type chainKey struct {
	ep   uint32
	dir  policy.Direction
	port uint16
}

// BuildPlan computes the proxy's chains from the desired state st. Chains exist for every
// (endpoint, direction, port) with L7 rules in st, and also for those in keep (the state
// being replaced), so that connections the dataplane still steers under the old state find
// a chain whose checks follow st until the dataplane has moved on.
//
// Every authorisation is computed from st's policy entries and ipcache exactly as the
// dataplane decides (mapstate.Lookup, with redirect winning over allow as in the
// dataplane): peers the endpoint redirects pass if an L7 rule of theirs matches the request;
// peers it allows without L7 rules pass (they reach the proxy only because the other
// endpoint redirects); everyone else is refused.
func BuildPlan(st mapstate.State, keep *mapstate.State) Plan {
	keys := map[chainKey]bool{}
	for _, r := range st.L7 {
		keys[chainKey{r.EndpointID, r.Direction, r.Port}] = true
	}
	if keep != nil {
		for _, r := range keep.L7 {
			keys[chainKey{r.EndpointID, r.Direction, r.Port}] = true
		}
	}
	// An endpoint's addresses: its IPv4 one and, dual-stack, its IPv6 one; each gets
	// its chains.
	epIPs := map[uint32][]netip.Addr{}
	for p, e := range st.IPCache {
		if e.EndpointID != 0 && p.IsSingleIP() {
			epIPs[e.EndpointID] = append(epIPs[e.EndpointID], p.Addr())
		}
	}
	universe := sortedPrefixes(st.IPCache)

	// Per port: the ingress and egress authorisations by endpoint address.
	type side struct {
		addr netip.Addr
		z    *Authz
	}
	ports := map[uint16]*struct{ in, out []side }{}
	for k := range keys {
		ips := epIPs[k.ep]
		if len(ips) == 0 {
			continue // endpoint gone: nothing can be steered from or to it
		}
		z := buildAuthz(st, universe, k)
		pp := ports[k.port]
		if pp == nil {
			pp = &struct{ in, out []side }{}
			ports[k.port] = pp
		}
		for _, ip := range ips {
			if k.dir == policy.Ingress {
				pp.in = append(pp.in, side{ip, z})
			} else {
				pp.out = append(pp.out, side{ip, z})
			}
		}
	}
	var plan Plan
	for port, pp := range ports {
		for _, in := range pp.in {
			plan.Chains = append(plan.Chains, Chain{
				Name: fmt.Sprintf("in:%s:%d", in.addr, port), Port: port, Dst: in.addr, Ingress: in.z,
			})
		}
		for _, out := range pp.out {
			plan.Chains = append(plan.Chains, Chain{
				Name: fmt.Sprintf("out:%s:%d", out.addr, port), Port: port, Src: out.addr, Egress: out.z,
			})
			// Envoy picks the destination address before the source address, so a
			// connection from out to an endpoint with its own ingress chain would never see
			// out's egress rules: give every such pair a chain with both.
			for _, in := range pp.in {
				if in.addr.Is4() != out.addr.Is4() {
					continue // no connection runs between two families
				}
				plan.Chains = append(plan.Chains, Chain{
					Name: fmt.Sprintf("pair:%s>%s:%d", out.addr, in.addr, port), Port: port,
					Src: out.addr, Dst: in.addr, Egress: out.z, Ingress: in.z,
				})
			}
		}
	}
	slices.SortFunc(plan.Chains, func(a, b Chain) int { return cmp.Compare(a.Name, b.Name) })
	return plan
}

// class is the dataplane's verdict for one peer.
type class uint8

const (
	classDeny class = iota
	classAllow
	classRedirect
)

// buildAuthz computes one endpoint's authorisation for one direction and port.
func buildAuthz(st mapstate.State, universe []netip.Prefix, k chainKey) *Authz {
	z := &Authz{EndpointID: k.ep, Direction: k.dir, Port: k.port}
	ep, ok := st.Endpoints[k.ep]
	if !ok {
		return z // unknown endpoint: the dataplane drops; so does the proxy
	}
	classes := make(map[netip.Prefix]class, len(universe))
	var allow []netip.Prefix
	for _, p := range universe {
		e := st.IPCache[p]
		c := decide(ep, k.dir, k.port, e)
		classes[p] = c
		if c == classAllow {
			allow = append(allow, p)
		}
	}
	if len(allow) > 0 {
		z.Grants = append(z.Grants, Grant{Name: GrantL3L4, Peers: addrSet(universe, allow)})
	}
	n := map[uint32]int{}
	for _, r := range st.L7 {
		if r.EndpointID != k.ep || r.Direction != k.dir || r.Port != k.port {
			continue
		}
		var peers []netip.Prefix
		for _, p := range universe {
			if classes[p] == classRedirect && peersMatch(r.Peers, st.IPCache[p]) {
				peers = append(peers, p)
			}
		}
		i := n[r.RuleID]
		n[r.RuleID]++
		if len(peers) == 0 {
			continue
		}
		z.Grants = append(z.Grants, Grant{
			Name:   fmt.Sprintf("rule-%d-%d", r.RuleID, i),
			RuleID: r.RuleID,
			Peers:  addrSet(universe, peers),
			HTTP:   r.HTTP,
		})
	}
	return z
}

func peersMatch(peers []identity.Identity, e mapstate.IPCacheEntry) bool {
	for _, id := range peers {
		if id == identity.Any || id == e.Identity || (e.Secondary != 0 && id == e.Secondary) {
			return true
		}
	}
	return false
}

// decide is the dataplane's verdict for a TCP connection on port with a peer of the given
// ipcache entry: the lookups for the peer identity, any identity and the secondary identity,
// deny over redirect over allow; default deny when the direction is enforced.
func decide(ep mapstate.EndpointPolicy, dir policy.Direction, port uint16, e mapstate.IPCacheEntry) class {
	ids := []identity.Identity{e.Identity, identity.Any}
	if e.Secondary != 0 {
		ids = append(ids, e.Secondary)
	}
	best, matched := classDeny, false
	for _, id := range ids {
		v, ok := lookupPolicy(ep.Entries, id, dir, policy.ProtoTCP, port)
		if !ok {
			continue
		}
		if v.Deny {
			return classDeny
		}
		c := classAllow
		if v.Redirect {
			c = classRedirect
		}
		if !matched || c > best {
			best, matched = c, true
		}
	}
	if matched {
		return best
	}
	enforced := (dir == policy.Ingress && ep.EnforceIngress) || (dir == policy.Egress && ep.EnforceEgress)
	if enforced {
		return classDeny
	}
	return classAllow
}

// lookupPolicy is one LPM lookup of the policy map (see mapstate.Lookup): the longest entry
// for the protocol whose port prefix matches, else the any-protocol entry.
func lookupPolicy(entries map[mapstate.Key]mapstate.Value, id identity.Identity, dir policy.Direction, proto policy.Protocol, port uint16) (mapstate.Value, bool) {
	for plen := 16; plen >= 0; plen-- {
		mask := uint16(0)
		if plen > 0 {
			mask = ^uint16(0) << (16 - plen)
		}
		k := mapstate.Key{Identity: id, Direction: dir, Protocol: proto, Port: port & mask, PortPrefixLen: uint8(plen)}
		if v, ok := entries[k]; ok {
			return v, true
		}
	}
	v, ok := entries[mapstate.Key{Identity: id, Direction: dir, Protocol: policy.ProtoAny}]
	return v, ok
}

// addrSet is the set of addresses whose longest ipcache prefix is in sel: each selected
// prefix without the largest ipcache prefixes strictly inside it that are not selected
// (their addresses belong to those). universe is every ipcache prefix, sorted.
func addrSet(universe, sel []netip.Prefix) AddrSet {
	in := make(map[netip.Prefix]bool, len(sel))
	for _, p := range sel {
		in[p] = true
	}
	var out AddrSet
	for _, p := range sel {
		r := AddrRange{Prefix: p}
		for _, q := range universe {
			if in[q] || q.Bits() <= p.Bits() || !p.Contains(q.Addr()) {
				continue
			}
			// Keep only maximal exceptions: q inside an exception already kept is covered.
			if slices.ContainsFunc(r.Except, func(x netip.Prefix) bool { return x.Contains(q.Addr()) && x.Bits() <= q.Bits() }) {
				continue
			}
			r.Except = append(r.Except, q)
		}
		out = append(out, r)
	}
	return out
}

// sortedPrefixes returns the ipcache prefixes, shortest first, then by address: a prefix
// comes before every prefix inside it, which addrSet relies on.
func sortedPrefixes(m map[netip.Prefix]mapstate.IPCacheEntry) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := cmp.Compare(a.Bits(), b.Bits()); c != 0 {
			return c
		}
		return a.Addr().Compare(b.Addr())
	})
	return out
}
