package agent

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"reflect"
	"slices"
	"sync"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/l7table"
	"github.com/rampartnet/rampart/internal/policy"
)

// The send-side L7 verdict in the agent (Config.L7SendSide; docs/design-l7-send-side.md):
//
//   - After every change, sockPairs goes through each pair of local endpoints and port
//     with L7 rules: a pair is listed when l7table compiles what the proxy plan says about
//     its requests into a table the kernel matches exactly. Pairs whose rules it cannot
//     match stay on the proxy.
//   - The dataplane writes a listed pair's table and the targets of its two sockets before
//     tc sends the pair's new connections straight to the server. When a pair stops being
//     listed, tc stops first; its open connections keep their slot, whose table becomes
//     what the proxy would now decide for them (the plan with the old state's chains kept:
//     every request passes when L7 rules no longer apply but L3/L4 still allows, none when
//     nothing allows them or the new rules cannot be matched in the kernel). Such a
//     retired slot is not given to another pair while connections hold it.
//   - Requests the verdict decided on become L7 flows like the proxy's access logs.

// sockPairs computes, for every ordered pair of local IPv4 endpoints and port with a
// chain in the plan of the change (pl.kept: new's, keeping old's chains), what the
// send-side verdict does: listed (Listed, with the table of new's plan) when the table
// compiles and restricts something; otherwise the table the pair's open connections get if
// it was listed before (nil: refuse everything).
func sockPairs(m *model, pl l7Plans, net Network) []SockPair {
	plan, kept := pl.plan, pl.kept
	if len(kept.Chains) == 0 {
		return nil
	}
	var ports []uint16
	for _, c := range kept.Chains {
		if !slices.Contains(ports, c.Port) {
			ports = append(ports, c.Port)
		}
	}
	slices.Sort(ports)
	var eps []*EndpointRecord
	for _, k := range sortedKeys(m.endpoints) {
		if e := m.endpoints[k]; e.IP.Is4() {
			eps = append(eps, e)
		}
	}
	var pairs []SockPair
	for _, port := range ports {
		for _, c := range eps {
			for _, s := range eps {
				if c == s || kept.Chain(c.IP, s.IP, port) == nil {
					continue
				}
				p := SockPair{
					Client: c.IP, Server: s.IP, ClientEpID: c.EpID, ServerEpID: s.EpID, Port: port,
					ClientNetns: endpoint.NetnsPath(net.EndpointNetns(c.Namespace, c.Name)),
					ServerNetns: endpoint.NetnsPath(net.EndpointNetns(s.Namespace, s.Name)),
				}
				if t, err := l7table.Compile(plan, c.IP, s.IP, port); err == nil && restricts(t) {
					p.Table, p.Listed = t, true
				} else if t, err := l7table.Compile(kept, c.IP, s.IP, port); err == nil {
					p.Table = t
				}
				pairs = append(pairs, p)
			}
		}
	}
	return pairs
}

// restricts says whether a table is worth listing: some side has rules, and no side
// refuses everything (a peer without grants, whose connections the dataplane refuses at
// L3/L4 before any request).
func restricts(t *l7table.Table) bool {
	some := false
	for side := range t.Rules {
		switch {
		case t.Header.Pass[side] != 0:
		case len(t.Rules[side]) == 0:
			return false
		default:
			some = true
		}
	}
	return some
}

// applySendSide gives the dataplane the pairs of the change's plans (none listed when the
// option is off).
func (a *Agent) applySendSide(m *model, pl l7Plans) error {
	var pairs []SockPair
	if a.cfg.L7SendSide {
		pairs = sockPairs(m, pl, a.net)
	}
	if err := a.dp.ApplySockPairs(pairs); err != nil {
		return fmt.Errorf("send-side L7 verdict: %w", err)
	}
	return nil
}

// readSockRequests publishes the send-side verdict's requests as L7 flows.
func (a *Agent) readSockRequests(done chan<- struct{}) {
	defer close(done)
	for {
		l, err := a.dp.ReadSockRequest()
		if err != nil {
			return
		}
		a.onAccessLog(l)
	}
}

// sockPairKey names a pair in the dataplane.
type sockPairKey struct {
	client, server netip.Addr
	port           uint16
}

type sockPairState struct {
	pair SockPair
	slot uint32
}

// sendSide is realDatapath's part for the send-side verdict: opened on first use (and
// then kept: its programs and maps are pinned), with the pairs it lists and their slots.
type sendSide struct {
	mu      sync.Mutex
	sv      *datapath.SockVerdict
	events  *datapath.SockEventReader
	opened  chan struct{} // closed once sv is open
	closed  chan struct{}
	pairs   map[sockPairKey]*sockPairState // listed
	retired map[sockPairKey]*sockPairState // no longer listed; open connections may hold the slot
	taken   map[uint32]bool                // slots of listed and retired pairs, and unknown ones left by an earlier run
	next    uint32                         // where the search for a free slot starts
	cookies map[string]uint64              // netns path -> cookie
	read    bool                           // the pinned pairs were read back
}

func newSendSide() *sendSide {
	return &sendSide{opened: make(chan struct{}), closed: make(chan struct{}), pairs: map[sockPairKey]*sockPairState{},
		retired: map[sockPairKey]*sockPairState{}, taken: map[uint32]bool{}, cookies: map[string]uint64{}}
}

// passAll is the table of a retired pair to which no L7 rules apply any more.
var passAll = &l7table.Table{Header: l7table.Header{Pass: l7table.Masks{1, 1}}}

func (r *realDatapath) ApplySockPairs(pairs []SockPair) error {
	ss := r.side
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !ss.read {
		// Pairs a previous run listed keep their slots: their open connections hold them.
		pinned, err := r.dp.SockPairs()
		if err != nil {
			return err
		}
		for k, slot := range pinned {
			ss.pairs[sockPairKey{k.Client, k.Server, k.Port}] = &sockPairState{pair: SockPair{Client: k.Client, Server: k.Server, Port: k.Port}, slot: slot}
			ss.taken[slot] = true
		}
		ss.read = true
	}
	var want []SockPair
	info := map[sockPairKey]SockPair{}
	for _, p := range pairs {
		k := sockPairKey{p.Client, p.Server, p.Port}
		info[k] = p
		if p.Listed {
			want = append(want, p)
		}
	}
	// Opened when there are pairs to list, or pinned ones to take back (their open
	// connections must stop being let through under the old tables).
	if (len(want) > 0 || len(ss.pairs) > 0) && ss.sv == nil {
		if err := ss.open(r.dp); err != nil {
			return err
		}
	}
	var errs []error
	// Gone first, tc before the tables: new connections go to the proxy, open ones get
	// what the proxy would decide for them now.
	for k, st := range ss.pairs {
		if p, ok := info[k]; ok && p.Listed {
			continue
		}
		if err := r.dp.DeleteSockPair(k.client, k.server, k.port); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(ss.pairs, k)
		ss.retired[k] = st
		errs = append(errs, ss.retire(st, info[k]), ss.deleteTargets(st.pair))
	}
	// Retired pairs follow the policy too.
	for k, st := range ss.retired {
		if p, ok := info[k]; ok && !p.Listed && !reflect.DeepEqual(p.Table, st.pair.Table) {
			errs = append(errs, ss.retire(st, p))
		}
	}
	for _, p := range want {
		k := sockPairKey{p.Client, p.Server, p.Port}
		st := ss.pairs[k]
		if st != nil && st.pair.ClientNetns != "" && reflect.DeepEqual(st.pair, p) {
			continue
		}
		if st == nil {
			if st = ss.retired[k]; st != nil {
				delete(ss.retired, k) // the same pair again: its open connections are its own
			} else {
				slot, err := ss.freeSlot()
				if err != nil {
					errs = append(errs, err)
					continue
				}
				st = &sockPairState{slot: slot}
				ss.taken[slot] = true
			}
			ss.pairs[k] = st
		}
		if err := ss.setPair(r.dp, st.slot, p); err != nil {
			errs = append(errs, err)
			continue
		}
		st.pair = p
	}
	return errors.Join(errs...)
}

// open loads (or takes over) the verdict, and learns which slots an earlier run left
// tables in: they stay taken until no connection holds them.
func (ss *sendSide) open(dp *datapath.Datapath) error {
	cg, err := datapath.Cgroup2Root()
	if err != nil {
		return err
	}
	if ss.sv, err = datapath.OpenSockVerdict(cg, dp.PinDir()); err != nil {
		return err
	}
	if ss.events, err = ss.sv.Events(); err != nil {
		ss.sv.Close()
		ss.sv = nil
		return err
	}
	for _, slot := range ss.sv.Slots() {
		ss.taken[slot] = true
	}
	close(ss.opened)
	return nil
}

// retire gives a pair that is no longer listed the table the proxy would decide its open
// connections by (p: its entry in the last computation, if any).
func (ss *sendSide) retire(st *sockPairState, p SockPair) error {
	t := p.Table
	if t != nil && t.Header.Pass[l7table.Egress] != 0 && t.Header.Pass[l7table.Ingress] != 0 {
		t = passAll
	}
	st.pair.Table = p.Table
	return ss.sv.SetSlot(st.slot, t)
}

// freeSlot finds a slot no pair has, reclaiming retired slots that no open connection
// holds any more when there is none.
func (ss *sendSide) freeSlot() (uint32, error) {
	for round := 0; round < 2; round++ {
		for i := uint32(1); i < datapath.SockVerdictSlots; i++ {
			slot := (ss.next+i)%(datapath.SockVerdictSlots-1) + 1
			if !ss.taken[slot] {
				ss.next = slot
				return slot, nil
			}
		}
		used, err := ss.sv.SlotsInUse()
		if err != nil {
			return 0, err
		}
		for slot := range ss.taken {
			if used[slot] || ss.listedSlot(slot) {
				continue
			}
			if err := ss.sv.SetSlot(slot, nil); err != nil {
				return 0, err
			}
			delete(ss.taken, slot)
			for k, st := range ss.retired {
				if st.slot == slot {
					delete(ss.retired, k)
				}
			}
		}
	}
	return 0, fmt.Errorf("no free send-side slot (%d pairs)", len(ss.pairs))
}

func (ss *sendSide) listedSlot(slot uint32) bool {
	for _, st := range ss.pairs {
		if st.slot == slot {
			return true
		}
	}
	return false
}

func sortedPairKeys(m map[sockPairKey]SockPair) []sockPairKey {
	keys := make([]sockPairKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b sockPairKey) int {
		if c := a.client.Compare(b.client); c != 0 {
			return c
		}
		if c := a.server.Compare(b.server); c != 0 {
			return c
		}
		return int(a.port) - int(b.port)
	})
	return keys
}

// setPair writes the pair's table, then its two targets, then tells tc.
func (ss *sendSide) setPair(dp *datapath.Datapath, slot uint32, p SockPair) error {
	if err := ss.sv.SetSlot(slot, p.Table); err != nil {
		return err
	}
	for _, t := range []struct {
		netns         string
		local, remote netip.Addr
		side          int
	}{{p.ClientNetns, p.Client, p.Server, datapath.SideClient}, {p.ServerNetns, p.Server, p.Client, datapath.SideServer}} {
		cookie, err := ss.cookie(t.netns)
		if err != nil {
			return err
		}
		if err := ss.sv.SetTarget(cookie, t.local, t.remote, p.Port, t.side, slot); err != nil {
			return err
		}
	}
	return dp.SetSockPair(p.Client, p.Server, p.Port, slot)
}

func (ss *sendSide) deleteTargets(p SockPair) error {
	var errs []error
	for _, t := range []struct {
		netns         string
		local, remote netip.Addr
		side          int
	}{{p.ClientNetns, p.Client, p.Server, datapath.SideClient}, {p.ServerNetns, p.Server, p.Client, datapath.SideServer}} {
		if t.netns == "" {
			continue // read back from the pins: its targets are unknown, and harmless without tc
		}
		cookie, err := ss.cookie(t.netns)
		if err != nil {
			continue // the namespace is gone, and its sockets with it
		}
		errs = append(errs, ss.sv.DeleteTarget(cookie, t.local, t.remote, p.Port, t.side))
	}
	return errors.Join(errs...)
}

func (ss *sendSide) cookie(netns string) (uint64, error) {
	if c, ok := ss.cookies[netns]; ok {
		return c, nil
	}
	c, err := datapath.NetnsCookie(netns)
	if err != nil {
		return 0, err
	}
	ss.cookies[netns] = c
	return c, nil
}

func (r *realDatapath) ReadSockRequest() (flow.AccessLog, error) {
	ss := r.side
	select {
	case <-ss.opened:
	case <-ss.closed:
		return flow.AccessLog{}, errors.New("closed")
	}
	ev, err := ss.events.Read()
	if err != nil {
		return flow.AccessLog{}, err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return sockAccessLog(ev, ss.sv.Table(ev.Table), ss.pairs[sockPairKey{ev.Client.Addr(), ev.Server.Addr(), ev.Server.Port()}]), nil
}

func (r *realDatapath) SockStatus() (api.SendSideStatus, error) {
	ss := r.side
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st := api.SendSideStatus{Pairs: len(ss.pairs)}
	if ss.sv == nil {
		return st, nil
	}
	c, err := ss.sv.Counts()
	if err != nil {
		return st, err
	}
	st.Passed, st.Refused, st.OutsideSubset, st.SendFailed, st.EventsLost = c.Passed, c.Refused, c.Malformed, c.SendFailed, c.EventsLost
	return st, nil
}

func (ss *sendSide) close() error {
	select {
	case <-ss.closed:
		return nil
	default:
	}
	close(ss.closed)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var errs []error
	if ss.events != nil {
		errs = append(errs, ss.events.Close())
	}
	if ss.sv != nil {
		errs = append(errs, ss.sv.Close())
	}
	return errors.Join(errs...)
}

// Details of send-side access logs (as Envoy's response code details).
const (
	detailSendSidePassed    = "send_side_passed"
	detailSendSideRefused   = "send_side_access_denied"
	detailSendSideMalformed = "send_side_outside_subset"
	detailSendSideFailed    = "send_side_refused_send_failed"
)

// sockAccessLog turns a send-side event into the access log record the proxy would have
// written, with each side's decision named from the table's rules (t nil: the table was
// replaced since; st nil: the pair is gone).
func sockAccessLog(ev datapath.SockEvent, t *l7table.Table, st *sockPairState) flow.AccessLog {
	l := flow.AccessLog{
		Time: ev.Time, Chain: "send-side", Src: ev.Client, Dst: ev.Server, Protocol: "HTTP/1.1",
		Method: ev.Method, Path: ev.Path, Host: ev.Host, Status: uint32(ev.Status), Latency: ev.Latency,
	}
	switch ev.Verdict {
	case datapath.SockPassed:
		l.Upstream, l.Details = true, detailSendSidePassed
	case datapath.SockRefused:
		l.Denied, l.Details = true, detailSendSideRefused
	case datapath.SockMalformed:
		l.Details = detailSendSideMalformed
	default:
		l.Denied, l.Details = true, detailSendSideFailed
	}
	if t == nil || st == nil || ev.Verdict == datapath.SockMalformed {
		return l
	}
	for side, dir := range []policy.Direction{policy.Egress, policy.Ingress} {
		if t.Header.Pass[side] != 0 && len(t.Rules[side]) == 0 {
			continue // no L7 rules on this side for this pair
		}
		d := &flow.Decision{EndpointID: st.pair.ClientEpID, Direction: dir}
		if side == l7table.Ingress {
			d.EndpointID = st.pair.ServerEpID
		}
		if m := ev.Rules[side]; m != 0 {
			d.Allowed = true
			if bit := bits.TrailingZeros64(m); bit < len(t.Rules[side]) {
				d.Grant, d.RuleID = t.Rules[side][bit].Grant, t.Rules[side][bit].RuleID
			}
		}
		if side == l7table.Egress {
			l.Egress = d
		} else {
			l.Ingress = d
		}
	}
	return l
}
