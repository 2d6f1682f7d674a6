package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/tap"
	"github.com/rampartnet/rampart/internal/tappolicy"
)

// The tap policy (docs/taps.md, "Tap policy (Datalog)"): one per agent, a Datalog program
// compiled (internal/tappolicy) against facts derived from the model and its computed
// policy state. Its contracts join the user's in the same resolution, and are compiled
// again inside every change whose facts differ, so they follow the model.

// InspectsLabelPrefix on a monitor endpoint says what it inspects:
// inspects.rampart.io/<what>: "true" gives the fact inspects(Monitor, "<what>").
const InspectsLabelPrefix = "inspects.rampart.io/"

// MaxTalksFacts bounds the talks facts one compilation is given: they grow with the
// square of the endpoints, and a compilation must stay bounded whatever the node holds.
const MaxTalksFacts = 100_000

// maxTalksFacts is MaxTalksFacts; tests lower it.
var maxTalksFacts = MaxTalksFacts

// localNodeName names this node in the facts outside Kubernetes mode.
const localNodeName = "local"

// TapPolicyRecord is the tap policy as persisted: its file name and text, and the
// contracts its last good compilation yielded (without explanations), so that an agent
// restarting into a compilation that fails still holds them.
type TapPolicyRecord struct {
	File     string               `json:"file"`
	Source   string               `json:"source"`
	LastGood []tappolicy.Contract `json:"lastGood,omitempty"`
}

// compiledTaps is a tap policy's compilation as a computation holds it.
type compiledTaps struct {
	rec   *TapPolicyRecord // the policy compiled (its record in the model)
	facts tappolicy.Facts  // the facts of the last compilation (good or not)
	// result and contracts are the last good compilation and its tap contracts.
	result    *tappolicy.Result
	contracts []*tap.Contract
	// err is why the last compilation failed ("" when it did not); result and contracts
	// are then the last good ones.
	err   string
	errAt time.Time
}

// tapContracts are the contracts of a computation's tap policy (nil when none).
func (c *compiledTaps) tapContracts() []*tap.Contract {
	if c == nil {
		return nil
	}
	return c.contracts
}

// compileTapPolicy compiles m's tap policy against the facts of m and d (d's policy state
// computed), reusing prev's compilation when the policy and its facts are unchanged.
//
// A failure refuses the change that brought a new policy text (nothing is applied). A
// failure of a recompilation (the facts changed under an accepted policy) keeps the last
// good contracts and records the error: a redirect contract that vanished would let its
// traffic bypass the monitor, so the last contracts stand until the policy compiles again.
// At start (prev nil) the last good contracts are the persisted ones.
func (e Engine) compileTapPolicy(m *model, d, prev *desired) (*compiledTaps, error) {
	rec := m.tapPolicy
	if rec == nil {
		return nil, nil
	}
	var last *compiledTaps
	if prev != nil && prev.tapPolicy != nil && prev.tapPolicy.rec == rec {
		last = prev.tapPolicy
	}
	// The talks facts cost a lookup per endpoint pair and port: derived only for a policy
	// that can read them (one that does not name the predicate cannot).
	facts, err := e.tapFacts(m, d, strings.Contains(rec.Source, "talks"))
	if err == nil && last != nil && reflect.DeepEqual(facts, last.facts) {
		return last, nil
	}
	var res *tappolicy.Result
	var cs []*tap.Contract
	if err == nil {
		res, cs, err = compileChecked(rec, facts, m)
	}
	if err == nil {
		return &compiledTaps{rec: rec, facts: facts, result: res, contracts: cs}, nil
	}
	switch {
	case last != nil:
		return &compiledTaps{rec: rec, facts: facts, result: last.result, contracts: last.contracts, err: err.Error(), errAt: time.Now()}, nil
	case prev == nil:
		// At start: the persisted last good contracts.
		kept := &tappolicy.Result{Contracts: rec.LastGood}
		cs, cerr := kept.TapContracts(rec.File)
		if cerr != nil {
			kept, cs = &tappolicy.Result{}, nil
		}
		return &compiledTaps{rec: rec, facts: facts, result: kept, contracts: cs, err: err.Error(), errAt: time.Now()}, nil
	}
	return nil, badTapPolicy(err)
}

// compileChecked compiles rec against facts and checks its contracts as `tap add` checks
// the user's: no name of a user contract, sources that are not monitors, no overlap with
// another contract on any endpoint (naming both).
func compileChecked(rec *TapPolicyRecord, facts tappolicy.Facts, m *model) (*tappolicy.Result, []*tap.Contract, error) {
	res, err := tappolicy.Compile(rec.File, []byte(rec.Source), facts)
	if err != nil {
		return nil, nil, err
	}
	cs, err := res.TapContracts(rec.File)
	if err != nil {
		return nil, nil, err
	}
	all := make([]*tap.Contract, 0, len(m.taps)+len(cs))
	for _, st := range m.taps {
		all = append(all, st.c)
	}
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		if _, ok := m.taps[c.Name]; ok {
			return nil, nil, api.Conflict("tap policy %s: derived contract %s: a tap contract of that name exists", rec.File, c.Name)
		}
		if err := checkMonitor(m, c); err != nil {
			return nil, nil, err
		}
		names = append(names, c.Name)
		all = append(all, c)
	}
	if err := tap.CheckChanged(tap.Resolve(all, tapEndpoints(m), ""), all, names); err != nil {
		return nil, nil, api.Conflict("tap policy %s: %v", rec.File, err)
	}
	return res, cs, nil
}

// tapFacts derives the facts a tap policy reads from m and d's computed policy state; the
// talks facts only withTalks.
func (e Engine) tapFacts(m *model, d *desired, withTalks bool) (tappolicy.Facts, error) {
	node := e.nodeName
	if node == "" {
		node = localNodeName
	}
	load := map[string]int64{} // monitor -> the user contracts naming it
	for _, st := range m.taps {
		load[st.c.Monitor]++
	}
	monitor := func(isMonitor bool, key string, l map[string]string) *tappolicy.Monitor {
		if !isMonitor {
			return nil
		}
		mon := &tappolicy.Monitor{Load: load[key]}
		for k, v := range l {
			if what, ok := strings.CutPrefix(k, InspectsLabelPrefix); ok && v == "true" && what != "" {
				mon.Inspects = append(mon.Inspects, what)
			}
		}
		sort.Strings(mon.Inspects)
		return mon
	}
	var f tappolicy.Facts
	probes := outsideProbes(d, e.clusterPrefixes(m))
	for _, key := range d.keys {
		rec := m.endpoints[key]
		ep := tappolicy.Endpoint{
			Namespace: rec.Namespace, Name: rec.Name, Node: node, Labels: rec.Labels,
			Exposed: exposed(d, rec.EpID, probes), Monitor: monitor(rec.Monitor, key, rec.Labels),
		}
		for _, p := range rec.Ports {
			if proto := strings.ToUpper(p.Protocol); proto == "TCP" || proto == "UDP" {
				ep.Ports = append(ep.Ports, tappolicy.Port{Protocol: proto, Port: p.Port})
			}
		}
		f.Endpoints = append(f.Endpoints, ep)
	}
	perNode := map[string]int64{}
	for _, key := range sortedKeys(m.remotes) {
		r := m.remotes[key]
		perNode[r.Node]++
		f.Endpoints = append(f.Endpoints, tappolicy.Endpoint{
			Namespace: r.Namespace, Name: r.Name, Node: r.Node, Labels: r.Labels, Monitor: monitor(r.Monitor, key, r.Labels),
		})
	}
	f.Nodes = append(f.Nodes, tappolicy.Node{Name: node, Load: int64(len(m.endpoints))})
	for _, name := range sortedKeys(m.nodes) {
		f.Nodes = append(f.Nodes, tappolicy.Node{Name: name, Load: perNode[name]})
	}
	if !withTalks {
		return f, nil
	}
	talks, err := localTalks(m, d)
	if err != nil {
		return f, err
	}
	f.Talks = talks
	return f, nil
}

// clusterPrefixes are the pod CIDRs of this node and of the others.
func (e Engine) clusterPrefixes(m *model) []netip.Prefix {
	var out []netip.Prefix
	if e.podCIDR.IsValid() {
		out = append(out, e.podCIDR)
	}
	for _, name := range sortedKeys(m.nodes) {
		if p := m.nodes[name].PodCIDR; p.IsValid() {
			out = append(out, p)
		}
	}
	return out
}

// probe is a peer from outside the cluster: its address and the CIDR sets it is in.
type probe struct {
	addr netip.Addr
	sets uint32
}

// worldCandidates are documentation addresses (RFC 5737), tried in turn for a peer with
// the world identity: none is ever a cluster address unless a pod CIDR was chosen there.
var worldCandidates = []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("203.0.113.1")}

// outsideProbes lists one peer for every way a packet from outside the cluster can look to
// the dataplane: an address with the world identity, an address in each policy prefix
// that reaches outside the pod CIDRs (its CIDR identity), and one in each CIDR set.
func outsideProbes(d *desired, cluster []netip.Prefix) []probe {
	inCluster := func(a netip.Addr) bool {
		for _, p := range cluster {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	var out []probe
	var world netip.Addr
	for _, a := range worldCandidates {
		if e, _ := mapstate.LookupIPCache(d.state.IPCache, a); e.Identity == identity.World && !inCluster(a) {
			world = a
			out = append(out, probe{addr: a})
			break
		}
	}
	prefixes := make([]netip.Prefix, 0, len(d.input.CIDRIdentities))
	for p := range d.input.CIDRIdentities {
		prefixes = append(prefixes, p)
	}
	sort.Slice(prefixes, func(i, j int) bool { return prefixes[i].String() < prefixes[j].String() })
	for _, p := range prefixes {
		if !p.Addr().Is4() {
			continue // endpoints have IPv4 addresses only
		}
		first := p.Masked().Addr()
		last := lastAddr(p)
		switch {
		case !inCluster(first):
			out = append(out, probe{addr: first})
		case !inCluster(last):
			out = append(out, probe{addr: last})
		}
	}
	if !world.IsValid() {
		world = worldCandidates[0]
	}
	for _, idx := range d.input.CIDRSets {
		// A CIDR set's members are outside addresses (a set holds external ranges); its
		// identity is looked up beside the peer's own.
		out = append(out, probe{addr: world, sets: 1 << idx})
	}
	return out
}

// exposed says whether endpoint epID's ingress admits some peer of probes on some port,
// deciding as the dataplane does (mapstate.LookupSets, as `rampart policy trace`). An
// endpoint that enforces no ingress admits everything. The verdict for a peer changes with
// the port only where a policy entry's port range starts or ends, so the ports tried are
// those boundaries: every port range of the endpoint is covered by one of them.
func exposed(d *desired, epID uint32, probes []probe) bool {
	pol, ok := d.state.Endpoints[epID]
	if !ok {
		return false // no state: the dataplane drops everything
	}
	if !pol.EnforceIngress {
		return true
	}
	type l4 struct {
		proto policy.Protocol
		port  uint16
	}
	cands := map[l4]bool{{policy.ProtoTCP, 1}: true, {policy.ProtoUDP, 1}: true, {policy.ProtoICMP, 8}: true}
	for k := range pol.Entries {
		if k.Direction != policy.Ingress || k.Protocol == policy.ProtoAny {
			continue
		}
		span := uint32(1)<<(16-min(k.PortPrefixLen, 16)) - 1 // the ports the entry covers, less one
		first := uint32(k.Port) &^ span
		cands[l4{k.Protocol, uint16(first)}] = true
		if end := first + span + 1; end <= 0xffff {
			cands[l4{k.Protocol, uint16(end)}] = true
		}
	}
	for _, p := range probes {
		for c := range cands {
			port := c.port
			if port == 0 && c.proto != policy.ProtoICMP {
				port = 1
			}
			switch mapstate.LookupSets(d.state, epID, policy.Ingress, p.addr, p.sets, c.proto, port).Verdict {
			case mapstate.Allowed, mapstate.Redirected:
				return true
			}
		}
	}
	return false
}

// localTalks lists, for every ordered pair of local endpoints and every TCP or UDP named
// port of the destination, whether policy allows the connection at both ends: the
// source's egress and the destination's ingress (mapstate.Lookup, as the dataplane).
func localTalks(m *model, d *desired) ([]tappolicy.Talk, error) {
	var out []tappolicy.Talk
	for _, sk := range d.keys {
		src := m.endpoints[sk]
		for _, dk := range d.keys {
			dst := m.endpoints[dk]
			if sk == dk {
				continue
			}
			for _, p := range dst.Ports {
				proto, err := parseProtocol(p.Protocol)
				if err != nil || (proto != policy.ProtoTCP && proto != policy.ProtoUDP) {
					continue
				}
				if !allowed(mapstate.Lookup(d.state, src.EpID, policy.Egress, dst.IP, proto, p.Port)) ||
					!allowed(mapstate.Lookup(d.state, dst.EpID, policy.Ingress, src.IP, proto, p.Port)) {
					continue
				}
				if len(out) == maxTalksFacts {
					return nil, fmt.Errorf("tap policy facts: more than %d talks facts (endpoint pairs and ports policy allows): the limit bounds a compilation", maxTalksFacts)
				}
				out = append(out, tappolicy.Talk{From: sk, To: dk, Protocol: strings.ToUpper(p.Protocol), Port: p.Port})
			}
		}
	}
	return out, nil
}

func allowed(d mapstate.Decision) bool {
	return d.Verdict == mapstate.Allowed || d.Verdict == mapstate.Redirected
}

// tapPolicyRecord is the record persisted for a computation's tap policy: the model's,
// with the last good contracts (explanations left out: they are derived again).
func tapPolicyRecord(c *compiledTaps) *TapPolicyRecord {
	if c == nil {
		return nil
	}
	rec := &TapPolicyRecord{File: c.rec.File, Source: c.rec.Source}
	for _, k := range c.result.Contracts {
		k.Why, k.Placement = nil, ""
		rec.LastGood = append(rec.LastGood, k)
	}
	return rec
}

// KindTapPolicy names the tap policy in change results.
const KindTapPolicy = "TapPolicy"

// ApplyTapPolicy makes req's policy the agent's: compiled against the facts of the model
// as changed, its contracts checked against the user's, applied in one change; on any
// error nothing is.
func (a *Agent) ApplyTapPolicy(ctx context.Context, req api.TapPolicyRequest) (api.ChangeResult, error) {
	if err := checkTapPolicyRequest(req); err != nil {
		return api.ChangeResult{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.dp.Taps == nil {
		return api.ChangeResult{}, errNoTaps
	}
	action := "created"
	if prev := a.model.tapPolicy; prev != nil {
		action = "configured"
		if prev.File == req.File && prev.Source == req.Source {
			action = "unchanged"
		}
	}
	before := a.cur.tapPolicy.tapContracts()
	_, d, err := a.change(func(m *model) error {
		// A new record, even for the same text: the change compiles it (the record
		// pointer tells a new policy from a recompilation, see compileTapPolicy).
		m.tapPolicy = &TapPolicyRecord{File: req.File, Source: req.Source}
		return nil
	})
	if err != nil {
		return api.ChangeResult{}, err
	}
	res := api.ChangeResult{Changes: []api.PolicyChange{{Kind: KindTapPolicy, Name: req.File, Action: action}}}
	res.Changes = append(res.Changes, contractChanges(before, d.tapPolicy.tapContracts())...)
	a.log.Info("tap policy applied", "file", req.File, "contracts", len(d.tapPolicy.tapContracts()), "unplaced", len(d.tapPolicy.result.Unplaced))
	return res, nil
}

// badTapPolicy makes a compilation's error a client error (the policy is at fault); an
// API error (an overlap: conflict) keeps its status.
func badTapPolicy(err error) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return err
	}
	return api.BadRequest("%v", err)
}

func checkTapPolicyRequest(req api.TapPolicyRequest) error {
	switch {
	case req.File == "":
		return api.BadRequest("tap policy: file name required")
	case len(req.Source) > tappolicy.MaxSourceBytes:
		return api.BadRequest("tap policy %s: %d bytes, more than the %d a policy may have", req.File, len(req.Source), tappolicy.MaxSourceBytes)
	}
	return nil
}

// contractChanges lists the compiled contracts created and deleted from before to after.
func contractChanges(before, after []*tap.Contract) []api.PolicyChange {
	had := map[string]bool{}
	for _, c := range before {
		had[c.Name] = true
	}
	var out []api.PolicyChange
	for _, c := range after {
		action := "created"
		if had[c.Name] {
			action = "unchanged"
			delete(had, c.Name)
		}
		out = append(out, api.PolicyChange{Kind: c.Kind, Name: c.Name, Action: action})
	}
	for _, name := range sortedKeys(had) {
		out = append(out, api.PolicyChange{Kind: tap.KindTapContract, Name: name, Action: "deleted"})
	}
	return out
}

// DeleteTapPolicy removes the tap policy and its contracts.
func (a *Agent) DeleteTapPolicy(ctx context.Context) (api.ChangeResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	prev := a.model.tapPolicy
	if prev == nil {
		return api.ChangeResult{}, api.NotFound("no tap policy")
	}
	before := a.cur.tapPolicy.tapContracts()
	if _, _, err := a.change(func(m *model) error { m.tapPolicy = nil; return nil }); err != nil {
		return api.ChangeResult{}, err
	}
	res := api.ChangeResult{Changes: []api.PolicyChange{{Kind: KindTapPolicy, Name: prev.File, Action: "deleted"}}}
	res.Changes = append(res.Changes, contractChanges(before, nil)...)
	a.log.Info("tap policy deleted", "file", prev.File)
	return res, nil
}

// GetTapPolicy shows the tap policy, the contracts it yields now and their derivations.
func (a *Agent) GetTapPolicy(ctx context.Context) (api.TapPolicy, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.cur.tapPolicy
	if c == nil {
		return api.TapPolicy{}, api.NotFound("no tap policy")
	}
	v := TapPolicyView(c.rec.File, c.result, true)
	v.Source, v.Error, v.ErrorAt = c.rec.Source, c.err, c.errAt
	return v, nil
}

// CompileTapPolicy compiles req's policy against the facts of the current model, as
// ApplyTapPolicy would, and applies nothing.
func (a *Agent) CompileTapPolicy(ctx context.Context, req api.TapPolicyRequest) (api.TapPolicy, error) {
	if err := checkTapPolicyRequest(req); err != nil {
		return api.TapPolicy{}, err
	}
	a.mu.Lock()
	m := a.model.clone()
	m.tapPolicy = &TapPolicyRecord{File: req.File, Source: req.Source}
	facts, err := a.eng.tapFacts(m, a.cur, true)
	a.mu.Unlock()
	if err != nil {
		return api.TapPolicy{}, badTapPolicy(err)
	}
	// The overlap check is left out: the user's contracts may change before an apply,
	// which checks it.
	res, err := tappolicy.Compile(req.File, []byte(req.Source), facts)
	if err != nil {
		return api.TapPolicy{}, badTapPolicy(err)
	}
	if _, err := res.TapContracts(req.File); err != nil {
		return api.TapPolicy{}, badTapPolicy(err)
	}
	v := TapPolicyView(req.File, res, req.Explain)
	if req.Facts {
		if v.Facts, err = facts.Atoms(); err != nil {
			return api.TapPolicy{}, badTapPolicy(err)
		}
	}
	return v, nil
}

// TapPolicyView renders a compilation of the policy file for the API: its contracts with
// the tap contracts each became, its unplaced requests, and with explain the derivations.
func TapPolicyView(file string, res *tappolicy.Result, explain bool) api.TapPolicy {
	v := api.TapPolicy{File: file, Strategy: res.Strategy, Contracts: []api.CompiledTap{}, Missing: res.Missing}
	for _, k := range res.Contracts {
		ct := api.CompiledTap{Name: k.Name, Source: k.Source, Monitor: k.Monitor, Direction: k.Direction,
			Protocol: k.Protocol, Port: k.Port, Action: k.Action, Placement: k.Placement}
		if cs, err := k.TapContracts(file); err == nil {
			for _, c := range cs {
				ct.Taps = append(ct.Taps, c.Name)
			}
		}
		if explain {
			ct.Why = derivations(k.Why)
		}
		v.Contracts = append(v.Contracts, ct)
	}
	for _, u := range res.Unplaced {
		ut := api.UnplacedTap{Request: u.Request, Reason: u.Reason}
		if explain {
			ut.Why = derivations(u.Why)
		}
		v.Unplaced = append(v.Unplaced, ut)
	}
	return v
}

func derivations(ds []tappolicy.Derivation) []api.TapDerivation {
	var out []api.TapDerivation
	for _, d := range ds {
		td := api.TapDerivation{Rule: d.Rule, Line: d.Line, Facts: d.Facts}
		for _, p := range d.Derived {
			td.Derived = append(td.Derived, api.TapPremise{Fact: p.Fact, Why: derivations(p.Why)})
		}
		out = append(out, td)
	}
	return out
}

// tapPolicyStatus is the tap policy's line in the agent's status.
func (a *Agent) tapPolicyStatus() *api.TapPolicyStatus {
	c := a.cur.tapPolicy
	if c == nil {
		return nil
	}
	return &api.TapPolicyStatus{File: c.rec.File, Contracts: len(c.contracts), Unplaced: len(c.result.Unplaced), Error: c.err, ErrorAt: c.errAt}
}

// logTapPolicy reports a change of the tap policy's compilation state: a recompilation
// that failed (the last good contracts stand), or one that succeeded again.
func (a *Agent) logTapPolicy(old, new *compiledTaps) {
	if new == nil || old == nil || old.rec != new.rec {
		return
	}
	switch {
	case new.err != "" && new.err != old.err:
		a.log.Error("tap policy recompilation failed, its last good contracts stay installed", "file", new.rec.File, "error", new.err)
	case new.err == "" && old.err != "":
		a.log.Info("tap policy compiles again", "file", new.rec.File, "contracts", len(new.contracts))
	}
}
