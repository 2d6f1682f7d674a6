package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/proxy"
)

// fakeNetwork records endpoints instead of creating namespaces.
type fakeNetwork struct {
	endpoint.Node
	mu      sync.Mutex
	eps     map[string]endpoint.Endpoint
	next    int
	failAdd bool
}

func newFakeNetwork(instance string, cidr netip.Prefix) *fakeNetwork {
	return &fakeNetwork{Node: endpoint.Node{Instance: instance, PodCIDR: cidr}, eps: map[string]endpoint.Endpoint{}, next: 100}
}

func (f *fakeNetwork) Setup() error    { return nil }
func (f *fakeNetwork) Teardown() error { return nil }
func (f *fakeNetwork) NetnsPath() string {
	return "/fake/node"
}

func (f *fakeNetwork) CreateAttached(ns, name string, ip netip.Addr, attach func(string) error) (endpoint.Endpoint, error) {
	ep, err := f.create(ns, name, ip)
	if err != nil || attach == nil {
		return ep, err
	}
	if err := attach(ep.HostIfName); err != nil {
		f.Delete(ns, name)
		return endpoint.Endpoint{}, err
	}
	return ep, nil
}

func (f *fakeNetwork) create(ns, name string, ip netip.Addr) (endpoint.Endpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAdd {
		return endpoint.Endpoint{}, errors.New("injected create failure")
	}
	key := ns + "/" + name
	if _, ok := f.eps[key]; ok {
		return endpoint.Endpoint{}, fmt.Errorf("%s exists", key)
	}
	f.next++
	ep := endpoint.Endpoint{Namespace: ns, Name: name, IP: ip, HostIfName: f.HostIfName(ns, name), HostIfIndex: f.next}
	f.eps[key] = ep
	return ep, nil
}

func (f *fakeNetwork) Lookup(ns, name string, ip netip.Addr) (endpoint.Endpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ep, ok := f.eps[ns+"/"+name]
	if !ok {
		return ep, errors.New("missing")
	}
	return ep, nil
}

func (f *fakeNetwork) Delete(ns, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.eps, ns+"/"+name)
	return nil
}

func (f *fakeNetwork) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.eps)
}

// fakeDatapath keeps what it was given, like the maps would, and can fail on demand.
type fakeDatapath struct {
	mu       sync.Mutex
	drained  atomic.Uint64
	ipcache  map[netip.Prefix]mapstate.IPCacheEntry
	eps      map[int]fakeEP // by ifindex
	attached map[string]int // ifname -> ifindex
	nextIf   int
	// failEndpointAfter: ApplyEndpoint fails once this many more calls succeeded (<0: never).
	failEndpointAfter int
	failAttach        bool
	failAll           bool // every ApplyEndpoint fails
	proxyNetns        string
	proxyListen       netip.AddrPort
	sockPairs         []SockPair // the last ApplySockPairs
	proxyRouted       int        // RouteToProxy calls
	proxyRoutedAt     int64      // sequence number of the first
	// applied records, for each ApplyEndpoint, the sequence number (see seq) and whether
	// the policy had redirect entries.
	applied   []appliedEP
	events    chan FlowEvent
	closed    chan struct{}
	closeOnce sync.Once

	// CIDR set tables: the prefixes of each set, as the dataplane keeps them; an address is
	// a member while any prefix of the set covers it.
	sets map[uint8][]netip.Prefix
	// setCalls records every set table call in order ("replace", "add", "remove").
	setCalls []setCall
	// failReplace makes ReplaceCIDRSets fail this many more times; failAddCIDRs makes
	// AddCIDRs fail once.
	failReplace  int
	failAddCIDRs bool
	// replaceDelay makes ReplaceCIDRSets take at least this long.
	replaceDelay time.Duration
}

type setCall struct {
	seq   int64
	op    string
	index uint8
	sets  map[uint8]int // replace: prefixes per set
	n     int           // add/remove: prefixes
}

type fakeEP struct {
	info EndpointInfo
	pol  mapstate.EndpointPolicy
}

func newFakeDatapath() *fakeDatapath {
	return &fakeDatapath{
		ipcache:           map[netip.Prefix]mapstate.IPCacheEntry{},
		eps:               map[int]fakeEP{},
		attached:          map[string]int{},
		nextIf:            10,
		failEndpointAfter: -1,
		events:            make(chan FlowEvent, 16),
		closed:            make(chan struct{}),
	}
}

// reopen returns a datapath sharing the "pinned" state, as datapath.Open does.
func (d *fakeDatapath) reopen() *fakeDatapath {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := newFakeDatapath()
	n.ipcache = maps.Clone(d.ipcache)
	n.eps = maps.Clone(d.eps)
	n.attached = maps.Clone(d.attached)
	n.nextIf = d.nextIf
	n.sets = maps.Clone(d.sets)
	return n
}

func (d *fakeDatapath) ReplaceCIDRSets(sets map[uint8][]netip.Prefix) (CIDRSetStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	call := setCall{seq: seq.Add(1), op: "replace", sets: map[uint8]int{}}
	for i, ps := range sets {
		call.sets[i] = len(ps)
	}
	d.setCalls = append(d.setCalls, call)
	time.Sleep(d.replaceDelay) // stands for the work of a rebuild, for the timing test
	if d.failReplace > 0 {
		d.failReplace--
		return CIDRSetStats{}, errors.New("injected set table failure")
	}
	d.sets = map[uint8][]netip.Prefix{}
	st := CIDRSetStats{MemoryBytes: 1 << 20}
	for i, ps := range sets {
		d.sets[i] = slices.Clone(ps)
		for _, p := range ps {
			st.Prefixes++
			if p.Addr().Is4() {
				st.IPv4++
			} else {
				st.IPv6++
			}
		}
	}
	return st, nil
}

func (d *fakeDatapath) AddCIDRs(index uint8, prefixes []netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setCalls = append(d.setCalls, setCall{seq: seq.Add(1), op: "add", index: index, n: len(prefixes)})
	if d.failAddCIDRs {
		d.failAddCIDRs = false
		return errors.New("injected host table full")
	}
	if d.sets == nil {
		d.sets = map[uint8][]netip.Prefix{}
	}
	d.sets[index] = append(d.sets[index], prefixes...)
	return nil
}

func (d *fakeDatapath) RemoveCIDRs(index uint8, prefixes []netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setCalls = append(d.setCalls, setCall{seq: seq.Add(1), op: "remove", index: index, n: len(prefixes)})
	d.sets[index] = slices.DeleteFunc(d.sets[index], func(q netip.Prefix) bool { return slices.Contains(prefixes, q) })
	return nil
}

func (d *fakeDatapath) CIDRSetMembership(addr netip.Addr) (uint32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var m uint32
	for i, ps := range d.sets {
		if slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(addr) }) {
			m |= 1 << i
		}
	}
	return m, nil
}

// calls returns the recorded set table calls.
func (d *fakeDatapath) calls() []setCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.setCalls)
}

func (d *fakeDatapath) Attach(netnsPath, ifname string) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failAttach {
		return 0, errors.New("injected attach failure")
	}
	if idx, ok := d.attached[ifname]; ok {
		return idx, nil
	}
	d.nextIf++
	d.attached[ifname] = d.nextIf
	return d.nextIf, nil
}

func (d *fakeDatapath) ReleaseLinks(ifindex int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, idx := range d.attached {
		if idx == ifindex {
			delete(d.attached, name)
		}
	}
	return nil
}

func (d *fakeDatapath) ApplyEndpoint(ifindex int, info EndpointInfo, pol mapstate.EndpointPolicy) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failAll {
		return errors.New("injected permanent failure")
	}
	if d.failEndpointAfter == 0 {
		d.failEndpointAfter = -1
		return errors.New("injected map full")
	}
	if d.failEndpointAfter > 0 {
		d.failEndpointAfter--
	}
	d.eps[ifindex] = fakeEP{info: info, pol: pol}
	redirect := false
	for _, v := range pol.Entries {
		redirect = redirect || v.Redirect
	}
	d.applied = append(d.applied, appliedEP{seq: seq.Add(1), epID: info.EpID, redirect: redirect})
	return nil
}

type appliedEP struct {
	seq      int64
	epID     uint32
	redirect bool
}

// seq orders calls across the fakes.
var seq atomic.Int64

// fakeProxy records what the agent asks of the L7 proxy.
type fakeProxy struct {
	mu       sync.Mutex
	updates  []proxyUpdate
	started  int
	closed   bool
	failNext error // the next Update fails with it
}

type proxyUpdate struct {
	seq  int64
	plan *l7plan.Plan
}

func (p *fakeProxy) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.started++
}

func (p *fakeProxy) Update(ctx context.Context, plan *l7plan.Plan) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.updates = append(p.updates, proxyUpdate{seq: seq.Add(1), plan: plan})
	if err := p.failNext; err != nil {
		p.failNext = nil
		return err
	}
	return nil
}

func (p *fakeProxy) Status() proxy.Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return proxy.Status{Running: p.started > 0, Connected: p.started > 0, PID: 4242, Version: uint64(len(p.updates)), AckedVersion: uint64(len(p.updates))}
}

func (p *fakeProxy) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

func (p *fakeProxy) last() proxyUpdate {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.updates[len(p.updates)-1]
}

func (p *fakeProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.updates)
}

func (d *fakeDatapath) RemoveEndpoint(ifindex int, epID uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.eps, ifindex)
	return nil
}

func (d *fakeDatapath) Installed() map[int]uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[int]uint32{}
	for idx, ep := range d.eps {
		out[idx] = ep.info.EpID
	}
	return out
}

func (d *fakeDatapath) ApplyIPCache(entries map[netip.Prefix]mapstate.IPCacheEntry) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ipcache = maps.Clone(entries)
	return nil
}

func (d *fakeDatapath) UpdateIPCache(upsert map[netip.Prefix]mapstate.IPCacheEntry, remove []netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ipcache == nil {
		d.ipcache = map[netip.Prefix]mapstate.IPCacheEntry{}
	}
	maps.Copy(d.ipcache, upsert)
	for _, p := range remove {
		delete(d.ipcache, p)
	}
	return nil
}

func (d *fakeDatapath) SetupProxy(netnsPath string, listen netip.AddrPort) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.proxyNetns, d.proxyListen = netnsPath, listen
	return nil
}

func (d *fakeDatapath) RouteToProxy(netnsPath string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proxyRouted == 0 {
		d.proxyRoutedAt = seq.Add(1)
	}
	d.proxyRouted++
	return nil
}

func (d *fakeDatapath) Counters(_ string, _ int, epID uint32) (api.Counters, error) {
	return api.Counters{IngressPackets: uint64(epID)}, nil
}

// EventsDrained grows on every call: the fake's events reach the agent through a channel,
// with nothing left behind in a ring.
func (d *fakeDatapath) EventsDrained() uint64 { return d.drained.Add(1) }

func (d *fakeDatapath) ReadEvent() (FlowEvent, error) {
	select {
	case ev := <-d.events:
		return ev, nil
	case <-d.closed:
		return FlowEvent{}, errors.New("closed")
	}
}

func (d *fakeDatapath) ApplySockPairs(pairs []SockPair) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sockPairs = pairs
	return nil
}

func (d *fakeDatapath) ReadSockRequest() (flow.AccessLog, error) {
	<-d.closed
	return flow.AccessLog{}, errors.New("closed")
}

func (d *fakeDatapath) SockStatus() (api.SendSideStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, p := range d.sockPairs {
		if p.Listed {
			n++
		}
	}
	return api.SendSideStatus{Pairs: n}, nil
}

func (d *fakeDatapath) MapMemory() ([]api.MapMemory, error) {
	return []api.MapMemory{{Name: "fake", Type: "Array", MaxEntries: 1, Bytes: 4096}}, nil
}

func (d *fakeDatapath) Close() error {
	d.closeOnce.Do(func() { close(d.closed) })
	return nil
}

// snapshot returns a deep enough copy to compare states.
func (d *fakeDatapath) snapshot() (map[netip.Prefix]mapstate.IPCacheEntry, map[int]fakeEP) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.ipcache), maps.Clone(d.eps)
}
