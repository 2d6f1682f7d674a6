package agent

import (
	"context"
	"maps"

	"github.com/rampartnet/rampart/internal/agent/taps"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/tap"
)

// Taps, the tap policy and monitors are a subsystem (internal/agent/taps, docs/taps.md):
// tapStep plugs it into the transaction, and the rest of this file is the API's way to it.
// The agent's part is to say what the subsystem reads of the model (tapWorld, tapPolicy).

// InspectsLabelPrefix on a monitor endpoint says what it inspects (taps.InspectsLabelPrefix).
const InspectsLabelPrefix = taps.InspectsLabelPrefix

// KindTapPolicy names the tap policy in change results.
const KindTapPolicy = taps.KindTapPolicy

// TapRecord is a tap contract as persisted; TapPolicyRecord the tap policy.
type (
	TapRecord       = taps.Record
	TapPolicyRecord = taps.PolicyRecord
)

// tapStep is the taps subsystem's step in the transaction.
type tapStep struct{ s *taps.Subsystem }

func (t tapStep) load(st *stateFile, m *model) error {
	c, err := t.s.Restore(st.Taps, st.TapPolicy)
	if err != nil {
		return err
	}
	m.taps, m.tapPolicy = c.Contracts, c.Policy
	return nil
}

func (t tapStep) compute(m *model, d, prev *desired) error {
	var p *taps.State
	if prev != nil {
		p = prev.taps
	}
	var err error
	d.taps, err = t.s.Compute(tapConfig(m), func() taps.World { return tapWorld(m, d.derived) }, func() taps.Policy { return tapPolicy(d) }, p)
	return err
}

func (t tapStep) apply(old, new *desired, force bool) error {
	return t.s.Apply(old.taps, new.taps, force)
}

func (t tapStep) save(m *model, d *desired, st *stateFile) {
	st.Taps, st.TapPolicy = taps.Records(tapConfig(m), d.taps)
}

func (t tapStep) committed(old, new *desired) { t.s.Committed(old.taps, new.taps) }

// tapConfig is the subsystem's part of m.
func tapConfig(m *model) taps.Config {
	return taps.Config{Contracts: m.taps, Policy: m.tapPolicy, Down: m.monitorsDown}
}

// tapWorld is m's endpoints and nodes as the taps subsystem reads them; derived (what a
// computation derived per endpoint, nil: nothing) spares the full label sets.
func tapWorld(m *model, derived map[*EndpointRecord]derivedEndpoint) taps.World {
	w := taps.World{Local: make([]taps.Endpoint, 0, len(m.endpoints)), Remote: make([]taps.Endpoint, 0, len(m.remotes))}
	for _, key := range sortedKeys(m.endpoints) {
		rec := m.endpoints[key]
		e := taps.Endpoint{Key: key, Namespace: rec.Namespace, Name: rec.Name, ID: rec.EpID, Monitor: rec.Monitor,
			Labels: rec.Labels, IP: rec.IP, Ports: tapPorts(rec.Ports)}
		if de, ok := derived[rec]; ok && maps.Equal(de.nsLabels, m.namespaces[rec.Namespace]) {
			e.Full = de.full
		} else {
			e.Full = fullLabels(rec, nsLabelsOf(m, rec.Namespace))
		}
		w.Local = append(w.Local, e)
	}
	for _, key := range sortedKeys(m.remotes) {
		r := m.remotes[key]
		e := taps.Endpoint{Key: key, Namespace: r.Namespace, Name: r.Name, Node: r.Node, Monitor: r.Monitor,
			Labels: r.Labels, Full: r.fullLabels(nsLabelsOf(m, r.Namespace)), IP: r.IP}
		if n, ok := m.nodes[r.Node]; ok {
			e.NodeAddr = n.Address
		}
		w.Remote = append(w.Remote, e)
	}
	for _, name := range sortedKeys(m.nodes) {
		w.Nodes = append(w.Nodes, taps.Node{Name: name, PodCIDR: m.nodes[name].PodCIDR})
	}
	return w
}

func tapPorts(ports []PortRecord) []taps.Port {
	var out []taps.Port
	for _, p := range ports {
		out = append(out, taps.Port{Name: p.Name, Port: p.Port, Protocol: p.Protocol})
	}
	return out
}

// tapPolicy is d's computed policy as the tap policy's facts read it.
func tapPolicy(d *desired) taps.Policy {
	return taps.Policy{State: d.state, CIDRIdentities: d.input.CIDRIdentities, CIDRSets: d.input.CIDRSets}
}

// putTaps creates or replaces contracts in m, checked as one (taps.Subsystem.Put).
func (a *Agent) putTaps(m *model, contracts []*tap.Contract, res *api.ChangeResult) error {
	if len(contracts) == 0 {
		return nil
	}
	changes, err := a.taps.Put(tapConfig(m), a.cur.taps, tapWorld(m, a.cur.derived), contracts, a.errManaged)
	for _, c := range changes {
		res.Changes = appendChange(res.Changes, c)
	}
	return err
}

// deleteTaps removes contracts by name from m (taps.Delete).
func deleteTaps(m *model, names []string, kinds []string, ignoreNotFound bool, res *api.ChangeResult) error {
	changes, err := taps.Delete(tapConfig(m), names, kinds, ignoreNotFound)
	for _, c := range changes {
		res.Changes = appendChange(res.Changes, c)
	}
	return err
}

// AddTaps creates or replaces the tap contracts of the documents, all or none. Other
// kinds are refused: policies go through Apply.
func (a *Agent) AddTaps(ctx context.Context, req api.ApplyRequest) (api.ChangeResult, error) {
	ps, groups, contracts, err := a.parseDocuments(req.Documents)
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
	if _, _, err := a.change(func(m *model) error { return a.putTaps(m, contracts, &res) }); err != nil {
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
	return a.taps.List(tapConfig(a.model), a.cur.taps)
}

// GetTap shows one contract.
func (a *Agent) GetTap(ctx context.Context, name string) (api.Tap, error) {
	a.refreshMonitors()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.taps.Get(tapConfig(a.model), a.cur.taps, name)
}

// ApplyTapPolicy makes req's policy the agent's: compiled against the facts of the model
// as changed, its contracts checked against the user's, applied in one change; on any
// error nothing is.
func (a *Agent) ApplyTapPolicy(ctx context.Context, req api.TapPolicyRequest) (api.ChangeResult, error) {
	if err := taps.CheckPolicyRequest(req); err != nil {
		return api.ChangeResult{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.taps.HasTaps() {
		return api.ChangeResult{}, taps.ErrNoTaps
	}
	action := "created"
	if prev := a.model.tapPolicy; prev != nil {
		action = "configured"
		if prev.File == req.File && prev.Source == req.Source {
			action = "unchanged"
		}
	}
	before := a.cur.taps.Compiled()
	_, d, err := a.change(func(m *model) error {
		// A new record, even for the same text: the change compiles it (the record
		// pointer tells a new policy from a recompilation).
		m.tapPolicy = &TapPolicyRecord{File: req.File, Source: req.Source}
		return nil
	})
	if err != nil {
		return api.ChangeResult{}, err
	}
	res := api.ChangeResult{Changes: []api.PolicyChange{{Kind: KindTapPolicy, Name: req.File, Action: action}}}
	res.Changes = append(res.Changes, taps.ContractChanges(before, d.taps.Compiled())...)
	a.log.Info("tap policy applied", "file", req.File, "contracts", len(d.taps.Compiled()), "unplaced", d.taps.Unplaced())
	return res, nil
}

// DeleteTapPolicy removes the tap policy and its contracts.
func (a *Agent) DeleteTapPolicy(ctx context.Context) (api.ChangeResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	prev := a.model.tapPolicy
	if prev == nil {
		return api.ChangeResult{}, api.NotFound("no tap policy")
	}
	before := a.cur.taps.Compiled()
	if _, _, err := a.change(func(m *model) error { m.tapPolicy = nil; return nil }); err != nil {
		return api.ChangeResult{}, err
	}
	res := api.ChangeResult{Changes: []api.PolicyChange{{Kind: KindTapPolicy, Name: prev.File, Action: "deleted"}}}
	res.Changes = append(res.Changes, taps.ContractChanges(before, nil)...)
	a.log.Info("tap policy deleted", "file", prev.File)
	return res, nil
}

// GetTapPolicy shows the tap policy, the contracts it yields now and their derivations.
func (a *Agent) GetTapPolicy(ctx context.Context) (api.TapPolicy, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return taps.GetPolicy(a.cur.taps)
}

// CompileTapPolicy compiles req's policy against the facts of the current model, as
// ApplyTapPolicy would, and applies nothing.
func (a *Agent) CompileTapPolicy(ctx context.Context, req api.TapPolicyRequest) (api.TapPolicy, error) {
	if err := taps.CheckPolicyRequest(req); err != nil {
		return api.TapPolicy{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.cur
	return a.taps.DryRun(tapConfig(a.model), tapWorld(a.model, cur.derived), func() taps.Policy { return tapPolicy(cur) }, req)
}

// TapPolicyView renders a compilation of the policy file for the API (taps.PolicyView).
var TapPolicyView = taps.PolicyView

// ReportMonitor keeps the report of `monitor run` of monitor endpoint namespace/name in
// place of the previous one, for the metrics. The agent only holds reports of the
// monitor endpoints it has: one of another endpoint is refused, and a monitor's report
// goes with its endpoint.
func (a *Agent) ReportMonitor(_ context.Context, namespace, name string, r api.MonitorReport) error {
	key := namespace + "/" + name
	if err := r.Validate(); err != nil {
		return api.BadRequest("report of monitor %s: %v", key, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	rec, ok := a.model.endpoints[key]
	if !ok {
		return api.NotFound("report of monitor %s: endpoint %s not found", key, key)
	}
	if !rec.Monitor {
		return api.BadRequest("report of monitor %s: endpoint %s is not a monitor", key, key)
	}
	a.taps.KeepReport(key, rec.EpID, r, a.isMonitor)
	return nil
}

// isMonitor says whether key is a monitor endpoint of the live model, and its id. a.mu
// must be held.
func (a *Agent) isMonitor(key string) (uint32, bool) {
	rec, ok := a.model.endpoints[key]
	if !ok || !rec.Monitor {
		return 0, false
	}
	return rec.EpID, true
}

// monitorsStatus counts this node's monitors and reads the tap counts of no contract.
func (a *Agent) monitorsStatus() *api.MonitorsStatus {
	n := 0
	for _, rec := range a.model.endpoints {
		if rec.Monitor {
			n++
		}
	}
	return a.taps.MonitorsStatus(n, a.model.monitorsDown)
}
