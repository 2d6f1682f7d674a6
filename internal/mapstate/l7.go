package mapstate

import (
	"fmt"
	"slices"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// l7Rules lists the L7 rules of endpoint ep, whose policy entries are pol (see Compute).
func (c *computer) l7Rules(ep Endpoint, rules []preparedRule, pol EndpointPolicy) []L7Rule {
	// The proxy sees only connections the dataplane redirects: those to ports with a
	// Redirect entry left after deny precedence, unless the Any lookup (made for every
	// connection) denies the port. Redirect keys are always one TCP port.
	ports := map[policy.Direction][]uint16{}
	for k, v := range pol.Entries {
		if v.Redirect && !v.DNS && !slices.Contains(ports[k.Direction], k.Port) && !denied(pol, identity.Any, k.Direction, k.Port) {
			ports[k.Direction] = append(ports[k.Direction], k.Port)
		}
	}
	if len(ports) == 0 {
		return nil
	}
	var out []L7Rule
	index := map[string]int{} // (direction, port, rule, HTTP rules) -> position in out
	var own namedPortSet
	for _, pr := range rules {
		r := pr.rule
		dirPorts := ports[r.Direction]
		if r.Deny || r.Tier != policy.TierNetworkPolicy || len(pr.peers) == 0 || len(dirPorts) == 0 || !pr.applies(ep) {
			continue
		}
		keysFor := c.ruleKeys(ep, pr, &own)
		for _, id := range pr.peers {
			keys := keysFor(id)
			for _, port := range dirPorts {
				http, ok := httpAt(keys, port)
				if !ok {
					continue
				}
				// A peer identity whose own lookup denies this port is dropped by the
				// dataplane whatever else matches, so it never reaches the proxy.
				if denied(pol, id, r.Direction, port) {
					continue
				}
				gk := fmt.Sprintf("%d/%d/%d/%q", r.Direction, port, r.ID, http)
				i, seen := index[gk]
				if !seen {
					i = len(out)
					index[gk] = i
					out = append(out, L7Rule{
						EndpointID: ep.ID, Direction: r.Direction, Port: port,
						HTTP: cloneHTTP(http), RuleID: r.ID,
					})
				}
				// pr.peers is sorted, so Peers is too.
				out[i].Peers = append(out[i].Peers, id)
			}
		}
	}
	return out
}

// denied reports whether the dataplane's lookup for identity id finds a deny for TCP
// connections to port.
func denied(pol EndpointPolicy, id identity.Identity, dir policy.Direction, port uint16) bool {
	_, v, found := lookupPolicy(pol.Entries, id, dir, policy.ProtoTCP, port)
	return found && v.Deny
}

// httpAt returns what a rule whose keys (for one peer) are keys allows on TCP connections
// to port: ok is false when no key matches the port; else the requests are the union of
// the HTTP rules of its redirect key for the port, or every request when a plain key (the
// port, a range or prefix around it, all ports, any protocol) matches.
func httpAt(keys []portKey, port uint16) (http []policy.HTTPRule, ok bool) {
	pkt := Key{Protocol: policy.ProtoTCP, Port: port, PortPrefixLen: 16}
	for _, k := range keys {
		if !covers(Key{Protocol: k.proto, Port: k.port, PortPrefixLen: k.plen}, pkt) {
			continue
		}
		if !k.redirect {
			return allowAllHTTP, true
		}
		if k.dns != nil {
			continue // steered to the DNS proxy, not the HTTP proxy
		}
		http, ok = unionHTTP(http, k.http), true
	}
	return http, ok
}

// cloneHTTP copies HTTP rules, so that no two L7 rules (or the parser's rules) share
// storage.
func cloneHTTP(hs []policy.HTTPRule) []policy.HTTPRule {
	out := make([]policy.HTTPRule, len(hs))
	for i, h := range hs {
		h.Headers = slices.Clone(h.Headers)
		out[i] = h
	}
	return out
}

// l7For returns the L7 rules the proxy applies to a connection at endpoint epID in
// direction dir to port, from a peer with the given identities (its identity, Any and its
// secondary identity, as the dataplane looks them up): those whose peers contain one of
// them. A request passes if it matches one of their HTTP rules.
func l7For(st State, epID uint32, dir policy.Direction, port uint16, ids []identity.Identity) []L7Rule {
	return proxyRulesFor(st.L7, proxyRuleKey{endpoint: epID, kind: uint8(dir), port: port}, ids)
}
