package mapstate

import (
	"cmp"
	"slices"

	"github.com/rampartnet/rampart/internal/identity"
)

// proxyRuleKey is what DNS and L7 rules, the rules of the proxies, are ordered and looked
// up by: the endpoint, the kind (a DNS rule's protocol, an L7 rule's direction), the
// port, the rule ID and the peers.
type proxyRuleKey struct {
	endpoint uint32
	kind     uint8
	port     uint16
	rule     uint32
	peers    []identity.Identity
}

func (r DNSRule) key() proxyRuleKey {
	return proxyRuleKey{r.EndpointID, uint8(r.Protocol), r.Port, r.RuleID, r.Peers}
}

func (r L7Rule) key() proxyRuleKey {
	return proxyRuleKey{r.EndpointID, uint8(r.Direction), r.Port, r.RuleID, r.Peers}
}

type proxyRule interface{ key() proxyRuleKey }

// sortProxyRules sorts rules by endpoint, kind, port, rule ID and peers. Two L7 rules with
// the same first four have disjoint peers (a rule's peers are grouped by the requests they
// may make), so the order is total.
func sortProxyRules[R proxyRule](rs []R) {
	slices.SortFunc(rs, func(a, b R) int {
		ka, kb := a.key(), b.key()
		return cmp.Or(
			cmp.Compare(ka.endpoint, kb.endpoint),
			cmp.Compare(ka.kind, kb.kind),
			cmp.Compare(ka.port, kb.port),
			cmp.Compare(ka.rule, kb.rule),
			slices.Compare(ka.peers, kb.peers),
		)
	})
}

// proxyRulesFor returns the rules of want's endpoint, kind and port whose peers contain
// one of ids.
func proxyRulesFor[R proxyRule](rs []R, want proxyRuleKey, ids []identity.Identity) []R {
	var out []R
	for _, r := range rs {
		k := r.key()
		if k.endpoint != want.endpoint || k.kind != want.kind || k.port != want.port {
			continue
		}
		if slices.ContainsFunc(k.peers, func(p identity.Identity) bool { return slices.Contains(ids, p) }) {
			out = append(out, r)
		}
	}
	return out
}
