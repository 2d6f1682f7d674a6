package datapath

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/mapstate"
)

// AttachMode is how the endpoint programs are attached to an endpoint's host-side veth.
type AttachMode string

const (
	// AttachTC (the default) attaches them as tc cls_bpf filters (direct action) under a
	// clsact qdisc. The filters live as long as the veth, so they need no pins, and
	// attaching or removing them costs no RCU grace period: an endpoint add or delete
	// costs what the veth costs (docs/benchmarks.md, "Endpoint churn").
	AttachTC AttachMode = "tc"
	// AttachTCX attaches them as TCX links pinned in the pin directory (tcx/). The hook
	// runs the program without the qdisc and classifier layers (about 2 % of a UDP
	// sender's throughput in one run; docs/benchmarks.md, "Egress filtering"), but every
	// attach and detach waits for an RCU grace period with the RTNL lock held
	// (kernel/bpf/tcx.c): about 25 ms more per endpoint add and 20 ms per delete.
	AttachTCX AttachMode = "tcx"
)

// ParseAttachMode checks an attach mode's name ("" is AttachTC).
func ParseAttachMode(s string) (AttachMode, error) {
	switch AttachMode(s) {
	case "", AttachTC:
		return AttachTC, nil
	case AttachTCX:
		return AttachTCX, nil
	}
	return "", fmt.Errorf("attach mode %q: want %q or %q", s, AttachTC, AttachTCX)
}

// handle is what the concept types share: the loaded objects and the record of what the
// maps hold. Its methods are unexported; each concept's exported ones are on its type.
type handle struct {
	pinDir string
	attach AttachMode // Config.Attach, checked
	objs   dataplaneObjects

	// mu guards the record below and the lazily loaded program groups. One lock for all
	// concepts: they use each other's records (the taps read and write the endpoints').
	mu sync.Mutex
	// What is in the maps, so changes are applied as diffs. Rebuilt from the maps on Open.
	endpoints map[uint32]rampartEndpointInfo                     // by ifindex
	slots     []uint32                                           // endpoint_slots: the ifindex each slot holds, 0 if none
	policies  map[uint32]map[rampartPolicyKey]rampartPolicyValue // by ep_id
	addrs6    map[uint32]rampartEndpoint6                        // endpoints6, by ep_id
	ipcache   map[netip.Prefix]mapstate.IPCacheEntry
	// netns is the network namespace of each interface Attach attached to (this process
	// only): where ApplyEndpoint reads an interface's statistics (iface_base).
	netns map[uint32]string
	// revision is the last policy revision handed out (nextRevision).
	revision uint32

	// cidrInner is the layout of the CIDR set tables cidr4_top and cidr4_host hold
	// (CIDRMaps).
	cidrInner [2]*ebpf.MapSpec

	// ipipFabric is where AttachIPIP last put the IP-in-IP programs (nil: not known in
	// this process, so the next AttachIPIP looks at every interface). Guarded by mu.
	ipipFabric []string
	// tapTunnel is the tap tunnel device's index (AttachTapTunnel; 0: none in this
	// process). Guarded by mu.
	tapTunnel uint32

	// steps, when set (tests), is told of each ordered step of ApplyEndpoint.
	steps stepObserver
	// writers, when set (tests), gives the writer of the maps ApplyEndpoint and the
	// ipcache write, to fail a batch part-way.
	writers mapWriters
}

// allMaps is every map of the tc object that Remove unpins.
func (d *handle) allMaps() []*ebpf.Map {
	m := &d.objs.rampartMaps
	return []*ebpf.Map{m.EndpointCounters, m.IfaceBase, m.Conntrack4Peer, m.Conntrack6, m.Endpoints, m.Endpoints6, m.EndpointSlots, m.EndpointsById, m.Events, m.EventsLost, m.FragsPeer, m.Ipcache, m.IpcacheGen, m.Policy, m.Proxy, m.Proxy6, m.DnsProxy, m.HostSafe, m.HostSafe6,
		m.Cidr4Config, m.Cidr4Top, m.Cidr4Host, m.Cidr6, m.SvPairs, m.SvFlows, m.TapSets, m.TapSets6, m.TapFlows, m.TapFlows6, m.TapFrags, m.TapCounters, m.TapIfaces}
}

// readState rebuilds the in-memory copy of the endpoints, policy and ipcache maps.
func (d *handle) readState() error {
	d.endpoints = make(map[uint32]rampartEndpointInfo)
	d.netns = make(map[uint32]string)
	d.policies = make(map[uint32]map[rampartPolicyKey]rampartPolicyValue)
	d.ipcache = make(map[netip.Prefix]mapstate.IPCacheEntry)

	var (
		ifindex uint32
		info    rampartEndpointInfo
	)
	it := d.objs.Endpoints.Iterate()
	for it.Next(&ifindex, &info) {
		d.endpoints[ifindex] = info
		d.revision = max(d.revision, info.Revision)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading endpoints map: %w", err)
	}
	if err := d.readSlots(); err != nil {
		return err
	}
	if err := d.readEndpoints6(); err != nil {
		return err
	}

	var (
		pk rampartPolicyKey
		pv rampartPolicyValue
	)
	it = d.objs.Policy.Iterate()
	for it.Next(&pk, &pv) {
		k := normalizeKey(pk)
		id := k.EpId &^ auditEpFlag // an endpoint's audit entries are its own
		if d.policies[id] == nil {
			d.policies[id] = make(map[rampartPolicyKey]rampartPolicyValue)
		}
		d.policies[id][k] = pv
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading policy map: %w", err)
	}

	var (
		ik rampartIpcacheKey
		iv rampartIpcacheValue
	)
	it = d.objs.Ipcache.Iterate()
	for it.Next(&ik, &iv) {
		p, ok := ipcachePrefix(ik)
		if !ok {
			continue
		}
		d.ipcache[p] = ipcacheEntryOf(iv)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading ipcache map: %w", err)
	}
	return d.resyncByID()
}

// readEndpoints6 reads endpoints6 back (Open).
func (d *handle) readEndpoints6() error {
	d.addrs6 = make(map[uint32]rampartEndpoint6)
	var (
		epID uint32
		v    rampartEndpoint6
	)
	it := d.objs.Endpoints6.Iterate()
	for it.Next(&epID, &v) {
		d.addrs6[epID] = v
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading endpoints6 map: %w", err)
	}
	return nil
}

// bumpIPCacheGeneration adds one to the ipcache generation (map ipcache_gen), after the
// ipcache map changed: an address may now have another identity, so every established
// flow is checked again on its next packet, on the identity its peer has now
// (recheck_established in bpf/rampart.c). After the change, never before: a packet that
// reads the new generation then finds the new identities. d.mu must be held.
func (d *handle) bumpIPCacheGeneration() error {
	gen, err := d.ipcacheGeneration()
	if err != nil {
		return err
	}
	zero := uint32(0)
	if err := d.objs.IpcacheGen.Update(&zero, gen+1, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bumping the ipcache generation: %w", err)
	}
	return nil
}

// ipcacheGeneration reads the ipcache generation.
func (d *handle) ipcacheGeneration() (uint32, error) {
	var gen, zero uint32
	if err := d.objs.IpcacheGen.Lookup(&zero, &gen); err != nil {
		return 0, fmt.Errorf("reading the ipcache generation: %w", err)
	}
	return gen, nil
}
