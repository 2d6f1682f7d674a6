package mapstate

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sort"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
)

var (
	worldV4 = netip.MustParsePrefix("0.0.0.0/0")
	worldV6 = netip.MustParsePrefix("::/0")
)

// canonicalPrefix masks p and unmaps IPv4-mapped IPv6 prefixes (as identity.Allocator does),
// so that one network has one key in every map.
func canonicalPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Prefixes returns every CIDR and except prefix the rules use, masked, deduplicated and
// sorted (by address, then length; IPv4 before IPv6). The agent allocates a CIDR identity for
// each and passes them as Input.CIDRIdentities.
func Prefixes(rules []policy.Rule) []netip.Prefix {
	var out []netip.Prefix
	for i := range rules {
		for _, p := range rules[i].Peers {
			if p.Kind != policy.PeerCIDR {
				continue
			}
			if p.CIDR.IsValid() {
				out = append(out, canonicalPrefix(p.CIDR))
			}
			for _, e := range p.Except {
				if e.IsValid() {
					out = append(out, canonicalPrefix(e))
				}
			}
		}
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out)
}

// Check reports input that Compute cannot turn into a correct state: a policy prefix without
// a valid CIDR identity (its CIDR peers, allow or deny, would silently select less),
// endpoints without an identity, an address, a unique address or a unique ID, duplicate
// rule IDs (Trace could name the wrong rule), CIDR sets with an index out of range or
// shared, and L7 rules the dataplane cannot carry (on a deny rule, or on anything but one
// TCP port; Compute lets such a port rule allow nothing). A peer naming a CIDR set that
// does not exist is not an error (it selects nothing, as in Cilium): see
// MissingCIDRGroups.
func (in Input) Check() error {
	var errs []error
	for _, p := range Prefixes(in.Rules) {
		id, ok := in.CIDRIdentities[p]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("policy prefix %v has no CIDR identity", p))
		case !validCIDRIdentity(id):
			errs = append(errs, fmt.Errorf("policy prefix %v has identity %d, not a CIDR identity", p, id))
		}
	}
	epIDs := map[uint32]string{}
	epAddrs := map[netip.Addr]string{}
	for _, ep := range in.Endpoints {
		name := ep.Namespace + "/" + ep.Name
		if other, dup := epIDs[ep.ID]; dup {
			errs = append(errs, fmt.Errorf("endpoints %s and %s share endpoint ID %d", other, name, ep.ID))
		}
		epIDs[ep.ID] = name
		if other, dup := epAddrs[ep.IP.Unmap()]; dup && ep.IP.IsValid() {
			errs = append(errs, fmt.Errorf("endpoints %s and %s share address %v", other, name, ep.IP))
		}
		epAddrs[ep.IP.Unmap()] = name
		if ep.Host != (ep.ID == HostEndpointID) || ep.Host && ep.Identity != identity.Host {
			errs = append(errs, fmt.Errorf("endpoint %s: only the host endpoint has ID %d and identity host", name, HostEndpointID))
		}
		if ep.Identity == identity.Any || ep.Identity&identity.EndpointCIDRFlag != 0 {
			errs = append(errs, fmt.Errorf("endpoint %s has invalid identity %d", name, ep.Identity))
		}
		if !ep.IP.IsValid() {
			errs = append(errs, fmt.Errorf("endpoint %s has no address", name))
		}
		if ep.IP6.IsValid() {
			if !ep.IP6.Is6() || ep.IP6.Is4In6() || ep.Host {
				errs = append(errs, fmt.Errorf("endpoint %s: IPv6 address %v: want an IPv6 address of a pod", name, ep.IP6))
			}
			if other, dup := epAddrs[ep.IP6]; dup {
				errs = append(errs, fmt.Errorf("endpoints %s and %s share address %v", other, name, ep.IP6))
			}
			epAddrs[ep.IP6] = name
		}
	}
	for _, ep := range in.Remote {
		name := "remote endpoint " + ep.Namespace + "/" + ep.Name
		if other, dup := epAddrs[ep.IP.Unmap()]; dup && ep.IP.IsValid() {
			errs = append(errs, fmt.Errorf("endpoints %s and %s share address %v", other, name, ep.IP))
		}
		epAddrs[ep.IP.Unmap()] = name
		if ep.IP6.IsValid() {
			if !ep.IP6.Is6() || ep.IP6.Is4In6() {
				errs = append(errs, fmt.Errorf("%s: IPv6 address %v: want an IPv6 address of a pod", name, ep.IP6))
			}
			if other, dup := epAddrs[ep.IP6]; dup {
				errs = append(errs, fmt.Errorf("endpoints %s and %s share address %v", other, name, ep.IP6))
			}
			epAddrs[ep.IP6] = name
		}
		if !validEndpointIdentity(ep.Identity) {
			errs = append(errs, fmt.Errorf("%s has invalid identity %d", name, ep.Identity))
		}
		if !ep.IP.IsValid() || !ep.Node.Is4() {
			errs = append(errs, fmt.Errorf("%s needs an address and an IPv4 node address", name))
		}
	}
	setNames := map[uint8]string{}
	for _, name := range slices.Sorted(maps.Keys(in.CIDRSets)) {
		idx := in.CIDRSets[name]
		if idx >= MaxCIDRSets {
			errs = append(errs, fmt.Errorf("CIDR set %q has index %d, want 0-%d", name, idx, MaxCIDRSets-1))
		}
		if other, dup := setNames[idx]; dup {
			errs = append(errs, fmt.Errorf("CIDR sets %q and %q share index %d", other, name, idx))
		}
		setNames[idx] = name
	}
	ruleIDs := map[uint32]bool{}
	tierRules := map[policy.Tier]int{}
	for i := range in.Rules {
		r := &in.Rules[i]
		if ruleIDs[r.ID] {
			errs = append(errs, fmt.Errorf("rule ID %d used twice", r.ID))
		}
		if r.ID == HostTrafficRuleID {
			errs = append(errs, fmt.Errorf("rule ID %d is reserved for host traffic", r.ID))
		}
		ruleIDs[r.ID] = true
		switch {
		case r.Tier == policy.TierNetworkPolicy && r.Pass:
			errs = append(errs, fmt.Errorf("rule %d (%s): Pass outside the Admin and Baseline tiers", r.ID, r.Description))
		case r.Tier != policy.TierNetworkPolicy && r.EnableDefaultDeny:
			errs = append(errs, fmt.Errorf("rule %d (%s): a %s tier rule cannot switch on default deny", r.ID, r.Description, r.Tier))
		case r.Pass && r.Deny:
			errs = append(errs, fmt.Errorf("rule %d (%s): Pass and Deny at once", r.ID, r.Description))
		}
		if r.Tier != policy.TierNetworkPolicy {
			tierRules[r.Tier]++
		}
		for _, pr := range r.Ports {
			if (pr.HTTP != nil || pr.DNS != nil) && r.Deny {
				errs = append(errs, fmt.Errorf("rule %d (%s): a deny rule cannot have L7 rules", r.ID, r.Description))
			} else if err := pr.CheckL7(); err != nil {
				errs = append(errs, fmt.Errorf("rule %d (%s): %w", r.ID, r.Description, err))
			}
		}
	}
	for t, n := range tierRules {
		if n > MaxTierRules {
			errs = append(errs, fmt.Errorf("%d rules in the %s tier: at most %d", n, t, MaxTierRules))
		}
	}
	return errors.Join(errs...)
}

// MissingCIDRGroups returns the CIDR group names that rules refer to (cidrGroupRef) and
// that are not in CIDRSets, sorted and distinct: those peers select nothing for now.
func (in Input) MissingCIDRGroups() []string {
	var out []string
	for i := range in.Rules {
		for _, p := range in.Rules[i].Peers {
			if _, ok := in.CIDRSets[p.Group]; p.Kind == policy.PeerCIDRGroup && !ok {
				out = append(out, p.Group)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// CIDRSetIdentity returns the identity of CIDR set index (identity.CIDRSet), and false for
// an index the dataplane does not have.
func CIDRSetIdentity(index uint8) (identity.Identity, bool) {
	if index >= MaxCIDRSets {
		return 0, false
	}
	return identity.CIDRSet(index), true
}

func validCIDRIdentity(id identity.Identity) bool {
	return id >= identity.FirstCIDR && id < identity.FirstCIDRSet && id&identity.EndpointCIDRFlag == 0
}

// prefixIdentity is a policy prefix with its CIDR identity.
type prefixIdentity struct {
	prefix netip.Prefix
	id     identity.Identity
}

// prefixTable holds the policy prefixes, sorted for range scans and hashed for LPM.
type prefixTable struct {
	sorted   []prefixIdentity
	byPrefix map[netip.Prefix]identity.Identity
}

func newPrefixTable(m map[netip.Prefix]identity.Identity) prefixTable {
	t := prefixTable{byPrefix: make(map[netip.Prefix]identity.Identity, len(m))}
	for p, id := range m {
		// An invalid entry would put a non-CIDR number (worst: 0, "any peer") into policy
		// keys; it is left out, and Check reports it.
		if !p.IsValid() || !validCIDRIdentity(id) {
			continue
		}
		p = canonicalPrefix(p)
		if old, ok := t.byPrefix[p]; ok && old <= id {
			continue // two spellings of one network: keep one, deterministically
		}
		t.byPrefix[p] = id
	}
	t.sorted = make([]prefixIdentity, 0, len(t.byPrefix))
	for p, id := range t.byPrefix {
		t.sorted = append(t.sorted, prefixIdentity{p, id})
	}
	slices.SortFunc(t.sorted, func(a, b prefixIdentity) int { return comparePrefix(a.prefix, b.prefix) })
	return t
}

// within returns the policy prefixes inside p (p itself included). In (address, length)
// order they form one run starting at p's position: a prefix inside p has an address inside
// p and is at least as long, and a prefix with an address inside p that is shorter than p
// would have p's address and sort before it.
func (t prefixTable) within(p netip.Prefix) []prefixIdentity {
	i := sort.Search(len(t.sorted), func(i int) bool { return comparePrefix(t.sorted[i].prefix, p) >= 0 })
	var out []prefixIdentity
	for ; i < len(t.sorted) && p.Contains(t.sorted[i].prefix.Addr()); i++ {
		if t.sorted[i].prefix.Bits() >= p.Bits() {
			out = append(out, t.sorted[i])
		}
	}
	return out
}

// longest returns the CIDR identity of the longest policy prefix containing a.
func (t prefixTable) longest(a netip.Addr) (identity.Identity, bool) {
	for bits := a.BitLen(); bits >= 0; bits-- {
		p, err := a.Prefix(bits)
		if err != nil {
			return 0, false
		}
		if id, ok := t.byPrefix[p]; ok {
			return id, true
		}
	}
	return 0, false
}

func prefixInside(inner, outer netip.Prefix) bool {
	return inner.Bits() >= outer.Bits() && outer.Contains(inner.Addr())
}

// clusterReserved are the reserved identities Cilium's "cluster" entity selects besides the
// cluster's endpoints (pkg/policy/api InitEntities; "ingress" has no identity here).
var clusterReserved = []identity.Identity{
	identity.Host, identity.RemoteNode, identity.Init, identity.Health,
	identity.Unmanaged, identity.KubeAPIServer,
}

var entityReserved = map[string]identity.Identity{
	policy.EntityHost:          identity.Host,
	policy.EntityRemoteNode:    identity.RemoteNode,
	policy.EntityHealth:        identity.Health,
	policy.EntityInit:          identity.Init,
	policy.EntityUnmanaged:     identity.Unmanaged,
	policy.EntityKubeAPIServer: identity.KubeAPIServer,
}

// computer holds what Compute derives from its input once and uses for every endpoint.
type computer struct {
	in          *Input
	prefixes    prefixTable
	endpointIDs []identity.Identity // distinct endpoint identities, sorted
	// portsByID is the union of the named ports declared by the endpoints of each endpoint
	// identity; allPorts over all endpoints. Egress named ports resolve against the peer's.
	portsByID map[identity.Identity]namedPortSet
	allPorts  namedPortSet
	// labelsByID holds the distinct label sets of the endpoints of each identity: one,
	// when the identities come from an allocator (an identity stands for a label set).
	labelsByID map[identity.Identity][]labels.Labels
	// prec is the precedence of every Admin and Baseline tier rule, by rule ID (tiers.go).
	prec map[uint32]uint16
}

func newComputer(in *Input) *computer {
	c := &computer{
		in:         in,
		prefixes:   newPrefixTable(in.CIDRIdentities),
		portsByID:  map[identity.Identity]namedPortSet{},
		allPorts:   namedPortSet{},
		labelsByID: map[identity.Identity][]labels.Labels{},
		prec:       tierPrecedence(in),
	}
	for _, ep := range in.Endpoints {
		if !validEndpointIdentity(ep.Identity) || ep.Host {
			continue
		}
		c.addPeer(ep.Identity, ep.Labels, ep.NamedPorts)
	}
	// Remote pods are peers like local endpoints (selected by their labels, and an egress
	// rule's named port resolves against theirs as against a local peer's).
	for _, ep := range in.Remote {
		if !validEndpointIdentity(ep.Identity) {
			continue
		}
		c.addPeer(ep.Identity, ep.Labels, ep.NamedPorts)
	}
	slices.Sort(c.endpointIDs)
	return c
}

// addPeer records a local endpoint or a remote pod, a peer that policy selects by its
// labels and whose named ports an egress rule resolves against: its identity, its labels
// among its identity's, and its named ports.
func (c *computer) addPeer(id identity.Identity, l labels.Labels, ports map[string]NamedPort) {
	set, ok := c.portsByID[id]
	if !ok {
		set = namedPortSet{}
		c.portsByID[id] = set
		c.endpointIDs = append(c.endpointIDs, id)
	}
	if sets := c.labelsByID[id]; !slices.ContainsFunc(sets, func(o labels.Labels) bool { return sameLabels(o, l) }) {
		c.labelsByID[id] = append(sets, l)
	}
	set.add(ports)
	c.allPorts.add(ports)
}

// validEndpointIdentity excludes numbers that must never be used as an endpoint's peer
// identity in a policy key: 0 would mean "every peer", a flagged number a CIDR.
func validEndpointIdentity(id identity.Identity) bool {
	return id != identity.Any && id&identity.EndpointCIDRFlag == 0
}

// preparedRule is a rule with what does not depend on the subject endpoint resolved.
type preparedRule struct {
	rule   *policy.Rule
	peers  []identity.Identity
	static []portKey
	named  []policy.PortRule
}

func (c *computer) prepare(r *policy.Rule) preparedRule {
	pr := preparedRule{rule: r, peers: c.peerIdentities(r)}
	pr.static, pr.named = staticL4(r.Ports, r.Deny)
	return pr
}

// peerIdentities returns the identities a rule's peers select, sorted and distinct.
func (c *computer) peerIdentities(r *policy.Rule) []identity.Identity {
	if r.AllPeers {
		// Any matches every peer, so nothing else is needed (named ports resolve against
		// all endpoints for Any, a superset of any single identity's).
		return []identity.Identity{identity.Any}
	}
	set := map[identity.Identity]bool{}
	for _, p := range r.Peers {
		switch p.Kind {
		case policy.PeerEndpoints:
			// Match label sets, not endpoints: replicas share theirs.
			for _, id := range c.endpointIDs {
				if slices.ContainsFunc(c.labelsByID[id], p.Selector.Matches) {
					set[id] = true
				}
			}
		case policy.PeerCIDR:
			c.cidrPeer(p, set)
		case policy.PeerEntity:
			c.entityPeer(p.Entity, set)
		case policy.PeerCIDRGroup:
			// Set membership is not in the ipcache: the dataplane computes the peer's set
			// mask per packet and looks the policy up with each member set's identity.
			if idx, ok := c.in.CIDRSets[p.Group]; ok {
				if id, ok := CIDRSetIdentity(idx); ok {
					set[id] = true
				}
			}
		}
	}
	out := make([]identity.Identity, 0, len(set))
	for id := range set {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// cidrPeer selects the CIDR identities inside the CIDR and outside every except, both plain
// (remote addresses) and flagged (endpoint and host addresses, through their secondary
// identity). Because the set of policy prefixes contains the CIDR and every except, the
// longest policy prefix of an address is selected exactly when the address is in the CIDR
// and in no except.
func (c *computer) cidrPeer(p policy.Peer, set map[identity.Identity]bool) {
	if !p.CIDR.IsValid() {
		return
	}
	cidr := canonicalPrefix(p.CIDR)
	excepts := make([]netip.Prefix, 0, len(p.Except))
	for _, e := range p.Except {
		if e.IsValid() {
			excepts = append(excepts, canonicalPrefix(e))
		}
	}
next:
	for _, q := range c.prefixes.within(cidr) {
		for _, e := range excepts {
			if prefixInside(q.prefix, e) {
				continue next
			}
		}
		set[q.id] = true
		set[q.id|identity.EndpointCIDRFlag] = true
	}
	// 0.0.0.0/0 in the ipcache is World, not the /0 CIDR identity: World stands for the
	// addresses whose longest policy prefix is 0.0.0.0/0, so it is selected exactly when that
	// prefix is (an IPv4 /0 not itself excepted). ::/0 does not select World: World also
	// stands for IPv4 addresses, which ::/0 does not contain (IPv6 world traffic will need its
	// own reserved identity, as Cilium's world-ipv6).
	if cidr == worldV4 && !slices.Contains(excepts, worldV4) {
		set[identity.World] = true
	}
}

func (c *computer) entityPeer(entity string, set map[identity.Identity]bool) {
	switch entity {
	case policy.EntityAll:
		set[identity.Any] = true
	case policy.EntityWorld:
		// Every address outside the cluster: World and all CIDR identities, plain only, so
		// endpoint and host addresses inside a policy CIDR are not "world".
		set[identity.World] = true
		for _, q := range c.prefixes.sorted {
			set[q.id] = true
		}
	case policy.EntityCluster:
		for _, id := range c.endpointIDs {
			set[id] = true
		}
		for _, id := range clusterReserved {
			set[id] = true
		}
	case policy.EntityIngress:
		// Cilium's ingress entity is its L7 ingress proxy; Rampart has none yet, so
		// nothing has that identity and the entity selects nothing.
	default:
		if id, ok := entityReserved[entity]; ok {
			set[id] = true
		}
	}
}

// Compute returns the desired dataplane state for the input: per endpoint the enforcement
// flags and policy entries, the ipcache, and the L7 proxy's rules. See docs/architecture.md
// for the semantics.
//
// L7: an allow rule's L7 port rule (one TCP port with HTTP rules) yields Redirect entries
// for its peers. A Redirect entry wins over a plain allow of the same key and loses to a
// deny; see Lookup for how the dataplane combines its lookups. For every endpoint,
// direction and port that has a Redirect entry left, State.L7 lists every allow rule that
// matches TCP traffic to that port, with the peers it matches and the requests it allows
// there: the rule's HTTP rules, or every request for a rule that allows the port without
// L7 rules (so a plain allow that meets a redirect keeps allowing everything, now through
// the proxy).
func Compute(in Input) State {
	st, _ := ComputeWith(in, nil)
	return st
}

// Memo is what ComputeWith keeps of one computation to spare the next one work. It is
// never modified once returned, so an older one stays valid.
type Memo struct {
	env  memoEnv
	byID map[uint32]memoEndpoint
}

// memoEnv is everything besides the endpoint itself that an endpoint's policy depends
// on: the rules, the peer identities each selects, the named ports of those identities,
// the CIDR identities and sets.
type memoEnv struct {
	rules     []policy.Rule
	peers     [][]identity.Identity
	portsByID map[identity.Identity]namedPortSet
	allPorts  namedPortSet
	cidrIDs   map[netip.Prefix]identity.Identity
	cidrSets  map[string]uint8
	hostIPs   []netip.Addr
}

// memoEndpoint is the policy computed for an endpoint, with what it was computed from.
type memoEndpoint struct {
	labels labels.Labels
	ports  map[string]NamedPort
	audit  bool
	pol    EndpointPolicy
	l7     []L7Rule
	dns    []DNSRule
}

// ComputeWith is Compute, reusing what memo (from an earlier ComputeWith; nil: none)
// computed where nothing it depends on changed, and returns the memo for the next call.
// When the environment (rules, the identities their peers select and the named ports of
// those, CIDR identities and sets, host addresses) is as before, an endpoint with the same
// ID, labels and named ports gets its earlier policy, the same map, without computing it
// again. So a change of one endpoint that brings no new identity or named port computes
// one endpoint's policy, not the node's.
func ComputeWith(in Input, memo *Memo) (State, *Memo) {
	c := newComputer(&in)
	rules := make([]preparedRule, len(in.Rules))
	env := memoEnv{
		rules: in.Rules, peers: make([][]identity.Identity, len(in.Rules)),
		portsByID: c.portsByID, allPorts: c.allPorts,
		cidrIDs: in.CIDRIdentities, cidrSets: in.CIDRSets, hostIPs: in.HostIPs,
	}
	for i := range in.Rules {
		rules[i] = c.prepare(&in.Rules[i])
		env.peers[i] = rules[i].peers
	}
	enforced := enforcedRules(rules)
	reuse := memo != nil && memo.env.equal(&env)
	next := &Memo{env: env, byID: make(map[uint32]memoEndpoint, len(in.Endpoints))}
	st := State{
		Endpoints: make(map[uint32]EndpointPolicy, len(in.Endpoints)),
		IPCache:   c.ipcache(),
	}
	for _, ep := range in.Endpoints {
		me, ok := memoEndpoint{}, false
		if reuse {
			me, ok = memo.byID[ep.ID]
			ok = ok && sameLabels(me.labels, ep.Labels) && maps.Equal(me.ports, ep.NamedPorts) && me.audit == ep.Audit
		}
		if !ok {
			pol := c.policyOf(ep, rules, enforced)
			l7rules := enforced
			if ep.Audit {
				l7rules = nil
			}
			me = memoEndpoint{labels: ep.Labels, ports: ep.NamedPorts, audit: ep.Audit, pol: pol,
				l7: c.l7Rules(ep, l7rules, pol), dns: c.dnsRules(ep, l7rules, pol)}
		}
		next.byID[ep.ID] = me
		st.Endpoints[ep.ID] = me.pol
		st.L7 = append(st.L7, me.l7...)
		st.DNS = append(st.DNS, me.dns...)
	}
	sortProxyRules(st.L7)
	sortProxyRules(st.DNS)
	return st, next
}

// enforcedRules is rules without the rules in audit mode (rules itself when it has none).
func enforcedRules(rules []preparedRule) []preparedRule {
	if !slices.ContainsFunc(rules, func(pr preparedRule) bool { return pr.rule.Audit }) {
		return rules
	}
	return slices.DeleteFunc(slices.Clone(rules), func(pr preparedRule) bool { return pr.rule.Audit })
}

// policyOf is ep's policy: from the enforced rules (enforcedRules of rules), and, when a
// rule in audit mode applies to ep, its Audit policy from all of rules. Audited rules
// so never change what the enforced policy allows or drops.
//
// An endpoint in audit mode (Endpoint.Audit) takes every rule as audited.
func (c *computer) policyOf(ep Endpoint, rules, enforced []preparedRule) EndpointPolicy {
	if ep.Audit {
		enforced = nil
	}
	pol := c.endpointPolicy(ep, enforced)
	if len(enforced) < len(rules) && slices.ContainsFunc(rules, func(pr preparedRule) bool { return (pr.rule.Audit || ep.Audit) && pr.applies(ep) }) {
		audit := c.endpointPolicy(ep, rules)
		pol.Audit = &audit
	}
	return pol
}

// sameLabels compares two label sets, at once when they are one map: callers that give
// the endpoints of one label set the same map (the agent does) spare the comparison.
func sameLabels(a, b labels.Labels) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer() || maps.Equal(a, b)
}

// equal compares two environments. The rules are plain data, compared deeply: their count
// does not grow with the endpoints.
func (e *memoEnv) equal(o *memoEnv) bool {
	return reflect.DeepEqual(e.rules, o.rules) && reflect.DeepEqual(e.peers, o.peers) &&
		reflect.DeepEqual(e.portsByID, o.portsByID) && reflect.DeepEqual(e.allPorts, o.allPorts) &&
		maps.Equal(e.cidrIDs, o.cidrIDs) && maps.Equal(e.cidrSets, o.cidrSets) && slices.Equal(e.hostIPs, o.hostIPs)
}

// ruleKeys returns a function giving the keys rule pr yields at endpoint ep for a peer
// identity. own caches ep's named ports for ingress rules.
func (c *computer) ruleKeys(ep Endpoint, pr preparedRule, own *namedPortSet) func(identity.Identity) []portKey {
	if len(pr.named) == 0 {
		return func(identity.Identity) []portKey { return pr.static }
	}
	if pr.rule.Direction == policy.Ingress {
		// Ingress: the port is the subject's own, whoever the peer is.
		if *own == nil {
			*own = namedPortSet{}
			own.add(ep.NamedPorts)
		}
		keys := append(slices.Clip(pr.static), resolveNamed(pr.named, *own, pr.rule.Deny)...)
		return func(identity.Identity) []portKey { return keys }
	}
	return func(id identity.Identity) []portKey {
		return append(slices.Clip(pr.static), resolveNamed(pr.named, c.portsFor(id), pr.rule.Deny)...)
	}
}

// applies reports whether the rule has a say on ep's traffic (enforcement aside).
func (pr preparedRule) applies(ep Endpoint) bool {
	r := pr.rule
	return (r.Direction == policy.Ingress || r.Direction == policy.Egress) && r.Host == ep.Host && r.Subject.Matches(ep.Labels)
}

func (c *computer) endpointPolicy(ep Endpoint, rules []preparedRule) EndpointPolicy {
	pol := EndpointPolicy{Entries: map[Key]Value{}}
	var own namedPortSet
	for _, pr := range rules {
		r := pr.rule
		if r.Tier != policy.TierNetworkPolicy || !pr.applies(ep) {
			continue
		}
		if r.EnableDefaultDeny {
			if r.Direction == policy.Ingress {
				pol.EnforceIngress = true
			} else {
				pol.EnforceEgress = true
			}
		}
		if len(pr.peers) == 0 {
			continue
		}
		keysFor := c.ruleKeys(ep, pr, &own)
		for _, id := range pr.peers {
			for _, p := range keysFor(id) {
				addEntry(pol.Entries, Key{
					Identity: id, Direction: r.Direction,
					Protocol: p.proto, Port: p.port, PortPrefixLen: p.plen,
				}, Value{Deny: r.Deny, RuleID: r.ID, Redirect: p.redirect, DNS: p.redirect && p.dns != nil})
			}
		}
	}
	if c.in.AllowHost && pol.EnforceIngress && !ep.Host {
		// Before the deny pass: a deny rule that matches the host still wins.
		addEntry(pol.Entries, Key{Identity: identity.Host, Direction: policy.Ingress, Protocol: policy.ProtoAny},
			Value{RuleID: HostTrafficRuleID})
	}
	applyDenyPrecedence(pol.Entries)
	c.tierEntries(ep, rules, &pol)
	return pol
}

// portsFor returns the named ports an egress rule resolves against for a peer identity: the
// union over the endpoints with that identity, or over all endpoints for any other peer
// (Any, reserved, CIDR), which may be any of them.
func (c *computer) portsFor(id identity.Identity) namedPortSet {
	if set, ok := c.portsByID[id]; ok {
		return set
	}
	return c.allPorts
}

// rank orders entry actions as the dataplane combines them: deny > redirect > allow.
func (v Value) rank() int {
	switch {
	case v.Deny:
		return 3
	case v.Redirect:
		return 2
	case v.Pass:
		return 0
	}
	return 1
}

// addEntry merges v into the entry for k: deny beats redirect, which beats allow, and among
// equals the lowest rule ID is kept so the result does not depend on rule order.
//
// Two redirects of one key merge their proxies: DNS from either makes it DNS (see
// mergeKey).
func addEntry(entries map[Key]Value, k Key, v Value) {
	if v.Deny {
		v.Redirect, v.DNS = false, false
	}
	old, ok := entries[k]
	if ok && old.Redirect && v.Redirect {
		old.DNS = old.DNS || v.DNS
		v.DNS = old.DNS
		entries[k] = old
	}
	if ok && (old.rank() > v.rank() || old.rank() == v.rank() && old.RuleID <= v.RuleID) {
		return
	}
	entries[k] = v
}

// covers reports whether every packet matched by k is matched by d (both of one identity and
// direction).
func covers(d, k Key) bool {
	if d.Protocol == policy.ProtoAny {
		return true
	}
	return d.Protocol == k.Protocol && d.PortPrefixLen <= k.PortPrefixLen &&
		k.Port&portMask(d.PortPrefixLen) == d.Port
}

// applyDenyPrecedence turns every allow or redirect entry covered by a deny entry of the same
// identity and direction into that deny (the covering deny with the lowest rule ID). The
// dataplane's LPM lookup returns the longest matching entry, which may be a longer allow
// inside a shorter deny; after this pass the longest match is a deny whenever any matching
// entry of that identity is.
//
// Redirect entries need no such pass against allows: they are always one TCP port (prefix
// length 16), so no other entry lies inside one except an equal key, which addEntry already
// merged; and a redirect inside a broader allow is the longest match, as it must be
// (redirect beats allow).
func applyDenyPrecedence(entries map[Key]Value) {
	type group struct {
		id  identity.Identity
		dir policy.Direction
	}
	denies := map[group][]Key{}
	for k, v := range entries {
		if v.Deny {
			g := group{k.Identity, k.Direction}
			denies[g] = append(denies[g], k)
		}
	}
	if len(denies) == 0 {
		return
	}
	for k, v := range entries {
		if v.Deny {
			continue
		}
		var best Value
		found := false
		for _, d := range denies[group{k.Identity, k.Direction}] {
			if dv := entries[d]; covers(d, k) && (!found || dv.RuleID < best.RuleID) {
				best, found = dv, true
			}
		}
		if found {
			entries[k] = best
		}
	}
}

// ipcache builds the address-to-identity map: policy prefixes to their CIDR identities, the
// /0 prefixes to World, and endpoint (IPv4 and IPv6) and host addresses to their
// identities with the flagged CIDR identity of the longest policy prefix containing them.
func (c *computer) ipcache() map[netip.Prefix]IPCacheEntry {
	m := make(map[netip.Prefix]IPCacheEntry, len(c.prefixes.sorted)+2*len(c.in.Endpoints)+len(c.in.HostIPs)+2)
	for _, q := range c.prefixes.sorted {
		m[q.prefix] = IPCacheEntry{Identity: q.id}
	}
	m[worldV4] = IPCacheEntry{Identity: identity.World}
	m[worldV6] = IPCacheEntry{Identity: identity.World}
	for _, a := range c.in.HostIPs {
		if a.IsValid() {
			a = a.Unmap()
			m[netip.PrefixFrom(a, a.BitLen())] = IPCacheEntry{Identity: identity.Host, Secondary: c.secondary(a)}
		}
	}
	for _, a := range c.in.NodeIPs {
		if a.IsValid() {
			a = a.Unmap()
			m[netip.PrefixFrom(a, a.BitLen())] = IPCacheEntry{Identity: identity.RemoteNode, Secondary: c.secondary(a)}
		}
	}
	for _, ep := range c.in.Remote {
		for _, a := range []netip.Addr{ep.IP, ep.IP6} {
			if a.IsValid() {
				a = a.Unmap()
				m[netip.PrefixFrom(a, a.BitLen())] = IPCacheEntry{Identity: ep.Identity, Secondary: c.secondary(a), TunnelEndpoint: ep.Node.Unmap()}
			}
		}
	}
	// Local endpoints after hosts and remote pods: an address that is both is a local
	// endpoint's.
	for _, ep := range c.in.Endpoints {
		if ep.Host {
			continue
		}
		for _, a := range []netip.Addr{ep.IP, ep.IP6} {
			if a.IsValid() {
				a = a.Unmap()
				m[netip.PrefixFrom(a, a.BitLen())] = IPCacheEntry{Identity: ep.Identity, Secondary: c.secondary(a), EndpointID: ep.ID}
			}
		}
	}
	return m
}

func (c *computer) secondary(a netip.Addr) identity.Identity {
	if id, ok := c.prefixes.longest(a); ok {
		return id | identity.EndpointCIDRFlag
	}
	return 0
}
