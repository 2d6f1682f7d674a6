package agent

import (
	"errors"
	"maps"
	"net/netip"
	"sync"

	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/mapstate"
)

// fakeEndpoints is EndpointTables: the endpoints' info and policy by ifindex, and the
// interfaces attached to.
type fakeEndpoints struct {
	mu       sync.Mutex
	eps      map[uint32]fakeEP // by ifindex
	attached map[string]uint32 // ifname -> ifindex
	nextIf   uint32
	// failEndpointAfter: ApplyEndpoint fails once this many more calls succeeded (<0: never).
	failEndpointAfter int
	failAttach        bool
	failAll           bool // every ApplyEndpoint fails
	// applied records, for each ApplyEndpoint, the sequence number (see seq) and whether
	// the policy had redirect entries.
	applied []appliedEP
}

type fakeEP struct {
	info datapath.EndpointInfo
	pol  mapstate.EndpointPolicy
}

func newFakeEndpoints() *fakeEndpoints {
	return &fakeEndpoints{eps: map[uint32]fakeEP{}, attached: map[string]uint32{}, nextIf: 10, failEndpointAfter: -1}
}

func (d *fakeEndpoints) Attach(netnsPath, ifname string) (uint32, error) {
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

func (d *fakeEndpoints) ReleaseLinks(ifindex uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, idx := range d.attached {
		if idx == ifindex {
			delete(d.attached, name)
		}
	}
	return nil
}

func (d *fakeEndpoints) ApplyEndpoint(ifindex uint32, info datapath.EndpointInfo, pol mapstate.EndpointPolicy) error {
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

func (d *fakeEndpoints) RemoveEndpoint(ifindex, epID uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.eps, ifindex)
	return nil
}

func (d *fakeEndpoints) InstalledEndpoints() map[uint32]datapath.InstalledEndpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[uint32]datapath.InstalledEndpoint{}
	for idx, ep := range d.eps {
		out[idx] = datapath.InstalledEndpoint{EndpointInfo: ep.info}
	}
	return out
}

func (d *fakeEndpoints) Counters(_ string, _, epID uint32) (datapath.Counters, error) {
	return datapath.Counters{IngressPackets: uint64(epID)}, nil
}

// fakeIPCache is IPCache.
type fakeIPCache struct {
	mu      sync.Mutex
	ipcache map[netip.Prefix]mapstate.IPCacheEntry
	// failUpdate, when set, is UpdateIPCache's error (a full map, say).
	failUpdate error
}

func (d *fakeIPCache) ApplyIPCache(entries map[netip.Prefix]mapstate.IPCacheEntry) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ipcache = maps.Clone(entries)
	return nil
}

func (d *fakeIPCache) UpdateIPCache(upsert map[netip.Prefix]mapstate.IPCacheEntry, remove []netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failUpdate != nil {
		return d.failUpdate
	}
	if d.ipcache == nil {
		d.ipcache = map[netip.Prefix]mapstate.IPCacheEntry{}
	}
	maps.Copy(d.ipcache, upsert)
	for _, p := range remove {
		delete(d.ipcache, p)
	}
	return nil
}

// fakeProxyRouting is ProxyRouting.
type fakeProxyRouting struct {
	mu            sync.Mutex
	proxyNetns    string
	proxyListen   netip.AddrPort
	proxyRouted   int   // RouteToProxy calls
	proxyRoutedAt int64 // sequence number of the first
}

func (d *fakeProxyRouting) SetupProxy(netnsPath string, listen, _ netip.AddrPort) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.proxyNetns, d.proxyListen = netnsPath, listen
	return nil
}

func (d *fakeProxyRouting) RouteToProxy(netnsPath string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proxyRouted == 0 {
		d.proxyRoutedAt = seq.Add(1)
	}
	d.proxyRouted++
	return nil
}
