package mapstate

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// TraceRef names one end of a traced flow: an endpoint by namespace and name, or an address.
// An address that is an endpoint's is that endpoint.
type TraceRef struct {
	Namespace string     `json:"namespace,omitempty"`
	Name      string     `json:"name,omitempty"`
	Addr      netip.Addr `json:"addr,omitzero"`
}

func (r TraceRef) String() string {
	if r.Name != "" {
		return r.Namespace + "/" + r.Name
	}
	return r.Addr.String()
}

// Query is a flow to explain: From sends to To's Port (the ICMP type for ICMP).
type Query struct {
	From     TraceRef        `json:"from"`
	To       TraceRef        `json:"to"`
	Protocol policy.Protocol `json:"protocol"`
	Port     uint16          `json:"port"`
}

// TraceEnd is a resolved end of the flow.
type TraceEnd struct {
	Endpoint   bool   `json:"endpoint"` // an endpoint of this agent
	EndpointID uint32 `json:"endpointID,omitempty"`
	// Node is the address of the node that hosts the end when it is a pod on another node
	// (Input.Remote); invalid otherwise.
	Node      netip.Addr        `json:"node,omitzero"`
	Namespace string            `json:"namespace,omitempty"`
	Name      string            `json:"name,omitempty"`
	Addr      netip.Addr        `json:"addr"`
	Identity  identity.Identity `json:"identity"` // as the ipcache resolves Addr
	// CIDRGroups names the CIDR sets Addr is in (Input.CIDRSetMembership), sorted.
	CIDRGroups []string `json:"cidrGroups,omitempty"`
}

// RuleInfo describes the rule that decided a check.
type RuleInfo struct {
	ID          uint32    `json:"id"`
	Policy      PolicyRef `json:"policy"` // zero when Input.RulePolicies does not name it
	Description string    `json:"description,omitempty"`
}

// TraceCheck is the policy decision at one endpoint: egress at the source, ingress at the
// destination.
type TraceCheck struct {
	Direction policy.Direction `json:"direction"`
	Endpoint  string           `json:"endpoint"` // namespace/name of the deciding endpoint
	Enforced  bool             `json:"enforced"` // whether the endpoint enforces Direction
	// Node is, for a pod on another node, that node's address: the check is the one that
	// node makes, computed here from the rules, the pod's labels and named ports, and the
	// identities this node knows (as this node's own, with the host's and the nodes'
	// addresses seen from there). Invalid for an endpoint of this node.
	Node     netip.Addr `json:"node,omitzero"`
	Decision Decision   `json:"decision"`
	Rule     *RuleInfo  `json:"rule,omitempty"`
	// CIDRGroup names the CIDR set whose identity the deciding entry has, when a
	// cidrGroupRef peer decided (e.g. an egressDeny toCIDRSet cidrGroupRef).
	CIDRGroup string `json:"cidrGroup,omitempty"`
	// L7 names, for a Redirected decision, the rules whose HTTP rules the proxy applies
	// (Decision.L7, one entry each, in that order).
	L7 []TraceL7 `json:"l7,omitempty"`
	// DefaultDenyBy names, for a default deny, the policies whose rules make the endpoint
	// enforce the direction.
	DefaultDenyBy []PolicyRef `json:"defaultDenyBy,omitempty"`
	// Audit is, for a flow Decision lets through, what the policies in audit mode that
	// apply to the endpoint would do to it when they would drop it: the dataplane
	// forwards it and reports it as audited (nil: they would not, or none applies).
	Audit *TraceAudit `json:"audit,omitempty"`
}

// TraceAudit is the decision of an endpoint's policy with its audited rules enforced too
// (EndpointPolicy.Audit), for a flow it would drop.
type TraceAudit struct {
	Decision Decision  `json:"decision"`
	Rule     *RuleInfo `json:"rule,omitempty"`
	// DefaultDenyBy names, for a default deny, the policies (audited or not) whose rules
	// make the endpoint enforce the direction.
	DefaultDenyBy []PolicyRef `json:"defaultDenyBy,omitempty"`
}

// TraceL7 is one L7 rule that applies to a redirected flow: a request passes if it matches
// one of HTTP (any of the rule's, or of another TraceL7 of the same check).
type TraceL7 struct {
	Rule RuleInfo          `json:"rule"`
	HTTP []policy.HTTPRule `json:"http"`
}

// TraceResult explains a flow. A check is present for each end that is an endpoint of
// this node or a pod on another node (Input.Remote), whose check is computed here. The
// verdict is Denied if a check denies the flow, else Redirected if a check redirects it to
// the L7 proxy (the flow passes the dataplane; each request must pass the proxy's L7
// rules), else Allowed.
type TraceResult struct {
	From     TraceEnd        `json:"from"`
	To       TraceEnd        `json:"to"`
	Protocol policy.Protocol `json:"protocol"`
	Port     uint16          `json:"port"`
	Egress   *TraceCheck     `json:"egress,omitempty"`
	Ingress  *TraceCheck     `json:"ingress,omitempty"`
	Verdict  Verdict         `json:"verdict"`
}

// ErrNoEndpoint is returned by Trace when neither end is an endpoint nor a pod on another
// node: no policy applies to such a flow.
var ErrNoEndpoint = errors.New("neither end of the flow is an endpoint")

// Trace explains the verdict for q from st, the state computed from in (the dataplane's own
// state, so the explanation is the dataplane's decision), naming the deciding rule and its
// policy from in.
func Trace(in Input, st State, q Query) (TraceResult, error) {
	res := TraceResult{Protocol: q.Protocol, Port: q.Port}
	from, fromEP, err := resolveRef(in, st, q.From)
	if err != nil {
		return res, fmt.Errorf("resolving source: %w", err)
	}
	to, toEP, err := resolveRef(in, st, q.To)
	if err != nil {
		return res, fmt.Errorf("resolving destination: %w", err)
	}
	res.From, res.To = from, to
	if fromEP == nil && toEP == nil {
		return res, ErrNoEndpoint
	}
	res.Verdict = Allowed
	if fromEP != nil {
		res.Egress = checkEnd(in, st, from, fromEP, policy.Egress, to.Addr, q)
		res.Verdict = combine(res.Verdict, res.Egress.Decision.Verdict)
	}
	if toEP != nil {
		res.Ingress = checkEnd(in, st, to, toEP, policy.Ingress, from.Addr, q)
		res.Verdict = combine(res.Verdict, res.Ingress.Decision.Verdict)
	}
	return res, nil
}

// checkEnd is check at one end: an endpoint of this node in st, or a pod on another node
// (end.Node valid), whose policy is computed here as its node computes it.
func checkEnd(in Input, st State, end TraceEnd, ep *Endpoint, dir policy.Direction, peer netip.Addr, q Query) *TraceCheck {
	if !end.Node.IsValid() {
		return check(in, st, ep, dir, peer, q)
	}
	c := check(in, remoteState(in, st, *ep, end.Node), ep, dir, peer, q)
	c.Node = end.Node
	return c
}

// remoteState is the state the node at address node gives its pod ep, as far as a trace
// of ep needs it: ep's policy computed from the same rules and identities, and the
// ipcache as that node sees it (this node's host addresses are a remote node there, its
// own address its host). Pod identities are the cluster's, so the rest is the same.
func remoteState(in Input, st State, ep Endpoint, node netip.Addr) State {
	c := newComputer(&in)
	rules := make([]preparedRule, len(in.Rules))
	for i := range in.Rules {
		rules[i] = c.prepare(&in.Rules[i])
	}
	enforced := enforcedRules(rules)
	pol := c.policyOf(ep, rules, enforced)
	ipc := maps.Clone(st.IPCache)
	for _, a := range in.HostIPs {
		p := netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		e := ipc[p]
		e.Identity = identity.RemoteNode
		ipc[p] = e
	}
	p := netip.PrefixFrom(node, node.BitLen())
	e := ipc[p]
	e.Identity = identity.Host
	ipc[p] = e
	if ep.Audit {
		enforced = nil
	}
	return State{Endpoints: map[uint32]EndpointPolicy{ep.ID: pol}, IPCache: ipc, L7: c.l7Rules(ep, enforced, pol)}
}

// combine returns the verdict of a flow that must pass checks with verdicts a and b.
func combine(a, b Verdict) Verdict {
	switch {
	case a == Denied || b == Denied:
		return Denied
	case a == Redirected || b == Redirected:
		return Redirected
	case a == Allowed && b == Allowed:
		return Allowed
	}
	return Denied // an unknown verdict: fail closed
}

func check(in Input, st State, ep *Endpoint, dir policy.Direction, peer netip.Addr, q Query) *TraceCheck {
	d := LookupSets(st, ep.ID, dir, peer, membership(in, peer), q.Protocol, q.Port)
	c := &TraceCheck{Direction: dir, Endpoint: ep.Namespace + "/" + ep.Name, Decision: d}
	if d.Entry != nil {
		if idx, ok := identity.IsCIDRSet(d.Entry.Identity); ok {
			c.CIDRGroup = setName(in, idx)
		}
	}
	pol := st.Endpoints[ep.ID]
	c.Enforced = dir == policy.Ingress && pol.EnforceIngress || dir == policy.Egress && pol.EnforceEgress
	if d.Entry != nil {
		c.Rule = ruleInfo(in, d.RuleID)
	}
	for _, r := range d.L7 {
		c.L7 = append(c.L7, TraceL7{Rule: *ruleInfo(in, r.RuleID), HTTP: r.HTTP})
	}
	if d.Reason == ReasonDefaultDeny {
		c.DefaultDenyBy = DefaultDenyBy(in, *ep, dir, false)
	}
	if pol.Audit != nil && d.Verdict != Denied {
		as := st
		as.Endpoints = map[uint32]EndpointPolicy{ep.ID: *pol.Audit}
		ad := LookupSets(as, ep.ID, dir, peer, membership(in, peer), q.Protocol, q.Port)
		if ad.Verdict == Denied {
			c.Audit = &TraceAudit{Decision: ad}
			if ad.Entry != nil {
				c.Audit.Rule = ruleInfo(in, ad.RuleID)
			}
			if ad.Reason == ReasonDefaultDeny {
				c.Audit.DefaultDenyBy = DefaultDenyBy(in, *ep, dir, true)
			}
		}
	}
	return c
}

// DefaultDenyBy returns the policies (in.RulePolicies) of the rules that make endpoint ep
// enforce direction dir: enforced rules only, or with audit those in audit mode too.
// Sorted, each once.
func DefaultDenyBy(in Input, ep Endpoint, dir policy.Direction, audit bool) []PolicyRef {
	var out []PolicyRef
	for i := range in.Rules {
		r := &in.Rules[i]
		if !r.EnableDefaultDeny || r.Direction != dir || r.Host != ep.Host || ((r.Audit || ep.Audit) && !audit) ||
			r.Tier != policy.TierNetworkPolicy || !r.Subject.Matches(ep.Labels) {
			continue
		}
		if ref, ok := in.RulePolicies[r.ID]; ok && !slices.Contains(out, ref) {
			out = append(out, ref)
		}
	}
	slices.SortFunc(out, func(a, b PolicyRef) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// membership returns the CIDR set mask of a, 0 without a membership function.
func membership(in Input, a netip.Addr) uint32 {
	if in.CIDRSetMembership == nil || !a.IsValid() {
		return 0
	}
	return in.CIDRSetMembership(a.Unmap())
}

// setName returns the name of CIDR set idx ("" if none has it).
func setName(in Input, idx uint8) string {
	for name, i := range in.CIDRSets {
		if i == idx {
			return name
		}
	}
	return ""
}

// setNames returns the names of the sets of mask, sorted.
func setNames(in Input, mask uint32) []string {
	var out []string
	for name, i := range in.CIDRSets {
		if i < MaxCIDRSets && mask&(1<<i) != 0 {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// ruleInfo names rule id and its policy.
func ruleInfo(in Input, id uint32) *RuleInfo {
	info := &RuleInfo{ID: id, Policy: in.RulePolicies[id]}
	if id == HostTrafficRuleID {
		info.Description = HostTrafficDescription
		return info
	}
	for i := range in.Rules {
		if in.Rules[i].ID == id {
			info.Description = in.Rules[i].Description
			break
		}
	}
	return info
}

// resolveRef finds the endpoint a reference names (nil if it is a plain address) and the
// identity the ipcache gives its address.
func resolveRef(in Input, st State, r TraceRef) (TraceEnd, *Endpoint, error) {
	var ep *Endpoint
	switch {
	case r.Name != "":
		for i := range in.Endpoints {
			if in.Endpoints[i].Namespace == r.Namespace && in.Endpoints[i].Name == r.Name {
				ep = &in.Endpoints[i]
				break
			}
		}
		if ep == nil {
			if rem := remoteRef(in, r); rem != nil {
				return resolveRef(in, st, TraceRef{Addr: rem.IP})
			}
			return TraceEnd{}, nil, fmt.Errorf("endpoint %s/%s not found", r.Namespace, r.Name)
		}
		if r.Addr.IsValid() && r.Addr.Unmap() != ep.IP.Unmap() {
			return TraceEnd{}, nil, fmt.Errorf("endpoint %s/%s has address %v, not %v", r.Namespace, r.Name, ep.IP, r.Addr)
		}
	case r.Addr.IsValid():
		for i := range in.Endpoints {
			if in.Endpoints[i].IP.Unmap() == r.Addr.Unmap() {
				ep = &in.Endpoints[i]
				break
			}
		}
	default:
		return TraceEnd{}, nil, errors.New("no endpoint name or address given")
	}
	end := TraceEnd{Addr: r.Addr.Unmap()}
	if ep != nil {
		end = TraceEnd{Endpoint: true, EndpointID: ep.ID, Namespace: ep.Namespace, Name: ep.Name, Addr: ep.IP.Unmap()}
	} else if rem := remoteRef(in, r); rem != nil {
		ep = &Endpoint{Namespace: rem.Namespace, Name: rem.Name, Labels: rem.Labels, Identity: rem.Identity,
			IP: rem.IP, NamedPorts: rem.NamedPorts}
		end = TraceEnd{Namespace: rem.Namespace, Name: rem.Name, Addr: rem.IP.Unmap(), Node: rem.Node}
	}
	e, _ := LookupIPCache(st.IPCache, end.Addr)
	end.Identity = e.Identity
	end.CIDRGroups = setNames(in, membership(in, end.Addr))
	return end, ep, nil
}

// remoteRef returns the pod on another node that r names (by name, else by address); nil
// if none.
func remoteRef(in Input, r TraceRef) *RemoteEndpoint {
	for i := range in.Remote {
		rem := &in.Remote[i]
		if r.Name != "" && rem.Namespace == r.Namespace && rem.Name == r.Name ||
			r.Name == "" && (rem.IP.Unmap() == r.Addr.Unmap() || rem.IP6.IsValid() && rem.IP6 == r.Addr.Unmap()) {
			return rem
		}
	}
	return nil
}
