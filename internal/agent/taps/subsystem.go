package taps

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/tap"
	"github.com/rampartnet/rampart/internal/tappolicy"
)

// Links is what the subsystem needs of the node's network: a monitor endpoint's
// interfaces made ready for redirected traffic (inline) or for copies only
// (endpoint.Node.SetMonitorInline).
type Links interface {
	SetMonitorInline(namespace, name string, on bool) error
}

// Options place the subsystem on its node.
type Options struct {
	// Node names this node in the tap policy's facts ("": "local"); PodCIDR is its pod
	// CIDR, which an outside peer of the exposed facts is not in.
	Node    string
	PodCIDR netip.Prefix
	// Parse is the agent's manifest parser, which stored contracts are parsed again with.
	Parse func(source string, data []byte) (*policy.Documents, error)
	Log   *slog.Logger
}

// Subsystem is taps, the tap policy and monitors (doc.go). Its methods are called under
// the agent's lock, which serialises changes; Compilations may be read at any time.
type Subsystem struct {
	opt      Options
	node     string
	podCIDR  netip.Prefix
	maxTalks int

	// The kernel (Attach): nil table, no taps.
	table    Table
	monitors Monitors
	links    Links
	// inline are the local monitors the installed rules name, and whether one redirects
	// through each (Apply); nil until the first installation.
	inline map[string]bool

	// reports are the monitors' latest reports of `monitor run` (reports.go).
	reports map[string]monitorReport

	compilations atomic.Int64
}

// New is the subsystem of a node, without a kernel until Attach.
func New(opt Options) *Subsystem {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	return &Subsystem{opt: opt, node: opt.Node, podCIDR: opt.PodCIDR, maxTalks: MaxTalksFacts}
}

// Attach gives the subsystem the dataplane's tap table and monitors (nil: the dataplane has
// no taps, and contracts are refused) and the node's network.
func (s *Subsystem) Attach(table Table, monitors Monitors, links Links) {
	s.table, s.monitors, s.links = table, monitors, links
}

// HasTaps says whether the dataplane has taps.
func (s *Subsystem) HasTaps() bool { return s.table != nil }

// Monitors is the dataplane's monitor interfaces (nil without taps).
func (s *Subsystem) Monitors() Monitors { return s.monitors }

// Compilations counts the tap policy's compilations since New: a change that leaves the
// policy's inputs as they were adds none.
func (s *Subsystem) Compilations() int64 { return s.compilations.Load() }

// SetTalksLimit replaces MaxTalksFacts (tests).
func (s *Subsystem) SetTalksLimit(n int) { s.maxTalks = n }

// State is the subsystem's part of a computed (desired) state: the tap policy's
// compilation and the resolution of every contract against the endpoints, with the inputs
// they were made of, which the next computation compares to reuse them. Immutable.
type State struct {
	policy *compiled
	res    tap.Resolution

	contracts map[string]*Stored
	down      map[string]string
	world     World
}

// Compiled are the tap policy's contracts (nil without a policy).
func (st *State) Compiled() []*tap.Contract {
	if st == nil || st.policy == nil {
		return nil
	}
	return st.policy.contracts
}

func (st *State) resolution() tap.Resolution {
	if st == nil {
		return tap.Resolution{}
	}
	return st.res
}

// Compute is the subsystem's part of the desired state of a model whose part is c. world
// is the rest of the model as the subsystem reads it, and pol the computed policy: each is
// called only when needed (world when there is a contract or a policy; pol for a tap
// policy that reads it). prev is the live state, nil at start. Pure apart from counting
// compilations: a new tap policy that does not compile refuses the change.
func (s *Subsystem) Compute(c Config, world func() World, pol func() Policy, prev *State) (*State, error) {
	if len(c.Contracts) == 0 && c.Policy == nil {
		return &State{}, nil
	}
	w := world()
	cp, err := s.compilePolicy(c, w, pol, prev)
	if err != nil {
		return nil, err
	}
	st := &State{policy: cp, contracts: c.Contracts, down: c.Down, world: w}
	if prev != nil && prev.contracts != nil && maps.Equal(prev.contracts, st.contracts) && maps.Equal(prev.down, st.down) &&
		slices.Equal(prev.Compiled(), st.Compiled()) && reflect.DeepEqual(prev.world, st.world) {
		st.res = prev.res
	} else {
		st.res = resolve(c, st.Compiled(), w)
	}
	return st, nil
}

// Apply moves the dataplane's tap rules from old's to new's (either may be nil: none);
// force rewrites them whatever old says. Monitors that turn inline are prepared before a
// packet is redirected to them, those that no longer are once nothing is.
func (s *Subsystem) Apply(old, new *State, force bool) error {
	oldRes, newRes := old.resolution(), new.resolution()
	if !force && oldRes.RulesEqual(newRes) {
		return nil
	}
	if s.table == nil {
		if len(newRes.Rules) == 0 {
			return nil
		}
		return ErrNoTaps
	}
	inline := inlineMonitors(newRes.Rules)
	for key, on := range inline {
		if on && !s.inline[key] {
			if err := s.setInline(key, true); err != nil {
				return err
			}
		}
	}
	if err := s.table.ReplaceTaps(newRes.Rules); err != nil {
		return fmt.Errorf("tap rules: %w", err)
	}
	for key, on := range inline {
		if !on && (s.inline == nil || s.inline[key]) {
			if err := s.setInline(key, false); err != nil {
				s.opt.Log.Warn("preparing a monitor for copies only", "monitor", key, "error", err)
			}
		}
	}
	s.inline = inline
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

func (s *Subsystem) setInline(key string, on bool) error {
	ns, name, _ := strings.Cut(key, "/")
	if err := s.links.SetMonitorInline(ns, name, on); err != nil {
		return fmt.Errorf("monitor %s: %w", key, err)
	}
	return nil
}

// Committed reports a change of the tap policy's compilation state once new is live: a
// recompilation that failed (the last good contracts stand), or one that succeeded again.
func (s *Subsystem) Committed(old, new *State) {
	var o, n *compiled
	if old != nil {
		o = old.policy
	}
	if new != nil {
		n = new.policy
	}
	if n == nil || o == nil || o.rec != n.rec {
		return
	}
	switch {
	case n.err != "" && n.err != o.err:
		s.opt.Log.Error("tap policy recompilation failed, its last good contracts stay installed", "file", n.rec.File, "error", n.err)
	case n.err == "" && o.err != "":
		s.opt.Log.Info("tap policy compiles again", "file", n.rec.File, "contracts", len(n.contracts))
	}
}

// Records is what the state file keeps of c and st: the user's contracts by name, and the
// tap policy with its last good contracts.
func Records(c Config, st *State) ([]*Record, *PolicyRecord) {
	names := make([]string, 0, len(c.Contracts))
	for name := range c.Contracts {
		names = append(names, name)
	}
	sort.Strings(names)
	recs := make([]*Record, 0, len(names))
	for _, name := range names {
		recs = append(recs, c.Contracts[name].Rec)
	}
	if len(recs) == 0 {
		recs = nil
	}
	var pol *compiled
	if st != nil {
		pol = st.policy
	}
	return recs, pol.record()
}

// Restore is the part of the model the state file's records make.
func (s *Subsystem) Restore(recs []*Record, pol *PolicyRecord) (Config, error) {
	c := Config{Contracts: make(map[string]*Stored, len(recs)), Policy: pol}
	for _, rec := range recs {
		k, err := ParseRecord(s.opt.Parse, rec)
		if err != nil {
			return Config{}, err
		}
		c.Contracts[rec.Name] = &Stored{Rec: rec, Contract: k}
	}
	return c, nil
}

// All is the user's contracts and the tap policy's, by name; the tap policy's carry their
// origin ("tap policy FILE") as their source.
func All(c Config, st *State) map[string]*Stored {
	compiled := st.Compiled()
	if len(compiled) == 0 {
		return c.Contracts
	}
	all := make(map[string]*Stored, len(c.Contracts)+len(compiled))
	maps.Copy(all, c.Contracts)
	for _, k := range compiled {
		all[k.Name] = &Stored{Rec: &Record{Kind: k.Kind, Name: k.Name, Source: k.Origin}, Contract: k}
	}
	return all
}

// List is every contract (All) with its state and, when the dataplane has taps, its
// counters, by name.
func (s *Subsystem) List(c Config, st *State) ([]api.Tap, error) {
	per, err := s.counters(st)
	if err != nil {
		return nil, err
	}
	all := All(c, st)
	names := make([]string, 0, len(all))
	for name := range all {
		names = append(names, name)
	}
	sort.Strings(names)
	out := []api.Tap{}
	for _, name := range names {
		out = append(out, view(all[name], st, per))
	}
	return out, nil
}

// Get shows one contract.
func (s *Subsystem) Get(c Config, st *State, name string) (api.Tap, error) {
	stored, ok := All(c, st)[name]
	if !ok {
		return api.Tap{}, api.NotFound("tap contract %q not found", name)
	}
	per, err := s.counters(st)
	if err != nil {
		return api.Tap{}, err
	}
	return view(stored, st, per), nil
}

func (s *Subsystem) counters(st *State) (map[string]tap.Counters, error) {
	res := st.resolution()
	if s.table == nil || len(res.Rules) == 0 {
		return nil, nil
	}
	rules, err := s.table.TapCounters()
	if err != nil {
		return nil, fmt.Errorf("reading tap counters: %w", err)
	}
	return tap.PerContract(res, rules), nil
}

func view(stored *Stored, st *State, per map[string]tap.Counters) api.Tap {
	c := stored.Contract
	res := st.resolution()
	v := api.Tap{
		Kind: c.Kind, Name: c.Name, Source: stored.Rec.Source, Tapped: c.Source.String(), Monitor: c.Monitor,
		Match: c.Match.String(), Action: c.Action.String(), Endpoints: []string{}, Raw: stored.Rec.Raw,
	}
	spec := api.TapMatchOf(c.Match)
	v.MatchSpec = &spec
	if c.Action == tap.Redirect {
		v.FailMode = c.FailMode.String()
	}
	if s, ok := res.Status[c.Name]; ok {
		v.Endpoints = append(v.Endpoints, s.Endpoints...)
		v.MonitorProblem = s.MonitorProblem
		if s.Monitor != nil {
			v.MonitorNode = s.Monitor.Node
		}
	}
	for _, cf := range res.Conflicts {
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

// PolicyStatus is the tap policy's line in the agent's status (nil without a policy).
func PolicyStatus(st *State) *api.TapPolicyStatus {
	if st == nil || st.policy == nil {
		return nil
	}
	c := st.policy
	return &api.TapPolicyStatus{File: c.rec.File, Contracts: len(c.contracts), Unplaced: len(c.result.Unplaced), Error: c.err, ErrorAt: c.errAt}
}

// GetPolicy shows the tap policy of st, the contracts it yields and their derivations.
func GetPolicy(st *State) (api.TapPolicy, error) {
	if st == nil || st.policy == nil {
		return api.TapPolicy{}, api.NotFound("no tap policy")
	}
	c := st.policy
	v := PolicyView(c.rec.File, c.result, true)
	v.Source, v.Error, v.ErrorAt = c.rec.Source, c.err, c.errAt
	return v, nil
}

// Unplaced is the number of the tap policy's requests no monitor was found for.
func (st *State) Unplaced() int {
	if st == nil || st.policy == nil {
		return 0
	}
	return len(st.policy.result.Unplaced)
}

// DryRun compiles req's policy against the facts of c and w (all of them, exposed and
// talks included) as an apply would, and applies nothing. The overlap check is left out:
// the user's contracts may change before an apply, which checks it.
func (s *Subsystem) DryRun(c Config, w World, pol func() Policy, req api.TapPolicyRequest) (api.TapPolicy, error) {
	facts, err := s.facts(c, w, pol, true, true)
	if err != nil {
		return api.TapPolicy{}, BadPolicy(err)
	}
	res, err := tappolicy.Compile(req.File, []byte(req.Source), facts)
	if err != nil {
		return api.TapPolicy{}, BadPolicy(err)
	}
	if _, err := res.TapContracts(req.File); err != nil {
		return api.TapPolicy{}, BadPolicy(err)
	}
	v := PolicyView(req.File, res, req.Explain)
	if req.Facts {
		if v.Facts, err = facts.Atoms(); err != nil {
			return api.TapPolicy{}, BadPolicy(err)
		}
	}
	return v, nil
}

// MonitorsStatus counts this node's monitors (monitors, of which down are down) and reads
// the tap counts of no contract; nil without taps, or when there is no monitor here and
// nothing was counted.
func (s *Subsystem) MonitorsStatus(monitors int, down map[string]string) *api.MonitorsStatus {
	if s.table == nil {
		return nil
	}
	st := &api.MonitorsStatus{Monitors: monitors}
	keys := make([]string, 0, len(down))
	for key := range down {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		st.Down = append(st.Down, key+": "+down[key])
	}
	c, err := s.table.NodeTapCounters()
	if err != nil {
		st.Error = err.Error()
		return st
	}
	st.CopiesFromOtherNodes, st.CopiesFromOtherNodesLost, st.NotDiverted = c.RemoteDelivered, c.RemoteLost, c.Rejected
	if st.Monitors == 0 && st.CopiesFromOtherNodes+st.CopiesFromOtherNodesLost+st.NotDiverted == 0 {
		return nil
	}
	return st
}
