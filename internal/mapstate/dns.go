package mapstate

import (
	"fmt"
	"slices"

	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// dnsPort is one (protocol, port) of an endpoint's egress that its entries steer to the DNS
// proxy.
type dnsPort struct {
	proto policy.Protocol
	port  uint16
}

// dnsRules lists the DNS rules of endpoint ep, whose policy entries are pol: for every
// egress protocol and port with a DNS redirect entry left after deny precedence, every
// allow rule that matches queries to it, with the servers (peers) it matches and the names
// it allows; a plain allow of the port allows every name, as a plain allow that meets an
// HTTP redirect allows every request.
func (c *computer) dnsRules(ep Endpoint, rules []preparedRule, pol EndpointPolicy) []DNSRule {
	var ports []dnsPort
	for k, v := range pol.Entries {
		dp := dnsPort{k.Protocol, k.Port}
		if v.Redirect && v.DNS && k.Direction == policy.Egress && !slices.Contains(ports, dp) && !deniedProto(pol, identity.Any, dp) {
			ports = append(ports, dp)
		}
	}
	if len(ports) == 0 {
		return nil
	}
	var out []DNSRule
	index := map[string]int{}
	var own namedPortSet
	for _, pr := range rules {
		r := pr.rule
		// Tier rules (ClusterNetworkPolicy) never steer to a proxy: an Accept decides
		// before the NetworkPolicy tier's redirect is looked at, a Pass hands over to it.
		if r.Deny || r.Tier != policy.TierNetworkPolicy || r.Direction != policy.Egress || len(pr.peers) == 0 || !pr.applies(ep) {
			continue
		}
		keysFor := c.ruleKeys(ep, pr, &own)
		for _, id := range pr.peers {
			keys := keysFor(id)
			for _, dp := range ports {
				sels, ok := dnsAt(keys, dp)
				if !ok || deniedProto(pol, id, dp) {
					continue
				}
				gk := fmt.Sprintf("%d/%d/%d/%v", dp.proto, dp.port, r.ID, sels)
				i, seen := index[gk]
				if !seen {
					i = len(out)
					index[gk] = i
					out = append(out, DNSRule{
						EndpointID: ep.ID, Protocol: dp.proto, Port: dp.port,
						Selectors: slices.Clone(sels), RuleID: r.ID,
					})
				}
				out[i].Peers = append(out[i].Peers, id)
			}
		}
	}
	return out
}

// deniedProto reports whether the dataplane's lookup for identity id finds a deny for
// egress traffic of dp.
func deniedProto(pol EndpointPolicy, id identity.Identity, dp dnsPort) bool {
	_, v, found := lookupPolicy(pol.Entries, id, policy.Egress, dp.proto, dp.port)
	return found && v.Deny
}

// dnsAt returns the names a rule whose keys (for one peer) are keys allows queries for on
// dp: ok is false when no key matches; else the union of the selectors of its DNS
// redirect keys for dp, or every name when a plain key matches.
func dnsAt(keys []portKey, dp dnsPort) (sels []fqdn.Selector, ok bool) {
	pkt := Key{Protocol: dp.proto, Port: dp.port, PortPrefixLen: 16}
	for _, k := range keys {
		if !covers(Key{Protocol: k.proto, Port: k.port, PortPrefixLen: k.plen}, pkt) {
			continue
		}
		if !k.redirect {
			return allowAllDNS, true
		}
		if k.dns == nil {
			continue
		}
		sels, ok = unionDNS(sels, k.dns), true
	}
	return sels, ok
}

// DNSFor returns the DNS rules that apply to a query from endpoint epID over proto to a
// server on port whose identities (its own, Any and its secondary identity, as the
// dataplane looks them up) are ids. The query may go if one of their selectors matches its
// name; no rule: the dataplane would not have steered it, and the proxy refuses it.
func DNSFor(st State, epID uint32, proto policy.Protocol, port uint16, ids []identity.Identity) []DNSRule {
	return proxyRulesFor(st.DNS, proxyRuleKey{endpoint: epID, kind: uint8(proto), port: port}, ids)
}
