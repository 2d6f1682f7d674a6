package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/tap"
)

// parseDocuments parses every document of a request (policy.ParseRequest): any error
// refuses the whole request, with the parser's message naming the file, the document and
// the field; over a limit 413 or 400 (limitError).
func (a *Agent) parseDocuments(docs []api.Document) ([]*policy.Policy, []*policy.CIDRGroup, []*tap.Contract, error) {
	ms := make([]policy.Manifest, len(docs))
	for i, d := range docs {
		ms[i] = policy.Manifest{Source: d.Source, Data: []byte(d.Data)}
	}
	d, err := policy.ParseRequest(a.eng.Parse, ms)
	if errors.Is(err, policy.ErrLimit) {
		return nil, nil, nil, limitError(err)
	}
	if err != nil {
		return nil, nil, nil, api.BadRequest("%v", err)
	}
	return d.Policies, d.CIDRGroups, d.Taps, nil
}

// limitError is a manifest over a limit of package policy: 413 for sizes, 400 otherwise.
func limitError(err error) *api.Error {
	var le *policy.LimitError
	if errors.As(err, &le) && (le.Limit == policy.LimitSize || le.Limit == policy.LimitDocumentSize) {
		return api.Errorf(http.StatusRequestEntityTooLarge, "%v", err)
	}
	return api.BadRequest("%v", err)
}

func compactJSON(b []byte) []byte {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return b
	}
	return buf.Bytes()
}

// Apply creates or replaces every policy, CIDR group and tap contract in the request, or
// none of them:
// the new policy set is parsed and computed in full before the dataplane is touched, and a
// failure while applying puts the previous state back. CIDR groups become CIDR sets of
// their name; they are loaded before the policies that may name them (see changeSets).
func (a *Agent) Apply(ctx context.Context, req api.ApplyRequest) (api.ChangeResult, error) {
	if err := a.errManaged("policies"); err != nil {
		return api.ChangeResult{}, err
	}
	defer relaxGC(requestBytes(req.Documents))()
	parsed, groups, taps, err := a.parseDocuments(req.Documents)
	if err != nil {
		return api.ChangeResult{}, err
	}
	if err := policy.CheckUnique(&policy.Documents{Policies: parsed, CIDRGroups: groups, Taps: taps}); err != nil {
		return api.ChangeResult{}, api.BadRequest("%v", err)
	}
	contents := make([]*api.PrefixList, len(groups))
	for i, g := range groups {
		contents[i] = groupSet(g)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.requireProxy(parsed); err != nil {
		return api.ChangeResult{}, err
	}
	var res api.ChangeResult
	now := time.Now()
	mutate := func(m *model) error {
		for i, g := range groups {
			action, err := m.putCIDRGroup(g, contents[i], a.model, now)
			if err != nil {
				return err
			}
			res.Changes = appendChange(res.Changes, api.PolicyChange{Kind: string(policy.KindCiliumCIDRGroup), Name: g.Name, Action: action})
		}
		for _, p := range parsed {
			action := m.putPolicy(p, m.policies[p.Key()])
			res.Changes = appendChange(res.Changes, api.PolicyChange{Kind: string(p.Kind), Namespace: p.Namespace, Name: p.Name, Action: action})
		}
		return a.putTaps(m, taps, &res)
	}
	if len(groups) > 0 {
		_, err = a.changeSets(now, &changeTiming{}, mutate)
	} else {
		_, _, err = a.change(mutate)
	}
	if err != nil {
		return api.ChangeResult{}, err
	}
	a.log.Info("policies applied", "changes", len(res.Changes))
	return res, nil
}

// appendChange records a change, replacing an earlier entry for the same object (a delete
// may name one twice; Apply refuses that, checkUnique).
func appendChange(cs []api.PolicyChange, c api.PolicyChange) []api.PolicyChange {
	for i := range cs {
		if cs[i].Kind == c.Kind && cs[i].Namespace == c.Namespace && cs[i].Name == c.Name {
			if cs[i].Action == "created" {
				c.Action = "created"
			}
			cs[i] = c
			return cs
		}
	}
	return append(cs, c)
}

// Delete removes the policies, CIDR groups and tap contracts the documents name, or none
// of them: unless
// IgnoreNotFound, one that does not exist fails the whole request. A CIDR group that a
// remaining policy names is not deleted (the request fails): the policy's peer would
// silently select nothing. Policies go before the sets (see changeSets).
func (a *Agent) Delete(ctx context.Context, req api.DeleteRequest) (api.ChangeResult, error) {
	if err := a.errManaged("policies"); err != nil {
		return api.ChangeResult{}, err
	}
	parsed, groups, taps, err := a.parseDocuments(req.Documents)
	if err != nil {
		return api.ChangeResult{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var res api.ChangeResult
	mutate := func(m *model) error {
		for _, c := range taps {
			if err := deleteTaps(m, []string{c.Name}, []string{c.Kind}, req.IgnoreNotFound, &res); err != nil {
				return err
			}
		}
		for _, p := range parsed {
			key := p.Key()
			c := api.PolicyChange{Kind: string(p.Kind), Namespace: p.Namespace, Name: p.Name, Action: "deleted"}
			if _, ok := m.policies[key]; !ok {
				if !req.IgnoreNotFound {
					return api.NotFound("%s %q not found%s", p.Kind, p.Name, inNamespace(p.Namespace))
				}
				c.Action = "not found"
			}
			delete(m.policies, key)
			res.Changes = appendChange(res.Changes, c)
		}
		for _, g := range groups {
			c := api.PolicyChange{Kind: string(policy.KindCiliumCIDRGroup), Name: g.Name, Action: "deleted"}
			if _, ok := m.cidrsets[g.Name]; !ok {
				if !req.IgnoreNotFound {
					return api.NotFound("%s %q not found", policy.KindCiliumCIDRGroup, g.Name)
				}
				c.Action = "not found"
			}
			delete(m.cidrsets, g.Name)
			res.Changes = appendChange(res.Changes, c)
		}
		for _, g := range groups {
			if refs := referencedBy(m, g.Name); len(refs) > 0 {
				return api.Conflict("%s %q is named by %v: delete those policies too (or first)", policy.KindCiliumCIDRGroup, g.Name, refs)
			}
		}
		return nil
	}
	if len(groups) > 0 {
		_, err = a.changeSets(time.Now(), &changeTiming{}, mutate)
	} else {
		_, _, err = a.change(mutate)
	}
	if err != nil {
		return api.ChangeResult{}, err
	}
	setSources(res.Changes, parsed, groups, taps)
	return res, nil
}

// setSources names in each change the manifest that asked for it.
func setSources(cs []api.PolicyChange, pols []*policy.Policy, groups []*policy.CIDRGroup, taps []*tap.Contract) {
	src := map[[3]string]string{}
	for _, p := range pols {
		src[[3]string{string(p.Kind), p.Namespace, p.Name}] = p.Source
	}
	for _, g := range groups {
		src[[3]string{string(policy.KindCiliumCIDRGroup), "", g.Name}] = g.Source
	}
	// A tap contract's change carries its stored kind, which the manifest may not give.
	tapSrc := map[string]string{}
	for _, c := range taps {
		tapSrc[c.Name] = c.Origin
	}
	for i, c := range cs {
		if s, ok := src[[3]string{c.Kind, c.Namespace, c.Name}]; ok {
			cs[i].Source = s
		} else if s, ok := tapSrc[c.Name]; ok && c.Namespace == "" {
			cs[i].Source = s
		}
	}
}

func inNamespace(ns string) string {
	if ns == "" {
		return ""
	}
	return " in namespace " + ns
}

// ListPolicies lists stored policies with their rules.
func (a *Agent) ListPolicies(ctx context.Context) ([]api.Policy, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []api.Policy{}
	for _, key := range sortedKeys(a.model.policies) {
		sp := a.model.policies[key]
		p := api.Policy{
			Kind:      string(sp.rec.Kind),
			Namespace: sp.rec.Namespace,
			Name:      sp.rec.Name,
			Source:    sp.rec.Source,
			Raw:       sp.rec.Raw,
			Rules:     []api.Rule{},
			Audit:     sp.pol.Audit,
		}
		for _, g := range policyGroups(sp.pol) {
			if _, ok := a.model.cidrsets[g]; !ok {
				p.MissingCIDRGroups = append(p.MissingCIDRGroups, g)
			}
		}
		for _, r := range sp.pol.Rules {
			p.Rules = append(p.Rules, api.Rule{
				ID:          r.ID,
				Description: r.Description,
				Direction:   r.Direction.String(),
				Deny:        r.Deny,
				Selector:    r.Subject.String(),
			})
		}
		out = append(out, p)
	}
	return out, nil
}
