package mapstate

import (
	"net/netip"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// Verdict is the outcome of a policy decision.
type Verdict string

const (
	Allowed Verdict = "allowed"
	Denied  Verdict = "denied"
	// Redirected: allowed only through the L7 proxy, which checks each request against
	// Decision.L7 (requests that match none are refused with HTTP 403).
	Redirected Verdict = "redirected"
)

// Reason says why a decision came out as it did.
type Reason string

const (
	ReasonAllowedByRule   Reason = "allowed-by-rule"
	ReasonRedirected      Reason = "redirected-to-proxy" // an L7 rule applies: the proxy decides each request
	ReasonDeniedByRule    Reason = "denied-by-rule"
	ReasonDefaultDeny     Reason = "default-deny"     // enforced direction, no rule allows
	ReasonNoEnforcement   Reason = "no-enforcement"   // no rule matched, direction not enforced
	ReasonUnknownEndpoint Reason = "unknown-endpoint" // no state for the endpoint: dropped
)

// Decision is the result of Lookup.
type Decision struct {
	Verdict Verdict `json:"verdict"`
	Reason  Reason  `json:"reason"`
	// RuleID is the rule of the deciding entry (0 when no entry decided).
	RuleID uint32 `json:"ruleID,omitempty"`
	// Tier is the ClusterNetworkPolicy tier of the deciding entry, "Admin" or "Baseline";
	// "" for the NetworkPolicy tier or no entry.
	Tier string `json:"tier,omitempty"`
	// Entry is the deciding policy entry, nil when no entry decided.
	Entry *Key `json:"entry,omitempty"`
	// Identity and Secondary are the peer's identities from the ipcache; Prefix is the
	// ipcache prefix that matched the peer's address.
	Identity  identity.Identity `json:"identity"`
	Secondary identity.Identity `json:"secondary,omitempty"`
	Prefix    netip.Prefix      `json:"prefix"`
	// CIDRSets is the peer's CIDR set mask (bit i: its address is in set i), as given to
	// LookupSets.
	CIDRSets uint32 `json:"cidrSets,omitempty"`
	// L7 holds, for a Redirected decision, the L7 rules the proxy applies to the
	// connection's requests (from State.L7: this endpoint, direction and port, and peers
	// containing the peer's identity, Any or the secondary identity). A request passes if
	// it matches one of their HTTP rules.
	L7 []L7Rule `json:"l7,omitempty"`
}

// LookupIPCache returns the longest ipcache entry containing a, as the dataplane's LPM
// lookup does. An address no entry contains (impossible with the /0 entries Compute adds) is
// World.
func LookupIPCache(ipcache map[netip.Prefix]IPCacheEntry, a netip.Addr) (IPCacheEntry, netip.Prefix) {
	a = a.Unmap()
	for bits := a.BitLen(); bits >= 0; bits-- {
		p, err := a.Prefix(bits)
		if err != nil {
			break
		}
		if e, ok := ipcache[p]; ok {
			return e, p
		}
	}
	return IPCacheEntry{Identity: identity.World}, netip.Prefix{}
}

// lookupPolicy is one LPM lookup of the policy map for one identity: the longest entry for
// this protocol whose port prefix matches, else the any-protocol entry.
func lookupPolicy(entries map[Key]Value, id identity.Identity, dir policy.Direction, proto policy.Protocol, port uint16) (Key, Value, bool) {
	return lookupRound(entries, false, id, dir, proto, port)
}

// lookupRound is lookupPolicy in the Admin tier's entries (admin) or the others.
func lookupRound(entries map[Key]Value, admin bool, id identity.Identity, dir policy.Direction, proto policy.Protocol, port uint16) (Key, Value, bool) {
	if proto != policy.ProtoAny {
		for plen := 16; plen >= 0; plen-- {
			k := Key{Admin: admin, Identity: id, Direction: dir, Protocol: proto, Port: port & portMask(uint8(plen)), PortPrefixLen: uint8(plen)}
			if v, ok := entries[k]; ok {
				return k, v, true
			}
		}
	}
	k := Key{Admin: admin, Identity: id, Direction: dir, Protocol: policy.ProtoAny}
	v, ok := entries[k]
	return k, v, ok
}

// hasAdmin says whether pol has Admin tier entries for dir (the dataplane's EP_ADMIN_*
// flags).
func hasAdmin(pol EndpointPolicy, dir policy.Direction) bool {
	for k := range pol.Entries {
		if k.Admin && k.Direction == dir {
			return true
		}
	}
	return false
}

// decideRound does one round of lookups for ids, as the dataplane's policy_round: the
// entry that beats the others decides, ties to the earlier lookup.
func decideRound(entries map[Key]Value, admin bool, ids []identity.Identity, dir policy.Direction, proto policy.Protocol, port uint16) (Key, Value, bool) {
	var bestKey Key
	var bestVal Value
	found := false
	for _, id := range ids {
		k, v, ok := lookupRound(entries, admin, id, dir, proto, port)
		if !ok || found && !v.beats(bestVal) {
			continue
		}
		bestKey, bestVal, found = k, v, true
	}
	return bestKey, bestVal, found
}

// Lookup decides a new flow at endpoint epID exactly as the dataplane does. peer is the
// other end's address (the source for ingress, the destination for egress); port is the
// destination port (the ICMP type for ICMP).
//
// The peer's identity and secondary identity come from the ipcache (LPM). The policy map is
// looked up for the peer identity, for Any, and for the secondary identity if there is one.
// Of the results, the entry with the lowest precedence value (Value.Prec: 0 for the
// NetworkPolicy tier) decides, and among equals deny > redirect > allow > pass: a deny
// denies, a redirect sends the flow to the L7 proxy (Decision.L7 lists the L7 rules the
// proxy then applies), an allow allows; ties go to the first lookup in that order. Admin
// tier entries (ClusterNetworkPolicy) are looked up first, in a round of their own that
// decides on an allow (Accept) or a deny; after a Pass, or no match, the other entries
// decide, where a Pass is no decision. With no decision the flow is denied if the endpoint
// enforces the direction and allowed if not. An endpoint without state is denied (fail
// closed).
func Lookup(st State, epID uint32, dir policy.Direction, peer netip.Addr, proto policy.Protocol, port uint16) Decision {
	return LookupSets(st, epID, dir, peer, 0, proto, port)
}

// LookupSets is Lookup for a peer whose address is in the CIDR sets of mask sets (bit i:
// set i; see Input.CIDRSetMembership). After the peer identity, Any and the secondary
// identity, the policy map is looked up with identity.CIDRSet(i) for every set bit i in
// ascending order, and those results join the same combination (deny > redirect > allow,
// ties to the earlier lookup), as the dataplane does.
func LookupSets(st State, epID uint32, dir policy.Direction, peer netip.Addr, sets uint32, proto policy.Protocol, port uint16) Decision {
	entry, prefix := LookupIPCache(st.IPCache, peer)
	d := Decision{Identity: entry.Identity, Secondary: entry.Secondary, Prefix: prefix, CIDRSets: sets}
	ep, ok := st.Endpoints[epID]
	if !ok {
		d.Verdict, d.Reason = Denied, ReasonUnknownEndpoint
		return d
	}
	ids := []identity.Identity{entry.Identity, identity.Any}
	if entry.Secondary != 0 {
		ids = append(ids, entry.Secondary)
	}
	for i := range uint8(MaxCIDRSets) {
		if sets&(1<<i) != 0 {
			ids = append(ids, identity.CIDRSet(i))
		}
	}
	// With Admin tier entries, their round decides on an Accept or a Deny; a Pass or no
	// match goes on to the other entries, where a Pass is no decision.
	bestKey, bestVal, found := Key{}, Value{}, false
	if hasAdmin(ep, dir) {
		bestKey, bestVal, found = decideRound(ep.Entries, true, ids, dir, proto, port)
		found = found && !bestVal.Pass
	}
	if !found {
		bestKey, bestVal, found = decideRound(ep.Entries, false, ids, dir, proto, port)
		found = found && !bestVal.Pass
	}
	switch {
	case found && bestKey.Admin:
		d.Tier = policy.TierAdmin.String()
	case found && bestVal.Prec > 0:
		d.Tier = policy.TierBaseline.String()
	}
	switch {
	case found && bestVal.Deny:
		d.Verdict, d.Reason, d.RuleID, d.Entry = Denied, ReasonDeniedByRule, bestVal.RuleID, &bestKey
	case found && bestVal.Redirect:
		d.Verdict, d.Reason, d.RuleID, d.Entry = Redirected, ReasonRedirected, bestVal.RuleID, &bestKey
		d.L7 = l7For(st, epID, dir, port, ids)
	case found:
		d.Verdict, d.Reason, d.RuleID, d.Entry = Allowed, ReasonAllowedByRule, bestVal.RuleID, &bestKey
	case dir == policy.Ingress && ep.EnforceIngress, dir == policy.Egress && ep.EnforceEgress:
		d.Verdict, d.Reason = Denied, ReasonDefaultDeny
	default:
		d.Verdict, d.Reason = Allowed, ReasonNoEnforcement
	}
	return d
}
