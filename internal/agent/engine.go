package agent

import (
	"errors"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// withDefaults fills nil engine functions with the real implementations.
func (e Engine) withDefaults() (Engine, error) {
	if e.Parse == nil {
		e.Parse = policy.Parse
	}
	if e.Prefixes == nil {
		e.Prefixes = mapstate.Prefixes
	}
	if e.Compute == nil {
		e.Compute = mapstate.Compute
		e.computeWith = mapstate.ComputeWith
	} else {
		compute := e.Compute
		e.computeWith = func(in mapstate.Input, _ *mapstate.Memo) (mapstate.State, *mapstate.Memo) {
			return compute(in), nil
		}
	}
	if e.Trace == nil {
		e.Trace = mapstateTrace
	}
	return e, nil
}

// mapstateTrace adapts mapstate.Trace to the API's result.
func mapstateTrace(in mapstate.Input, st mapstate.State, q TraceQuery) (api.TraceResult, error) {
	ref := func(p TracePeer) mapstate.TraceRef {
		if p.Endpoint != nil {
			return mapstate.TraceRef{Namespace: p.Endpoint.Namespace, Name: p.Endpoint.Name}
		}
		return mapstate.TraceRef{Addr: p.IP}
	}
	res, err := mapstate.Trace(in, st, mapstate.Query{From: ref(q.From), To: ref(q.To), Protocol: q.Protocol, Port: q.Port})
	if err != nil {
		if errors.Is(err, mapstate.ErrNoEndpoint) {
			return api.TraceResult{}, api.BadRequest("%v: no policy applies", err)
		}
		return api.TraceResult{}, api.BadRequest("%v", err)
	}
	out := api.TraceResult{
		FromIdent:      res.From.Identity,
		ToIdent:        res.To.Identity,
		FromCIDRGroups: res.From.CIDRGroups,
		ToCIDRGroups:   res.To.CIDRGroups,
		// A redirected connection passes the dataplane; the proxy checks its requests.
		Allowed:    res.Verdict == mapstate.Allowed || res.Verdict == mapstate.Redirected,
		Redirected: res.Verdict == mapstate.Redirected,
	}
	for _, c := range []*mapstate.TraceCheck{res.Egress, res.Ingress} {
		if c == nil {
			continue
		}
		side := api.TraceSide{
			Direction:  c.Direction.String(),
			Endpoint:   c.Endpoint,
			Enforced:   c.Enforced,
			Allowed:    c.Decision.Verdict == mapstate.Allowed || c.Decision.Verdict == mapstate.Redirected,
			Redirected: c.Decision.Verdict == mapstate.Redirected,
			Reason:     string(c.Decision.Reason),
			Tier:       c.Decision.Tier,
			CIDRGroup:  c.CIDRGroup,
		}
		if c.Node.IsValid() {
			side.Node = c.Node.String() // the agent names the node
		}
		if c.Rule != nil {
			side.Rule = &api.RuleRef{ID: c.Rule.ID, Policy: policyRefString(c.Rule.Policy), Rule: c.Rule.Description}
		}
		side.DefaultDenyBy = policyRefStrings(c.DefaultDenyBy)
		if a := c.Audit; a != nil {
			side.Audit = &api.TraceAudit{Reason: string(a.Decision.Reason), Tier: a.Decision.Tier,
				DefaultDenyBy: policyRefStrings(a.DefaultDenyBy)}
			if a.Rule != nil {
				side.Audit.Rule = &api.RuleRef{ID: a.Rule.ID, Policy: policyRefString(a.Rule.Policy), Rule: a.Rule.Description}
			}
		}
		for _, l := range c.L7 {
			t := api.TraceL7{Rule: &api.RuleRef{ID: l.Rule.ID, Policy: policyRefString(l.Rule.Policy), Rule: l.Rule.Description}}
			for _, h := range l.HTTP {
				t.HTTP = append(t.HTTP, policy.FormatHTTPRule(h))
			}
			side.L7 = append(side.L7, t)
		}
		out.Sides = append(out.Sides, side)
	}
	return out, nil
}
