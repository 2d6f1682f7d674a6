package sockverdict

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"reflect"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/l7table"
	"github.com/rampartnet/rampart/internal/policy"
)

// Pair is a pair of local endpoints with L7 rules on Port, and what the verdict does with
// it: Listed, it checks the pair's requests on the client's socket against Table; not
// listed, the pair's connections go to the proxy, and Table (nil: refuse everything) is
// for the open connections of a pair listed before.
type Pair struct {
	Listed                   bool
	Client, Server           netip.Addr
	ClientEpID, ServerEpID   uint32
	ClientNetns, ServerNetns string // network namespace paths
	Port                     uint16
	Table                    *l7table.Table
}

// sockPairKey names a pair in the dataplane.
type sockPairKey struct {
	client, server netip.Addr
	port           uint16
}

type sockPairState struct {
	pair Pair
	slot uint32
}

// Manager keeps the send-side verdict of one dataplane: opened on first use (and then
// kept: its programs and maps are pinned), with the pairs it lists and their slots. Its
// methods are safe for concurrent use.
type Manager struct {
	mu      sync.Mutex
	pinDir  string // the dataplane's pin directory, where the verdict's pins go too
	tc      *Pairs // tc's list of the pairs (sv_pairs)
	sv      *Verdict
	events  *EventReader
	opened  chan struct{} // closed once sv is open
	closed  chan struct{}
	pairs   map[sockPairKey]*sockPairState // listed
	retired map[sockPairKey]*sockPairState // no longer listed; open connections may hold the slot
	taken   map[uint32]bool                // slots of listed and retired pairs, and unknown ones left by an earlier run
	next    uint32                         // where the search for a free slot starts
	cookies map[string]uint64              // netns path -> cookie
	read    bool                           // the pinned pairs were read back
}

// NewManager returns the manager of the verdict pinned in pinDir (the dataplane's pin
// directory), whose pairs tc reads from svPairs (datapath.(*Datapath).SockPairsMap). The
// verdict is loaded by the first ApplySockPairs with pairs to list or pinned pairs to take
// back.
func NewManager(pinDir string, svPairs *ebpf.Map) (*Manager, error) {
	tc, err := NewPairs(svPairs)
	if err != nil {
		return nil, err
	}
	return &Manager{pinDir: pinDir, tc: tc, opened: make(chan struct{}), closed: make(chan struct{}), pairs: map[sockPairKey]*sockPairState{},
		retired: map[sockPairKey]*sockPairState{}, taken: map[uint32]bool{}, cookies: map[string]uint64{}}, nil
}

// passAll is the table of a retired pair to which no L7 rules apply any more.
var passAll = &l7table.Table{Header: l7table.Header{Pass: l7table.Masks{1, 1}}}

// ApplySockPairs makes the pairs whose L7 rules the verdict checks exactly the listed
// ones of pairs (nil: none; their new connections go to the proxy again), and gives the
// open connections of pairs no longer listed the table of their entry (nil: refuse
// everything).
func (ss *Manager) ApplySockPairs(pairs []Pair) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !ss.read {
		// Pairs a previous run listed keep their slots: their open connections hold them.
		pinned, err := ss.tc.List()
		if err != nil {
			return err
		}
		for k, slot := range pinned {
			ss.pairs[sockPairKey{k.Client, k.Server, k.Port}] = &sockPairState{pair: Pair{Client: k.Client, Server: k.Server, Port: k.Port}, slot: slot}
			ss.taken[slot] = true
		}
		ss.read = true
	}
	var want []Pair
	info := map[sockPairKey]Pair{}
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
		if err := ss.open(); err != nil {
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
		if err := ss.tc.Delete(k.client, k.server, k.port); err != nil {
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
		if err := ss.setPair(st.slot, p); err != nil {
			errs = append(errs, err)
			continue
		}
		st.pair = p
	}
	return errors.Join(errs...)
}

// open loads (or takes over) the verdict, and learns which slots an earlier run left
// tables in: they stay taken until no connection holds them.
func (ss *Manager) open() error {
	cg, err := Cgroup2Root()
	if err != nil {
		return err
	}
	if ss.sv, err = Open(cg, ss.pinDir); err != nil {
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
func (ss *Manager) retire(st *sockPairState, p Pair) error {
	t := p.Table
	if t != nil && t.Header.Pass[l7table.Egress] != 0 && t.Header.Pass[l7table.Ingress] != 0 {
		t = passAll
	}
	st.pair.Table = p.Table
	return ss.sv.SetSlot(st.slot, t)
}

// freeSlot finds a slot no pair has, reclaiming retired slots that no open connection
// holds any more when there is none.
func (ss *Manager) freeSlot() (uint32, error) {
	for round := 0; round < 2; round++ {
		for i := uint32(1); i < SlotCount; i++ {
			slot := (ss.next+i)%(SlotCount-1) + 1
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

func (ss *Manager) listedSlot(slot uint32) bool {
	for _, st := range ss.pairs {
		if st.slot == slot {
			return true
		}
	}
	return false
}

// setPair writes the pair's table, then its two targets, then tells tc.
func (ss *Manager) setPair(slot uint32, p Pair) error {
	if err := ss.sv.SetSlot(slot, p.Table); err != nil {
		return err
	}
	for _, t := range []struct {
		netns         string
		local, remote netip.Addr
		side          int
	}{{p.ClientNetns, p.Client, p.Server, SideClient}, {p.ServerNetns, p.Server, p.Client, SideServer}} {
		cookie, err := ss.cookie(t.netns)
		if err != nil {
			return err
		}
		if err := ss.sv.SetTarget(cookie, t.local, t.remote, p.Port, t.side, slot); err != nil {
			return err
		}
	}
	return ss.tc.Set(p.Client, p.Server, p.Port, slot)
}

func (ss *Manager) deleteTargets(p Pair) error {
	var errs []error
	for _, t := range []struct {
		netns         string
		local, remote netip.Addr
		side          int
	}{{p.ClientNetns, p.Client, p.Server, SideClient}, {p.ServerNetns, p.Server, p.Client, SideServer}} {
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

func (ss *Manager) cookie(netns string) (uint64, error) {
	if c, ok := ss.cookies[netns]; ok {
		return c, nil
	}
	c, err := NetnsCookie(netns)
	if err != nil {
		return 0, err
	}
	ss.cookies[netns] = c
	return c, nil
}

// ReadSockRequest blocks until the verdict reports a request, as the access log record
// the proxy would have written; it fails once Close was called.
func (ss *Manager) ReadSockRequest() (flow.AccessLog, error) {
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

// Status is the verdict's pairs and counters.
type Status struct {
	Pairs                                                  int // pairs listed now
	Passed, Refused, OutsideSubset, SendFailed, EventsLost uint64
}

// SockStatus returns the verdict's pairs and counters (zero counters while it is not
// loaded).
func (ss *Manager) SockStatus() (Status, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st := Status{Pairs: len(ss.pairs)}
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

// Programs returns the verdict's programs (none while it is not loaded), for the memory of
// the maps they use (datapath.(*Datapath).MapMemory).
func (ss *Manager) Programs() []*ebpf.Program {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.sv == nil {
		return nil
	}
	return ss.sv.Programs()
}

// Close releases the process's handles and makes ReadSockRequest fail; the verdict's
// programs and maps stay (pinned), like the tc programs.
func (ss *Manager) Close() error {
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
func sockAccessLog(ev Event, t *l7table.Table, st *sockPairState) flow.AccessLog {
	l := flow.AccessLog{
		Time: ev.Time, Chain: flow.FlagSendSide.String(), Src: ev.Client, Dst: ev.Server, Protocol: "HTTP/1.1",
		Method: ev.Method, Path: ev.Path, Host: ev.Host, Status: uint32(ev.Status), Latency: ev.Latency,
	}
	switch ev.Verdict {
	case Passed:
		l.Upstream, l.Details = true, detailSendSidePassed
	case Refused:
		l.Denied, l.Details = true, detailSendSideRefused
	case Malformed:
		l.Details = detailSendSideMalformed
	default:
		l.Denied, l.Details = true, detailSendSideFailed
	}
	if t == nil || st == nil || ev.Verdict == Malformed {
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
