package agent

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// FlowEvents are the dataplane's flow events.
type FlowEvents interface {
	// Read blocks until the next flow event; it fails once the Kernel was closed.
	Read() (flow.Event, error)
	// Drained counts the times Read found no event waiting (it looks at least
	// every datapath.EventPoll): once it has grown by two, every event written before has
	// been read.
	Drained() uint64
}

// view is an immutable snapshot of what flow decoration needs, swapped on every commit so
// the event reader never waits for a change in progress.
type view struct {
	byEpID map[uint32]*EndpointRecord
	byIP   map[netip.Addr]*EndpointRecord
	remote map[netip.Addr]*RemoteEndpointRecord // pods on other nodes, by address
	alloc  *identityLabeler
	rules  map[uint32]api.RuleRef
	// ipcache is the current desired ipcache (read only), for the identities of L7 flows'
	// addresses.
	ipcache map[netip.Prefix]mapstate.IPCacheEntry
	// setNames names the CIDR sets by index.
	setNames map[uint8]string
	// dns is the current DNS proxy rules, for the proxy's verdicts.
	dns []mapstate.DNSRule
	// input is what the current state was computed from (read only), for the policies
	// behind a default deny; defaultDeny caches them by defaultDenyKey.
	input       *mapstate.Input
	defaultDeny sync.Map
}

// defaultDenyKey names the policies that make one endpoint enforce one direction,
// audited ones included or not.
type defaultDenyKey struct {
	epID  uint32
	dir   policy.Direction
	audit bool
}

// defaultDenyBy returns the policies behind a default deny at endpoint epID in direction
// dir (with audit, those in audit mode too), computed once per view.
func (v *view) defaultDenyBy(epID uint32, dir policy.Direction, audit bool) []string {
	k := defaultDenyKey{epID, dir, audit}
	if refs, ok := v.defaultDeny.Load(k); ok {
		return refs.([]string)
	}
	var refs []string
	if v.input != nil {
		for _, ep := range v.input.Endpoints {
			if ep.ID == epID {
				refs = policyRefStrings(mapstate.DefaultDenyBy(*v.input, ep, dir, audit))
				break
			}
		}
	}
	v.defaultDeny.Store(k, refs)
	return refs
}

// identityLabeler answers identity -> labels from one allocator state.
type identityLabeler struct {
	labels func(identity.Identity) ([]string, bool)
}

// publishView rebuilds the decoration snapshot; a.mu must be held.
func (a *Agent) publishView() {
	v := &view{
		byEpID: make(map[uint32]*EndpointRecord, len(a.model.endpoints)),
		byIP:   make(map[netip.Addr]*EndpointRecord, len(a.model.endpoints)),
		rules:  map[uint32]api.RuleRef{},
	}
	v.ipcache = a.cur.state.IPCache
	v.dns = a.cur.state.DNS
	v.input = &a.cur.input
	v.setNames = map[uint8]string{}
	for name, s := range a.model.cidrsets {
		v.setNames[s.meta.Index] = name
	}
	for _, e := range a.model.endpoints {
		v.byEpID[e.EpID] = e
		v.byIP[e.IP] = e
		if e.IP6.IsValid() {
			v.byIP[e.IP6] = e
		}
	}
	v.remote = make(map[netip.Addr]*RemoteEndpointRecord, len(a.model.remotes))
	for _, r := range a.model.remotes {
		v.remote[r.IP] = r
	}
	for _, sp := range a.model.policies {
		ref := mapstate.PolicyRef{Kind: sp.pol.Kind, Namespace: sp.pol.Namespace, Name: sp.pol.Name}
		for _, r := range sp.pol.Rules {
			v.rules[r.ID] = api.RuleRef{ID: r.ID, Policy: policyRefString(ref), Rule: r.Description}
		}
	}
	// The entry that admits the host (--host-traffic=allow) is the agent's, not a policy's.
	v.rules[mapstate.HostTrafficRuleID] = api.RuleRef{ID: mapstate.HostTrafficRuleID, Policy: "rampartd", Rule: "--host-traffic=" + string(HostTrafficAllow)}
	// So is the one that admits the node's connections to the API server (host policy).
	v.rules[mapstate.HostSafeRuleID] = api.RuleRef{ID: mapstate.HostSafeRuleID, Policy: "rampartd", Rule: "--host-firewall: the API server connection"}
	alloc := a.cur.alloc
	v.alloc = &identityLabeler{labels: func(id identity.Identity) ([]string, bool) {
		if l, ok := alloc.Labels(id); ok {
			return labelList(l), true
		}
		if p, ok := alloc.Prefix(id); ok {
			s := "cidr:" + p.String()
			if id&identity.EndpointCIDRFlag != 0 {
				s += " (endpoint address)"
			}
			return []string{s}, true
		}
		return nil, false
	}}
	a.view.Store(v)
}

func policyRefString(r mapstate.PolicyRef) string {
	return string(r.Kind) + "/" + r.Namespace + "/" + r.Name
}

func policyRefStrings(refs []mapstate.PolicyRef) []string {
	var out []string
	for _, r := range refs {
		out = append(out, policyRefString(r))
	}
	return out
}

// readFlows decorates dataplane events and hands them to the hub until the datapath closes.
func (a *Agent) readFlows() {
	defer close(a.readerDone)
	for {
		ev, err := a.dp.Read()
		if err != nil {
			return
		}
		a.flows.publishEvent(flowKeyOf(ev), a.decorate(ev))
	}
}

func (a *Agent) decorate(ev flow.Event) api.Flow {
	v := a.view.Load()
	f := api.Flow{
		Time:     ev.Time,
		Type:     ev.Type.String(),
		Verdict:  ev.Verdict.String(),
		Protocol: protocolName(uint8(ev.Protocol)),
		Length:   ev.Length,
		Flags:    ev.Flags.Names(),
	}
	if ev.Reason != flow.ReasonNone {
		f.Reason = ev.Reason.String()
	}
	if ev.Direction == policy.Ingress || ev.Direction == policy.Egress {
		f.Direction = ev.Direction.String()
	}
	if ev.Protocol == policy.ProtoICMP || ev.Protocol == policy.ProtoICMPv6 {
		t := ev.ICMPType
		f.ICMPType = &t
	}
	f.FromProxy = ev.Flags.Has(flow.FlagFromProxy)
	if ev.Flags.Has(flow.FlagARP) {
		f.Protocol = "ARP"
	}
	f.Source = v.peer(ev.Source, ev.SourcePort, ev.SrcIdentity)
	f.Dest = v.peer(ev.Destination, ev.DestinationPort, ev.DstIdentity)
	if ev.Reason == flow.ReasonTunnelUntrustedSource {
		// Not from a node: whatever pod the inner source address names did not send it.
		f.Source.Namespace, f.Source.Name, f.Source.Node = "", "", ""
	}
	if ev.Reason == flow.ReasonSpoofedSource {
		// The source address is forged: the sender is who the dataplane found (its
		// identity is in the event), never the endpoint whose address it claims. Leaving
		// an endpoint, that is the endpoint itself.
		f.Source.Namespace, f.Source.Name = "", ""
		if e, ok := v.byEpID[ev.EpID]; ok && ev.Direction == policy.Egress {
			f.Source.Namespace, f.Source.Name = e.Namespace, e.Name
		}
	}
	if e, ok := v.byEpID[ev.EpID]; ok {
		f.Endpoint = e.Key()
	} else if ev.EpID == mapstate.HostEndpointID {
		f.Endpoint = mapstate.HostEndpointName // the node itself (host policy)
	}
	if ev.RuleID != 0 {
		if r, ok := v.rules[ev.RuleID]; ok {
			f.Rule = &r
		} else {
			f.Rule = &api.RuleRef{ID: ev.RuleID}
		}
		if idx, ok := identity.IsCIDRSet(ev.MatchIdentity); ok {
			f.CIDRGroup = v.setNames[idx]
		}
	}
	if ev.Reason == flow.ReasonPolicyDefaultDeny {
		f.DefaultDenyBy = v.defaultDenyBy(ev.EpID, ev.Direction, ev.Verdict == flow.VerdictAudit)
	}
	return f
}

func (v *view) peer(ip netip.Addr, port uint16, id identity.Identity) api.FlowPeer {
	p := api.FlowPeer{Port: port, Identity: id}
	if ip.IsValid() {
		p.IP = ip.String()
	}
	if e, ok := v.byIP[ip]; ok {
		p.Namespace, p.Name = e.Namespace, e.Name
	} else if r, ok := v.remote[ip]; ok {
		p.Namespace, p.Name, p.Node = r.Namespace, r.Name, r.Node
	}
	if l, ok := v.alloc.labels(id); ok {
		p.Labels = l
	}
	return p
}

// flowHub keeps recent flows and fans new ones out to observers. Drops are kept in a
// history of their own: they are what users look for afterwards, and a busy endpoint's
// allowed connections (thousands a second) would otherwise push them out within seconds.
type flowHub struct {
	mu      sync.Mutex
	dropped flowRing // flows with verdict DROPPED
	other   flowRing // everything else
	subs    map[chan api.Flow]struct{}
	seen    uint64
	lost    uint64
	closed  bool
	// counts are the metrics' counts of what was published (metrics.go).
	counts flowCounts
	// lostBy counts, per follower, the flows it missed since it was last told (Observe's
	// req.Lost); made on the first loss.
	lostBy map[chan api.Flow]uint64
}

// flowRing is a fixed-size history; seq numbers let two rings merge in publish order.
type flowRing struct {
	flows []flowEntry
	seqs  []uint64
	next  int // where the next flow goes
	full  bool
}

// flowEntry is a flow in the history: decorated, or an L7 request as the proxy recorded
// it (l7 set), decorated when first read.
type flowEntry struct {
	flow api.Flow
	l7   *l7Record
}

// l7Record is a request the proxy handled and the agent's view when it was logged, so a
// late decoration names what was there at the time.
type l7Record struct {
	log  flow.AccessLog
	view *view
}

func newFlowRing(size int) flowRing {
	return flowRing{flows: make([]flowEntry, size), seqs: make([]uint64, size)}
}

func (r *flowRing) add(e flowEntry, seq uint64) {
	r.flows[r.next], r.seqs[r.next] = e, seq
	r.next = (r.next + 1) % len(r.flows)
	if r.next == 0 {
		r.full = true
	}
}

// n is how many entries the ring holds.
func (r *flowRing) n() int {
	if r.full {
		return len(r.flows)
	}
	return r.next
}

// at returns the i-th oldest flow and its sequence number, decorating it (once) if it is
// an L7 record.
func (r *flowRing) at(i int) (api.Flow, uint64) {
	if r.full {
		i = (r.next + i) % len(r.flows)
	}
	e := &r.flows[i]
	if e.l7 != nil {
		e.flow, e.l7 = decorateL7(e.l7.view, e.l7.log), nil
	}
	return e.flow, r.seqs[i]
}

func newFlowHub(size int) *flowHub {
	return &flowHub{dropped: newFlowRing(size), other: newFlowRing(size), subs: map[chan api.Flow]struct{}{}, counts: newFlowCounts()}
}

// publishEvent publishes the flow of a dataplane event and counts it under k.
func (h *flowHub) publishEvent(k flowKey, f api.Flow) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts.flows[k]++
	h.publishLocked(f)
}

func (h *flowHub) publish(f api.Flow) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.publishLocked(f)
}

// publishLocked keeps f and sends it to the followers; h.mu must be held.
func (h *flowHub) publishLocked(f api.Flow) {
	h.seen++
	if f.Verdict == flow.VerdictDropped.String() {
		h.dropped.add(flowEntry{flow: f}, h.seen)
	} else {
		h.other.add(flowEntry{flow: f}, h.seen)
	}
	h.fanOut(f)
}

// publishL7 keeps an L7 request's record undecorated unless someone follows the flows:
// decorating (names, identities, labels, rules) costs the proxy's fast path about a tenth
// of its time per request, for a flow that is mostly never read.
func (h *flowHub) publishL7(r *l7Record) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts.l7[l7KeyOf(&r.log)]++
	h.counts.l7Latency.observe(r.log.Latency)
	h.seen++
	e := flowEntry{l7: r}
	if len(h.subs) > 0 {
		e = flowEntry{flow: decorateL7(r.view, r.log)}
	}
	if l7Dropped(&r.log) {
		h.dropped.add(e, h.seen)
	} else {
		h.other.add(e, h.seen)
	}
	if e.l7 == nil {
		h.fanOut(e.flow)
	}
}

// fanOut sends f to every follower; h.mu must be held.
func (h *flowHub) fanOut(f api.Flow) {
	for c := range h.subs {
		select {
		case c <- f:
		default:
			h.lost++ // a slow observer must not stall the event reader
			if h.lostBy == nil {
				h.lostBy = map[chan api.Flow]uint64{}
			}
			h.lostBy[c]++
		}
	}
}

func (h *flowHub) stats() (seen, lost uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen, h.lost
}

// buffered is how many flows the history holds and can hold.
func (h *flowHub) buffered() (n, capacity int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dropped.n() + h.other.n(), len(h.dropped.flows) + len(h.other.flows)
}

// takeLost returns and resets the count of flows follower c missed.
func (h *flowHub) takeLost(c chan api.Flow) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.lostBy[c]
	delete(h.lostBy, c)
	return n
}

// history returns buffered flows (both histories), oldest first.
func (h *flowHub) history() []api.Flow {
	nd, no := h.dropped.n(), h.other.n()
	out := make([]api.Flow, 0, nd+no)
	for i, j := 0, 0; i < nd || j < no; {
		if i < nd {
			fd, sd := h.dropped.at(i)
			if j == no {
				out = append(out, fd)
				i++
				continue
			}
			if _, so := h.other.at(j); sd < so {
				out = append(out, fd)
				i++
				continue
			}
		}
		fo, _ := h.other.at(j)
		out = append(out, fo)
		j++
	}
	return out
}

func (h *flowHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for c := range h.subs {
		close(c)
		delete(h.subs, c)
	}
}

// Observe sends matching buffered flows (the last req.Last, or all with SinceStart), then
// with Follow every new matching flow until ctx ends.
func (a *Agent) Observe(ctx context.Context, req api.ObserveRequest, send func(api.Flow) error) error {
	a.awaitEvents(ctx)
	h := a.flows
	h.mu.Lock()
	var hist []api.Flow
	for _, f := range h.history() {
		if req.Matches(f) {
			hist = append(hist, f)
		}
	}
	if !req.SinceStart {
		n := req.Last
		if n < 0 {
			n = 0
		}
		if len(hist) > n {
			hist = hist[len(hist)-n:]
		}
	}
	var c chan api.Flow
	if req.Follow && !h.closed {
		c = make(chan api.Flow, 1024)
		h.subs[c] = struct{}{}
	}
	h.mu.Unlock()
	if c != nil {
		defer func() {
			h.mu.Lock()
			if _, ok := h.subs[c]; ok {
				delete(h.subs, c)
			}
			delete(h.lostBy, c)
			h.mu.Unlock()
		}()
	}
	for _, f := range hist {
		if err := send(f); err != nil {
			return err
		}
	}
	if c == nil {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case f, ok := <-c:
			if !ok {
				return nil
			}
			if req.Lost != nil {
				if n := h.takeLost(c); n > 0 {
					req.Lost(n)
				}
			}
			if req.Matches(f) {
				if err := send(f); err != nil {
					return err
				}
			}
		}
	}
}

// awaitEvents waits until the flow reader has read every event the programs had written
// when it was called, so that Observe shows the flows of packets sent just before (the
// programs do not wake the reader for each event; it polls every datapath.EventPoll). At
// most a second: a reader busy with a burst of events does not hold the caller up longer.
func (a *Agent) awaitEvents(ctx context.Context) {
	want := a.dp.Drained() + 2
	deadline := time.Now().Add(time.Second)
	for a.dp.Drained() < want && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
}
