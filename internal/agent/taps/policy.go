package taps

import (
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
	"github.com/rampartnet/rampart/internal/podaddr"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/tap"
	"github.com/rampartnet/rampart/internal/tappolicy"
)

// The tap policy (docs/taps.md, "Tap policy (Datalog)"): one per agent, a Datalog program
// compiled (internal/tappolicy) against facts derived from the model and, for a policy
// that reads them, its computed policy state. Its contracts join the user's in the same
// resolution, and are compiled again only in a change whose facts differ, so they follow
// the model without costing a compilation per policy change.

// InspectsLabelPrefix on a monitor endpoint says what it inspects:
// inspects.rampart.io/<what>: "true" gives the fact inspects(Monitor, "<what>").
const InspectsLabelPrefix = "inspects.rampart.io/"

// MaxTalksFacts bounds the talks facts one compilation is given: they grow with the
// square of the endpoints, and a compilation must stay bounded whatever the node holds.
const MaxTalksFacts = 100_000

// localNodeName names this node in the facts outside Kubernetes mode.
const localNodeName = "local"

// KindTapPolicy names the tap policy in change results.
const KindTapPolicy = "TapPolicy"

// PolicyRecord is the tap policy as persisted: its file name and text, and the contracts
// its last good compilation yielded (without explanations), so that an agent restarting
// into a compilation that fails still holds them.
type PolicyRecord struct {
	File     string               `json:"file"`
	Source   string               `json:"source"`
	LastGood []tappolicy.Contract `json:"lastGood,omitempty"`
}

// Policy is the computed policy state as the tap policy's facts read it: the state the
// dataplane gets and the prefixes and CIDR sets of its input. Only a tap policy that names
// exposed or talks reads it (readsPolicy).
type Policy struct {
	State          mapstate.State
	CIDRIdentities map[netip.Prefix]identity.Identity
	CIDRSets       map[string]uint8
}

// compiled is a tap policy's compilation as a computation holds it.
type compiled struct {
	rec   *PolicyRecord   // the policy compiled (its record in the model)
	facts tappolicy.Facts // the facts of the last compilation (good or not)
	// result and contracts are the last good compilation and its tap contracts.
	result    *tappolicy.Result
	contracts []*tap.Contract
	// err is why the last compilation failed ("" when it did not); result and contracts
	// are then the last good ones.
	err   string
	errAt time.Time
}

// reads says which facts that cost more than a walk over the endpoints rec's policy can
// read: exposed (a lookup per endpoint and outside peer in the computed policy) and talks
// (one per endpoint pair and port). A policy that does not name a predicate cannot read
// it, so its facts are left out, and a change of the computed policy alone then changes
// none of the policy's facts.
func reads(rec *PolicyRecord) (exposed, talks bool) {
	return strings.Contains(rec.Source, "exposed"), strings.Contains(rec.Source, "talks")
}

// compilePolicy compiles c's tap policy against the facts of w (and of the computed
// policy, for a policy that reads it), reusing last's compilation when the policy and its
// facts are unchanged.
//
// A failure refuses the change that brought a new policy text (nothing is applied). A
// failure of a recompilation (the facts changed under an accepted policy) keeps the last
// good contracts and records the error: a redirect contract that vanished would let its
// traffic bypass the monitor, so the last contracts stand until the policy compiles again.
// At start the last good contracts are the persisted ones.
func (s *Subsystem) compilePolicy(c Config, w World, pol func() Policy, prev *State) (*compiled, error) {
	rec := c.Policy
	if rec == nil {
		return nil, nil
	}
	var last *compiled
	if prev != nil && prev.policy != nil && prev.policy.rec == rec {
		last = prev.policy
	}
	withExposed, withTalks := reads(rec)
	facts, err := s.facts(c, w, pol, withExposed, withTalks)
	if err == nil && last != nil && reflect.DeepEqual(facts, last.facts) {
		return last, nil
	}
	var res *tappolicy.Result
	var cs []*tap.Contract
	if err == nil {
		res, cs, err = s.compileChecked(rec, facts, c, w)
	}
	if err == nil {
		return &compiled{rec: rec, facts: facts, result: res, contracts: cs}, nil
	}
	switch {
	case last != nil:
		return &compiled{rec: rec, facts: facts, result: last.result, contracts: last.contracts, err: err.Error(), errAt: time.Now()}, nil
	case prev == nil:
		// At start: the persisted last good contracts.
		kept := &tappolicy.Result{Contracts: rec.LastGood}
		cs, cerr := kept.TapContracts(rec.File)
		if cerr != nil {
			kept, cs = &tappolicy.Result{}, nil
		}
		return &compiled{rec: rec, facts: facts, result: kept, contracts: cs, err: err.Error(), errAt: time.Now()}, nil
	}
	return nil, BadPolicy(err)
}

// compileChecked compiles rec against facts and checks its contracts as `tap add` checks
// the user's: no name of a user contract, sources that are not monitors, no overlap with
// another contract on any endpoint (naming both). Every compilation is counted
// (Compilations).
func (s *Subsystem) compileChecked(rec *PolicyRecord, facts tappolicy.Facts, c Config, w World) (*tappolicy.Result, []*tap.Contract, error) {
	s.compilations.Add(1)
	res, err := tappolicy.Compile(rec.File, []byte(rec.Source), facts)
	if err != nil {
		return nil, nil, err
	}
	cs, err := res.TapContracts(rec.File)
	if err != nil {
		return nil, nil, err
	}
	all := userContracts(c)
	eps := w.byKey()
	names := make([]string, 0, len(cs))
	for _, k := range cs {
		if _, ok := c.Contracts[k.Name]; ok {
			return nil, nil, api.Conflict("tap policy %s: derived contract %s: a tap contract of that name exists", rec.File, k.Name)
		}
		if err := checkMonitor(eps, k); err != nil {
			return nil, nil, err
		}
		names = append(names, k.Name)
		all = append(all, k)
	}
	if err := tap.CheckChanged(tap.Resolve(all, w.Endpoints(c.Down), ""), all, names); err != nil {
		return nil, nil, api.Conflict("tap policy %s: %v", rec.File, err)
	}
	return res, cs, nil
}

// facts derives the facts a tap policy reads from c and w; exposed (from the computed
// policy pol) only withExposed, talks only withTalks. pol is called only for those.
func (s *Subsystem) facts(c Config, w World, pol func() Policy, withExposed, withTalks bool) (tappolicy.Facts, error) {
	node := s.node
	if node == "" {
		node = localNodeName
	}
	load := map[string]int64{} // monitor -> the user contracts naming it
	for _, st := range c.Contracts {
		load[st.Contract.Monitor]++
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
	var p Policy
	var probes []probe
	if withExposed || withTalks {
		p = pol()
	}
	if withExposed {
		probes = outsideProbes(p, s.clusterPrefixes(w))
	}
	var f tappolicy.Facts
	for _, e := range w.Local {
		ep := tappolicy.Endpoint{
			Namespace: e.Namespace, Name: e.Name, Node: node, Labels: e.Labels,
			Monitor: monitor(e.Monitor, e.Key, e.Labels),
		}
		if withExposed {
			ep.Exposed = exposed(p, e.ID, probes)
		}
		for _, p := range e.Ports {
			if proto := strings.ToUpper(p.Protocol); proto == "TCP" || proto == "UDP" {
				ep.Ports = append(ep.Ports, tappolicy.Port{Protocol: proto, Port: p.Port})
			}
		}
		f.Endpoints = append(f.Endpoints, ep)
	}
	perNode := map[string]int64{}
	for _, e := range w.Remote {
		perNode[e.Node]++
		f.Endpoints = append(f.Endpoints, tappolicy.Endpoint{
			Namespace: e.Namespace, Name: e.Name, Node: e.Node, Labels: e.Labels, Monitor: monitor(e.Monitor, e.Key, e.Labels),
		})
	}
	f.Nodes = append(f.Nodes, tappolicy.Node{Name: node, Load: int64(len(w.Local))})
	for _, n := range w.Nodes {
		f.Nodes = append(f.Nodes, tappolicy.Node{Name: n.Name, Load: perNode[n.Name]})
	}
	if !withTalks {
		return f, nil
	}
	talks, err := localTalks(w, p, s.maxTalks)
	if err != nil {
		return f, err
	}
	f.Talks = talks
	return f, nil
}

// clusterPrefixes are the pod CIDRs of this node and of the others.
func (s *Subsystem) clusterPrefixes(w World) []netip.Prefix {
	var out []netip.Prefix
	if s.podCIDR.IsValid() {
		out = append(out, s.podCIDR)
	}
	for _, n := range w.Nodes {
		if n.PodCIDR.IsValid() {
			out = append(out, n.PodCIDR)
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
func outsideProbes(d Policy, cluster []netip.Prefix) []probe {
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
		if e, _ := mapstate.LookupIPCache(d.State.IPCache, a); e.Identity == identity.World && !inCluster(a) {
			world = a
			out = append(out, probe{addr: a})
			break
		}
	}
	prefixes := make([]netip.Prefix, 0, len(d.CIDRIdentities))
	for p := range d.CIDRIdentities {
		prefixes = append(prefixes, p)
	}
	sort.Slice(prefixes, func(i, j int) bool { return prefixes[i].String() < prefixes[j].String() })
	for _, p := range prefixes {
		if !p.Addr().Is4() {
			continue // endpoints have IPv4 addresses only
		}
		first := p.Masked().Addr()
		last := podaddr.Last(p)
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
	for _, idx := range d.CIDRSets {
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
func exposed(d Policy, epID uint32, probes []probe) bool {
	pol, ok := d.State.Endpoints[epID]
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
			switch mapstate.LookupSets(d.State, epID, policy.Ingress, p.addr, p.sets, c.proto, port).Verdict {
			case mapstate.Allowed, mapstate.Redirected:
				return true
			}
		}
	}
	return false
}

// localTalks lists, for every ordered pair of local endpoints and every TCP or UDP named
// port of the destination, whether policy allows the connection at both ends: the
// source's egress and the destination's ingress (mapstate.Lookup, as the dataplane). More
// than max facts fail.
func localTalks(w World, d Policy, max int) ([]tappolicy.Talk, error) {
	var out []tappolicy.Talk
	for _, src := range w.Local {
		for _, dst := range w.Local {
			if src.Key == dst.Key {
				continue
			}
			for _, p := range dst.Ports {
				var proto policy.Protocol
				switch strings.ToUpper(p.Protocol) {
				case "TCP":
					proto = policy.ProtoTCP
				case "UDP":
					proto = policy.ProtoUDP
				default:
					continue
				}
				if !allowed(mapstate.Lookup(d.State, src.ID, policy.Egress, dst.IP, proto, p.Port)) ||
					!allowed(mapstate.Lookup(d.State, dst.ID, policy.Ingress, src.IP, proto, p.Port)) {
					continue
				}
				if len(out) == max {
					return nil, fmt.Errorf("tap policy facts: more than %d talks facts (endpoint pairs and ports policy allows): the limit bounds a compilation", max)
				}
				out = append(out, tappolicy.Talk{From: src.Key, To: dst.Key, Protocol: strings.ToUpper(p.Protocol), Port: p.Port})
			}
		}
	}
	return out, nil
}

func allowed(d mapstate.Decision) bool {
	return d.Verdict == mapstate.Allowed || d.Verdict == mapstate.Redirected
}

// record is the record persisted for a computation's tap policy: the model's, with the
// last good contracts (explanations left out: they are derived again).
func (c *compiled) record() *PolicyRecord {
	if c == nil {
		return nil
	}
	rec := &PolicyRecord{File: c.rec.File, Source: c.rec.Source}
	for _, k := range c.result.Contracts {
		k.Why, k.Placement = nil, ""
		rec.LastGood = append(rec.LastGood, k)
	}
	return rec
}

// BadPolicy makes a compilation's error a client error (the policy is at fault); an API
// error (an overlap: conflict) keeps its status.
func BadPolicy(err error) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return err
	}
	return api.BadRequest("%v", err)
}

// CheckPolicyRequest refuses a tap policy request without a file name or over the size a
// policy may have.
func CheckPolicyRequest(req api.TapPolicyRequest) error {
	switch {
	case req.File == "":
		return api.BadRequest("tap policy: file name required")
	case len(req.Source) > tappolicy.MaxSourceBytes:
		return api.BadRequest("tap policy %s: %d bytes, more than the %d a policy may have", req.File, len(req.Source), tappolicy.MaxSourceBytes)
	}
	return nil
}

// ContractChanges lists the compiled contracts created and deleted from before to after.
func ContractChanges(before, after []*tap.Contract) []api.PolicyChange {
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
	gone := make([]string, 0, len(had))
	for name := range had {
		gone = append(gone, name)
	}
	sort.Strings(gone)
	for _, name := range gone {
		out = append(out, api.PolicyChange{Kind: tap.KindTapContract, Name: name, Action: "deleted"})
	}
	return out
}

// PolicyView renders a compilation of the policy file for the API: its contracts with
// the tap contracts each became, its unplaced requests, and with explain the derivations.
func PolicyView(file string, res *tappolicy.Result, explain bool) api.TapPolicy {
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
