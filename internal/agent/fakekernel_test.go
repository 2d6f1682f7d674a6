package agent

import (
	"github.com/rampartnet/rampart/internal/dnsproxy"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/overlay"
)

// fakeKernel stands in for the kernel packages: one fake per interface of Kernel, which
// keeps what it was given as the maps would and can fail on demand. Their fields are
// reached through it (h.dp.ipcache, h.dp.sets...).
type fakeKernel struct {
	*fakeEndpoints
	*fakeIPCache
	*fakeProxyRouting
	*fakeEvents
	*fakeCIDRSets
	*fakeSendSide
	*fakeOverlay
	// taps is the tap table; nil: the dataplane has no taps (Kernel.Taps nil).
	taps *fakeTaps
	// services is the Service translation; nil: none (Kernel.Services nil).
	services *fakeServices
	// conntrackPeers is what ConntrackPeers reports (the peers of live flows).
	conntrackPeers map[netip.Addr]bool
	dnsProxy       netip.AddrPort // what SetDNSProxy was told
	closeOnce      sync.Once
	closed         chan struct{} // closed by Close: Read and ReadSockRequest fail
}

func newFakeKernel() *fakeKernel {
	closed := make(chan struct{})
	return &fakeKernel{
		fakeEndpoints:    newFakeEndpoints(),
		fakeIPCache:      &fakeIPCache{ipcache: map[netip.Prefix]mapstate.IPCacheEntry{}},
		fakeProxyRouting: &fakeProxyRouting{},
		fakeEvents:       &fakeEvents{events: make(chan flow.Event, 16), closed: closed},
		fakeCIDRSets:     &fakeCIDRSets{},
		fakeSendSide:     &fakeSendSide{closed: closed},
		fakeOverlay:      &fakeOverlay{},
		closed:           closed,
	}
}

// kernel returns the Kernel the agent gets.
func (k *fakeKernel) kernel() Kernel {
	kern := Kernel{
		EndpointTables: k.fakeEndpoints, IPCache: k.fakeIPCache, ProxyRouting: k.fakeProxyRouting,
		FlowEvents: k.fakeEvents, CIDRSets: k.fakeCIDRSets, SendSide: k.fakeSendSide, MapMemories: fakeMemory{},
		Overlay: k.fakeOverlay, Close: k.Close, DNS: fakeDNS{k},
	}
	if k.taps != nil {
		kern.Taps, kern.Monitors = k.taps, k.taps
	}
	if k.services != nil {
		kern.Services = k.services
	}
	return kern
}

// reopen returns a kernel sharing the "pinned" state, as opening the kernel packages
// again does.
func (k *fakeKernel) reopen() *fakeKernel {
	n := newFakeKernel()
	k.fakeEndpoints.mu.Lock()
	n.eps = maps.Clone(k.eps)
	n.attached = maps.Clone(k.attached)
	n.nextIf = k.nextIf
	k.fakeEndpoints.mu.Unlock()
	k.fakeIPCache.mu.Lock()
	n.ipcache = maps.Clone(k.ipcache)
	k.fakeIPCache.mu.Unlock()
	k.fakeCIDRSets.mu.Lock()
	n.sets = maps.Clone(k.sets)
	k.fakeCIDRSets.mu.Unlock()
	n.taps = k.taps // pinned like the maps
	if k.services != nil {
		n.services = &fakeServices{} // not pinned: a new agent starts with empty maps
	}
	return n
}

func (k *fakeKernel) Close() error {
	k.closeOnce.Do(func() { close(k.closed) })
	return nil
}

// snapshot returns a deep enough copy to compare states.
func (k *fakeKernel) snapshot() (map[netip.Prefix]mapstate.IPCacheEntry, map[uint32]fakeEP) {
	k.fakeIPCache.mu.Lock()
	ipc := maps.Clone(k.ipcache)
	k.fakeIPCache.mu.Unlock()
	k.fakeEndpoints.mu.Lock()
	defer k.fakeEndpoints.mu.Unlock()
	return ipc, maps.Clone(k.eps)
}

// fakeMemory reports one map.
type fakeMemory struct{}

func (fakeMemory) MapMemory(...*ebpf.Program) ([]datapath.MapUsage, error) {
	return []datapath.MapUsage{{Name: "fake", Type: "Array", MaxEntries: 1, Bytes: 4096}}, nil
}

// fakeOverlay records the overlay's mode and the routes to other nodes.
type fakeOverlay struct {
	mu     sync.Mutex
	mode   overlay.Mode
	routes []overlay.Node
}

func (o *fakeOverlay) SetupOverlay(_ string, mode overlay.Mode) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mode = mode
	return nil
}

func (o *fakeOverlay) SyncNodeRoutes(_ string, _ overlay.Mode, _ netip.Addr, nodes []overlay.Node) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.routes = slices.Clone(nodes)
	return nil
}

// fakeDNS is the DNS proxy's place in the fake dataplane.
type fakeDNS struct{ k *fakeKernel }

func (f fakeDNS) SetDNSProxy(addr netip.AddrPort, observe bool) error {
	if !observe {
		f.k.dnsProxy = addr
	}
	return nil
}

func (f fakeDNS) ConntrackPeers(time.Duration) (map[netip.Addr]bool, error) {
	return maps.Clone(f.k.conntrackPeers), nil
}

// fakeDNSProxy stands in for the DNS proxy: it listens nowhere.
type fakeDNSProxy struct{ addr netip.AddrPort }

func (p fakeDNSProxy) Addr() netip.AddrPort  { return p.addr }
func (p fakeDNSProxy) Stats() dnsproxy.Stats { return dnsproxy.Stats{} }
func (p fakeDNSProxy) Close() error          { return nil }
