package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/tap"
)

// TapTable is the dataplane's tap rules (docs/taps.md): what the resolution of the tap
// contracts against the endpoints (tap.Resolve) asks of each endpoint. The agent hands it
// the whole rule set whenever it changes; a Kernel without one (Kernel.Taps nil) has no
// taps, and the agent refuses tap contracts rather than pretend to tap.
type TapTable interface {
	// ReplaceTaps makes the installed rules equal to rules (tap.Resolve's order: by
	// endpoint, then index). A rule whose Effect is tap.EffectDrop must drop what it
	// matches: a redirect whose monitor is unavailable fails closed.
	ReplaceTaps(rules []tap.Rule) error
	// TapCounters returns the counters of the installed rules.
	TapCounters() (map[tap.RuleKey]tap.Counters, error)
	// NodeTapCounters returns the node's counts that belong to no rule.
	NodeTapCounters() (tap.NodeCounters, error)
}

// errNoTaps is the answer to a tap contract on a dataplane without taps.
var errNoTaps = api.Errorf(http.StatusNotImplemented, "the dataplane has no taps yet: tap contracts cannot be enforced on this node, so none is accepted")

// TapRecord is a tap contract as persisted: the document as read (compact JSON) and where
// it came from; it is parsed again at start.
type TapRecord struct {
	Kind   string          `json:"kind"`
	Name   string          `json:"name"`
	Source string          `json:"source"`
	Raw    json.RawMessage `json:"raw"`
	// Cluster: the contract is an object of the Kubernetes API (cluster.go), which every
	// sync replaces; the local API cannot change or delete it.
	Cluster bool `json:"cluster,omitempty"`
}

type storedTap struct {
	rec *TapRecord
	c   *tap.Contract
}

// tapEndpoints is the endpoints as tap resolution sees them: local ones (node "") with
// their endpoint ids, and remote ones with their nodes (monitors may run there).
func tapEndpoints(m *model) []tap.Endpoint {
	out := make([]tap.Endpoint, 0, len(m.endpoints)+len(m.remotes))
	for _, rec := range m.endpoints {
		out = append(out, tap.Endpoint{
			Namespace: rec.Namespace, Name: rec.Name, ID: rec.EpID, Monitor: rec.Monitor, Down: m.monitorsDown[rec.Key()],
			Labels: fullLabels(rec, nsLabelsOf(m, rec.Namespace)), Addrs: []netip.Addr{rec.IP},
		})
	}
	for _, r := range m.remotes {
		var nodeAddr netip.Addr
		if n, ok := m.nodes[r.Node]; ok {
			nodeAddr = n.Address
		}
		out = append(out, tap.Endpoint{
			Namespace: r.Namespace, Name: r.Name, Node: r.Node, NodeAddr: nodeAddr, Monitor: r.Monitor,
			Labels: r.fullLabels(nsLabelsOf(m, r.Namespace)), Addrs: []netip.Addr{r.IP},
		})
	}
	return out
}

// resolveTaps resolves m's contracts and the tap policy's (compiled) against m's
// endpoints; nothing when there is no contract, so that nodes without taps pay nothing
// for them.
func resolveTaps(m *model, compiled []*tap.Contract) tap.Resolution {
	if len(m.taps)+len(compiled) == 0 {
		return tap.Resolution{}
	}
	cs := make([]*tap.Contract, 0, len(m.taps)+len(compiled))
	for _, st := range m.taps {
		cs = append(cs, st.c)
	}
	return tap.Resolve(append(cs, compiled...), tapEndpoints(m), "")
}

// putTaps creates or replaces contracts in m, and checks them as one: a dataplane with
// taps, monitors that are monitors, no overlap with another contract on any endpoint.
func (a *Agent) putTaps(m *model, taps []*tap.Contract, res *api.ChangeResult) error {
	if len(taps) == 0 {
		return nil
	}
	if a.dp.Taps == nil {
		return errNoTaps
	}
	var changed []string
	for _, c := range taps {
		action := "created"
		if prev, ok := m.taps[c.Name]; ok {
			if prev.rec.Cluster {
				return a.errManaged(c.Kind + " " + c.Name)
			}
			if prev.rec.Kind != c.Kind {
				return api.Conflict("%s %s: a %s of that name exists (tap contracts of both kinds share one space of names)", c.Kind, c.Name, prev.rec.Kind)
			}
			action = "configured"
			if bytes.Equal(prev.rec.Raw, c.Raw) {
				action = "unchanged"
			}
		}
		if err := checkMonitor(m, c); err != nil {
			return err
		}
		m.taps[c.Name] = &storedTap{rec: &TapRecord{Kind: c.Kind, Name: c.Name, Source: c.Origin, Raw: json.RawMessage(c.Raw)}, c: c}
		changed = append(changed, c.Name)
		res.Changes = appendChange(res.Changes, api.PolicyChange{Kind: c.Kind, Name: c.Name, Action: action})
	}
	// The tap policy's contracts as they stand: a user contract that overlaps one is
	// refused, naming both (the policy is compiled again after this change, and a
	// compilation that would overlap keeps these).
	compiled := a.cur.tapPolicy.tapContracts()
	all := make([]*tap.Contract, 0, len(m.taps)+len(compiled))
	for _, st := range m.taps {
		all = append(all, st.c)
	}
	for _, c := range compiled {
		if _, ok := m.taps[c.Name]; ok {
			return api.Conflict("%s %s: the tap policy derives a contract of that name", c.Kind, c.Name)
		}
	}
	all = append(all, compiled...)
	if err := tap.CheckChanged(resolveTaps(m, compiled), all, changed); err != nil {
		return api.Conflict("%v", err)
	}
	return nil
}

// monitorHint says how a monitor is made, in checkMonitor's refusal (cluster.go puts
// Kubernetes mode's way in its place).
const monitorHint = "create it with --monitor"

// checkMonitor refuses a contract whose monitor is an endpoint that is not a monitor. A
// monitor that does not exist (yet) is accepted: the contract then resolves as "monitor
// unavailable", and a redirect drops what it matches until the monitor is there.
func checkMonitor(m *model, c *tap.Contract) error {
	isMonitor, exists := false, false
	if e, ok := m.endpoints[c.Monitor]; ok {
		isMonitor, exists = e.Monitor, true
	} else if r, ok := m.remotes[c.Monitor]; ok {
		isMonitor, exists = r.Monitor, true
	}
	if exists && !isMonitor {
		return api.BadRequest("%s %s (%s): spec.monitor: endpoint %s is not a monitor (%s)", c.Kind, c.Name, c.Origin, c.Monitor, monitorHint)
	}
	// Monitors are never tapped: a contract naming one as its source would tap nothing.
	if e, ok := m.endpoints[c.Source.Endpoint]; ok && e.Monitor {
		return api.BadRequest("%s %s (%s): spec.source.endpoint: %s is a monitor, and monitors are not tapped", c.Kind, c.Name, c.Origin, c.Source.Endpoint)
	}
	return nil
}

// deleteTaps removes contracts by name from m; one that does not exist fails unless
// ignoreNotFound.
func deleteTaps(m *model, names []string, kinds []string, ignoreNotFound bool, res *api.ChangeResult) error {
	for i, name := range names {
		c := api.PolicyChange{Kind: kinds[i], Name: name, Action: "deleted"}
		st, ok := m.taps[name]
		switch {
		case ok && st.rec.Cluster:
			return api.Conflict("%s %s: managed by the Kubernetes API (delete the object there)", st.rec.Kind, name)
		case ok && kinds[i] != "" && st.rec.Kind != kinds[i]:
			return api.NotFound("%s %q not found (%q is a %s)", kinds[i], name, name, st.rec.Kind)
		case ok:
			c.Kind = st.rec.Kind
		case !ignoreNotFound && compiledName(name):
			return api.NotFound("tap contract %q not found among the contracts you added (names tp-... are the tap policy's: change or delete the policy)", name)
		case !ignoreNotFound:
			kind := kinds[i]
			if kind == "" {
				kind = "tap contract"
			}
			return api.NotFound("%s %q not found", kind, name)
		default:
			c.Action = "not found"
		}
		delete(m.taps, name)
		res.Changes = appendChange(res.Changes, c)
	}
	return nil
}

// applyTaps moves the dataplane's tap rules from old's to new's.
func (a *Agent) applyTaps(old, new *desired, force bool) error {
	if !force && old.taps.RulesEqual(new.taps) {
		return nil
	}
	if a.dp.Taps == nil {
		if len(new.taps.Rules) == 0 {
			return nil
		}
		return errNoTaps
	}
	// Monitors that turn inline are prepared before a packet is redirected to them; those
	// that no longer are, once nothing is.
	inline := inlineMonitors(new.taps.Rules)
	for key, on := range inline {
		if on && !a.inlineMonitors[key] {
			if err := a.setMonitorInline(key, true); err != nil {
				return err
			}
		}
	}
	if err := a.dp.Taps.ReplaceTaps(new.taps.Rules); err != nil {
		return fmt.Errorf("tap rules: %w", err)
	}
	for key, on := range inline {
		if !on && (a.inlineMonitors == nil || a.inlineMonitors[key]) {
			if err := a.setMonitorInline(key, false); err != nil {
				a.log.Warn("preparing a monitor for copies only", "monitor", key, "error", err)
			}
		}
	}
	a.inlineMonitors = inline
	return nil
}

// inlineMonitors maps each local monitor the rules name to whether some rule redirects
// through it.
func inlineMonitors(rules []tap.Rule) map[string]bool {
	out := map[string]bool{}
	for _, r := range rules {
		if m := r.Monitor; m != nil && m.Node == "" {
			key := m.Namespace + "/" + m.Name
			out[key] = out[key] || r.Effect == tap.EffectRedirect
		}
	}
	return out
}

func (a *Agent) setMonitorInline(key string, on bool) error {
	ns, name, _ := strings.Cut(key, "/")
	if err := a.net.SetMonitorInline(ns, name, on); err != nil {
		return fmt.Errorf("monitor %s: %w", key, err)
	}
	return nil
}

// parseTapRecord parses a stored contract (at start).
func (e Engine) parseTapRecord(rec *TapRecord) (*tap.Contract, error) {
	docs, err := e.Parse(rec.Source, rec.Raw)
	if err != nil {
		return nil, fmt.Errorf("re-parsing stored tap contract %s: %w", rec.Name, err)
	}
	if len(docs.Taps) != 1 || len(docs.Policies)+len(docs.CIDRGroups) != 0 || docs.Taps[0].Name != rec.Name || docs.Taps[0].Kind != rec.Kind {
		return nil, fmt.Errorf("re-parsing stored tap contract %s: not one %s of that name", rec.Name, rec.Kind)
	}
	c := docs.Taps[0]
	c.Origin = rec.Source
	return c, nil
}

// AddTaps creates or replaces the tap contracts of the documents, all or none. Other
// kinds are refused: policies go through Apply.
func (a *Agent) AddTaps(ctx context.Context, req api.ApplyRequest) (api.ChangeResult, error) {
	ps, groups, taps, err := a.parseDocuments(req.Documents)
	if err != nil {
		return api.ChangeResult{}, err
	}
	if len(ps)+len(groups) > 0 {
		return api.ChangeResult{}, api.BadRequest("only %s and %s documents are tap contracts (apply policies and CIDR groups with `rampart apply`)", policy.KindTapContract, policy.KindTrafficControl)
	}
	// The monitors as they are now, not at the last check: one that started reading
	// since gets the contract's traffic at once.
	a.refreshMonitors()
	a.mu.Lock()
	defer a.mu.Unlock()
	var res api.ChangeResult
	if _, _, err := a.change(func(m *model) error { return a.putTaps(m, taps, &res) }); err != nil {
		return api.ChangeResult{}, err
	}
	a.log.Info("tap contracts applied", "changes", len(res.Changes))
	return res, nil
}

// DeleteTap deletes one contract by name.
func (a *Agent) DeleteTap(ctx context.Context, name string) (api.ChangeResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var res api.ChangeResult
	if _, _, err := a.change(func(m *model) error { return deleteTaps(m, []string{name}, []string{""}, false, &res) }); err != nil {
		return api.ChangeResult{}, err
	}
	return res, nil
}

// ListTaps lists the contracts with their state and, when the dataplane has taps, their
// counters.
func (a *Agent) ListTaps(ctx context.Context) ([]api.Tap, error) {
	a.refreshMonitors()
	a.mu.Lock()
	defer a.mu.Unlock()
	per, err := a.tapCounters()
	if err != nil {
		return nil, err
	}
	out := []api.Tap{}
	all := a.allTaps()
	for _, name := range sortedKeys(all) {
		out = append(out, a.tapView(all[name], per))
	}
	return out, nil
}

// allTaps is the user's contracts and the tap policy's, by name; the tap policy's carry
// their origin ("tap policy FILE") as their source.
func (a *Agent) allTaps() map[string]*storedTap {
	compiled := a.cur.tapPolicy.tapContracts()
	if len(compiled) == 0 {
		return a.model.taps
	}
	all := make(map[string]*storedTap, len(a.model.taps)+len(compiled))
	for name, st := range a.model.taps {
		all[name] = st
	}
	for _, c := range compiled {
		all[c.Name] = &storedTap{rec: &TapRecord{Kind: c.Kind, Name: c.Name, Source: c.Origin}, c: c}
	}
	return all
}

// GetTap shows one contract.
func (a *Agent) GetTap(ctx context.Context, name string) (api.Tap, error) {
	a.refreshMonitors()
	a.mu.Lock()
	defer a.mu.Unlock()
	st, ok := a.allTaps()[name]
	if !ok {
		return api.Tap{}, api.NotFound("tap contract %q not found", name)
	}
	per, err := a.tapCounters()
	if err != nil {
		return api.Tap{}, err
	}
	return a.tapView(st, per), nil
}

func (a *Agent) tapCounters() (map[string]tap.Counters, error) {
	if a.dp.Taps == nil || len(a.cur.taps.Rules) == 0 {
		return nil, nil
	}
	rules, err := a.dp.Taps.TapCounters()
	if err != nil {
		return nil, fmt.Errorf("reading tap counters: %w", err)
	}
	return tap.PerContract(a.cur.taps, rules), nil
}

func (a *Agent) tapView(st *storedTap, per map[string]tap.Counters) api.Tap {
	c := st.c
	v := api.Tap{
		Kind: c.Kind, Name: c.Name, Source: st.rec.Source, Tapped: c.Source.String(), Monitor: c.Monitor,
		Match: c.Match.String(), Action: c.Action.String(), Endpoints: []string{}, Raw: st.rec.Raw,
	}
	spec := api.TapMatchOf(c.Match)
	v.MatchSpec = &spec
	if c.Action == tap.Redirect {
		v.FailMode = c.FailMode.String()
	}
	if s, ok := a.cur.taps.Status[c.Name]; ok {
		v.Endpoints = append(v.Endpoints, s.Endpoints...)
		v.MonitorProblem = s.MonitorProblem
		if s.Monitor != nil {
			v.MonitorNode = s.Monitor.Node
		}
	}
	for _, cf := range a.cur.taps.Conflicts {
		switch c.Name {
		case cf.A:
			v.Conflicts = append(v.Conflicts, cf.B+" on "+cf.Endpoint)
		case cf.B:
			v.Conflicts = append(v.Conflicts, cf.A+" on "+cf.Endpoint)
		}
	}
	v.Conflicts = slices.Compact(v.Conflicts)
	if per != nil {
		n := per[c.Name]
		v.Counters = &api.TapCounters{
			MirroredPackets: n.MirroredPackets, MirroredBytes: n.MirroredBytes,
			RedirectedPackets: n.RedirectedPackets, RedirectedBytes: n.RedirectedBytes,
			DroppedByMonitor: n.DroppedByMonitor, CopiesLost: n.CopiesLost, DroppedUnavailable: n.DroppedUnavailable,
		}
	}
	return v
}

// compiledName says whether name has the form of a tap policy's contracts.
func compiledName(name string) bool { return strings.HasPrefix(name, "tp-") }
