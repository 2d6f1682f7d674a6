package mapstate

import (
	"cmp"
	"slices"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// ClusterNetworkPolicy tiers (docs/policy-language.md, "ClusterNetworkPolicy"). A packet is
// judged by the Admin tier first, then by the NetworkPolicy tier (NetworkPolicy and Cilium
// policies) and, for an endpoint that tier does not isolate in the packet's direction, by
// the Baseline tier. Within the Admin and Baseline tiers the first rule that matches
// decides: Accept, Deny, or Pass (on to the next tier).
//
// The dataplane looks up several identities per packet (the peer's, Any, its flagged CIDR
// identity, its CIDR sets) and several port prefixes per identity, so "the first rule that
// matches" is carried by a precedence on every entry (Value.Prec: 1 + the rule's place in
// its tier's order; 0 for the NetworkPolicy tier): of all entries a packet's lookups find,
// the one with the lowest precedence value decides, the action breaking ties. Admin
// entries are looked up in a round of their own (Key.Admin), which decides on an Accept or
// a Deny; the other round holds the NetworkPolicy tier's entries (precedence 0) and the
// Baseline tier's, which therefore lose to every NetworkPolicy-tier entry.

// tierPrecedence numbers the rules of the Admin and Baseline tiers in evaluation order:
// priority, then policy (by its key, for rules of equal priority in different policies,
// whose order the API leaves to the implementation), then rule order within the policy.
// The first rule gets 1.
func tierPrecedence(in *Input) map[uint32]uint16 {
	type ranked struct {
		r   *policy.Rule
		pol string
	}
	var rs []ranked
	for i := range in.Rules {
		r := &in.Rules[i]
		if r.Tier == policy.TierNetworkPolicy {
			continue
		}
		ref := in.RulePolicies[r.ID]
		rs = append(rs, ranked{r, string(ref.Kind) + "/" + ref.Namespace + "/" + ref.Name})
	}
	if len(rs) == 0 {
		return nil
	}
	slices.SortStableFunc(rs, func(a, b ranked) int {
		return cmp.Or(cmp.Compare(a.r.Tier, b.r.Tier), cmp.Compare(a.r.Priority, b.r.Priority),
			cmp.Compare(a.pol, b.pol), cmp.Compare(a.r.Index, b.r.Index))
	})
	out := make(map[uint32]uint16, len(rs))
	next := map[policy.Tier]int{}
	for _, x := range rs {
		next[x.r.Tier]++
		out[x.r.ID] = uint16(min(next[x.r.Tier], MaxTierRules))
	}
	return out
}

// MaxTierRules is how many rules one tier may hold (Value.Prec is 16 bits, 0 reserved).
const MaxTierRules = 1<<16 - 1

// tierEntries adds endpoint ep's Admin entries, and its Baseline entries for the
// directions pol does not enforce, to pol, then makes every longest match carry the best
// entry that covers it.
func (c *computer) tierEntries(ep Endpoint, rules []preparedRule, pol *EndpointPolicy) {
	if len(c.prec) == 0 {
		return
	}
	var own namedPortSet
	for _, pr := range rules {
		r := pr.rule
		if r.Tier == policy.TierNetworkPolicy || !pr.applies(ep) {
			continue
		}
		if r.Direction == policy.Egress && slices.ContainsFunc(r.Peers, func(p policy.Peer) bool { return p.Kind == policy.PeerFQDN }) {
			// domainNames: the endpoint's DNS answers must be learnt, whatever rule
			// lets its queries out (see EndpointPolicy.DNSObserve).
			pol.DNSObserve = true
		}
		if len(pr.peers) == 0 {
			continue
		}
		if r.Tier == policy.TierBaseline && (r.Direction == policy.Ingress && pol.EnforceIngress || r.Direction == policy.Egress && pol.EnforceEgress) {
			continue // the NetworkPolicy tier isolates this direction: it decides
		}
		keysFor := c.ruleKeys(ep, pr, &own)
		v := Value{Deny: r.Deny, Pass: r.Pass, RuleID: r.ID, Prec: c.prec[r.ID]}
		for _, id := range pr.peers {
			for _, p := range keysFor(id) {
				addTierEntry(pol.Entries, Key{Admin: r.Tier == policy.TierAdmin, Identity: id, Direction: r.Direction,
					Protocol: p.proto, Port: p.port, PortPrefixLen: p.plen}, v)
			}
		}
	}
	applyPrecedence(pol.Entries)
}

// beats says whether entry value v decides over w when both match a packet: a lower
// precedence value, or the same and a higher action (deny > redirect > allow > pass).
func (v Value) beats(w Value) bool {
	if v.Prec != w.Prec {
		return v.Prec < w.Prec
	}
	return v.rank() > w.rank()
}

// addTierEntry keeps, for key k, the better of the entry there and v.
func addTierEntry(entries map[Key]Value, k Key, v Value) {
	if old, ok := entries[k]; ok && !v.beats(old) {
		return
	}
	entries[k] = v
}

// applyPrecedence gives every entry the value of the best entry covering it (same
// identity, direction and round, a shorter port prefix or any protocol) when that one
// beats it: the dataplane's LPM lookup returns the longest matching entry, which must then
// be the one that decides among all entries of its identity that match the packet.
// applyDenyPrecedence is the special case where every precedence is 0.
func applyPrecedence(entries map[Key]Value) {
	type group struct {
		admin bool
		id    identity.Identity
		dir   policy.Direction
	}
	// Only entries that can beat another entry of their group cover anything: a deny, or
	// an entry with a precedence above the NetworkPolicy tier's.
	strong := map[group][]Key{}
	for k, v := range entries {
		if v.Deny || v.Prec > 0 {
			g := group{k.Admin, k.Identity, k.Direction}
			strong[g] = append(strong[g], k)
		}
	}
	if len(strong) == 0 {
		return
	}
	updated := map[Key]Value{}
	for k, v := range entries {
		best, found := v, false
		for _, d := range strong[group{k.Admin, k.Identity, k.Direction}] {
			if d == k || !covers(d, k) {
				continue
			}
			if dv := entries[d]; dv.beats(best) || dv == best && found {
				best, found = dv, true
			}
		}
		if found && best != v {
			updated[k] = best
		}
	}
	for k, v := range updated {
		entries[k] = v
	}
}
