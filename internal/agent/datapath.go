package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/cidrtable"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/proxy"
	"github.com/rampartnet/rampart/internal/sockverdict"
)

// realDatapath adapts *datapath.Datapath to the agent's Datapath interface.
type realDatapath struct {
	dp   *datapath.Datapath
	cidr *cidrtable.Tables

	once   sync.Once
	events *datapath.EventReader
	evErr  error

	side *sockverdict.Manager // the send-side L7 verdict
}

func openDatapath(cfg Config) (Datapath, error) {
	dp, err := datapath.Open(datapath.Config{PinDir: cfg.BPFDir, Attach: cfg.Attach})
	if err != nil {
		return nil, err
	}
	tables, err := cidrtable.Open(cidrtable.Maps(dp.CIDRMaps()), cfg.CIDRHostSlots)
	if err != nil {
		dp.Close()
		return nil, err
	}
	side, err := sockverdict.NewManager(dp.PinDir(), dp.SockPairsMap())
	if err != nil {
		tables.Close()
		dp.Close()
		return nil, err
	}
	r := &realDatapath{dp: dp, cidr: tables, side: side}
	// Open the reader now so that events emitted from here on are not lost to nobody.
	r.events, r.evErr = dp.Events()
	if r.evErr != nil {
		tables.Close()
		dp.Close()
		return nil, r.evErr
	}
	return r, nil
}

func (r *realDatapath) Attach(netnsPath, ifname string) (int, error) {
	if err := r.dp.Attach(netnsPath, ifname); err != nil {
		return 0, err
	}
	idx, err := datapath.IfIndex(netnsPath, ifname)
	if err != nil {
		return 0, fmt.Errorf("attaching to %s: %w", ifname, err)
	}
	return int(idx), nil
}

func (r *realDatapath) ReleaseLinks(ifindex int) error {
	return r.dp.ReleaseLinks(uint32(ifindex))
}

func (r *realDatapath) ApplyEndpoint(ifindex int, info EndpointInfo, pol mapstate.EndpointPolicy) error {
	return r.dp.ApplyEndpoint(uint32(ifindex), datapath.EndpointInfo{EpID: info.EpID, Identity: info.Identity, Addr: info.Addr}, pol)
}

func (r *realDatapath) RemoveEndpoint(ifindex int, epID uint32) error {
	return r.dp.RemoveEndpoint(uint32(ifindex), epID)
}

func (r *realDatapath) Installed() map[int]uint32 {
	out := map[int]uint32{}
	for ifindex, ep := range r.dp.InstalledEndpoints() {
		out[int(ifindex)] = ep.EpID
	}
	return out
}

func (r *realDatapath) ApplyIPCache(entries map[netip.Prefix]mapstate.IPCacheEntry) error {
	return r.dp.ApplyIPCache(entries)
}

func (r *realDatapath) UpdateIPCache(upsert map[netip.Prefix]mapstate.IPCacheEntry, remove []netip.Prefix) error {
	return r.dp.UpdateIPCache(upsert, remove)
}

// SetupProxy prepares the node namespace for the proxy and sets the proxy listener in the
// dataplane.
func (r *realDatapath) SetupProxy(netnsPath string, listen netip.AddrPort) error {
	if err := datapath.PrepareProxyNamespace(netnsPath); err != nil {
		return err
	}
	return r.dp.SetProxy(listen)
}

func (r *realDatapath) RouteToProxy(netnsPath string) error {
	return datapath.SetupProxyRouting(netnsPath)
}

func (r *realDatapath) Counters(netnsPath string, ifindex int, epID uint32) (api.Counters, error) {
	c, err := r.dp.Counters(netnsPath, uint32(ifindex), epID)
	if err != nil {
		return api.Counters{}, err
	}
	return api.Counters(c), nil
}

func (r *realDatapath) EventsDrained() uint64 { return r.events.Drained() }

func (r *realDatapath) ReadEvent() (FlowEvent, error) {
	ev, err := r.events.Read()
	if err != nil {
		return FlowEvent{}, err
	}
	return FlowEvent{
		Time:          ev.Time,
		Src:           ev.Source,
		Dst:           ev.Destination,
		SrcPort:       ev.SourcePort,
		DstPort:       ev.DestinationPort,
		EpID:          ev.EpID,
		SrcIdentity:   ev.SrcIdentity,
		DstIdentity:   ev.DstIdentity,
		RuleID:        ev.RuleID,
		MatchIdentity: ev.MatchIdentity,
		Ifindex:       ev.IfIndex,
		Length:        ev.Length,
		Type:          uint8(ev.Type),
		Verdict:       uint8(ev.Verdict),
		Reason:        uint8(ev.Reason),
		Direction:     uint8(ev.Direction),
		Protocol:      uint8(ev.Protocol),
		ICMPType:      ev.ICMPType,
		Flags:         flowFlags(ev),
	}, nil
}

func (r *realDatapath) Close() error {
	var err error
	r.once.Do(func() {
		r.events.Close()
		r.cidr.Close()
		// The send-side verdict's programs stay (pinned), like the tc programs.
		err = errors.Join(r.side.Close(), r.dp.Close())
	})
	return err
}

func flowFlags(ev datapath.FlowEvent) uint8 {
	var f uint8
	if ev.L7Egress {
		f |= FlowFlagL7Egress
	}
	if ev.L7Ingress {
		f |= FlowFlagL7Ingress
	}
	if ev.FromProxy {
		f |= FlowFlagFromProxy
	}
	if ev.ARP {
		f |= FlowFlagARP
	}
	return f
}

func (r *realDatapath) MapMemory() ([]api.MapMemory, error) {
	us, err := r.dp.MapMemory(r.side.Programs()...)
	if err != nil {
		return nil, err
	}
	out := make([]api.MapMemory, len(us))
	for i, u := range us {
		out[i] = api.MapMemory(u)
	}
	return out, nil
}

// ReplaceCIDRSets, AddCIDRs, RemoveCIDRs and CIDRSetMembership pass through to the
// dataplane's CIDR set tables.
func (r *realDatapath) ReplaceCIDRSets(sets map[uint8][]netip.Prefix) (CIDRSetStats, error) {
	st, err := r.cidr.ReplaceCIDRSets(sets)
	if err != nil {
		return CIDRSetStats{}, err
	}
	return CIDRSetStats{
		Prefixes: st.Prefixes, IPv4: st.IPv4, IPv6: st.IPv6, HostEntries: st.HostEntries,
		MemoryBytes: st.MemoryBytes, KernelBytes: st.KernelBytes, Build: st.Build, Write: st.Write,
	}, nil
}

func (r *realDatapath) AddCIDRs(index uint8, prefixes []netip.Prefix) error {
	return r.cidr.AddCIDRs(index, prefixes)
}

func (r *realDatapath) RemoveCIDRs(index uint8, prefixes []netip.Prefix) error {
	return r.cidr.RemoveCIDRs(index, prefixes)
}

func (r *realDatapath) CIDRSetMembership(addr netip.Addr) (uint32, error) {
	return r.cidr.CIDRSetMembership(addr)
}

func (r *realDatapath) ApplySockPairs(pairs []SockPair) error { return r.side.ApplySockPairs(pairs) }

func (r *realDatapath) ReadSockRequest() (proxy.AccessLog, error) { return r.side.ReadSockRequest() }

func (r *realDatapath) SockStatus() (api.SendSideStatus, error) {
	st, err := r.side.SockStatus()
	return api.SendSideStatus(st), err
}
