package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// Counters are an endpoint's packet counters. Packets and bytes count forwarded packets;
// drops count dropped packets. Ingress is traffic into the endpoint.
//
// The programs count only drops (and proxy hand-offs, ProxyCounters). Forwarded packets
// are what the endpoint's host-side interface counted since the endpoint was installed on
// it, less those drops: every packet the endpoint sends is received by that interface and
// passes rampart_from_ep or is dropped there, and every packet into the endpoint passed
// rampart_to_ep before the interface transmitted it. Counting them again in the programs
// cost a per-CPU counter update per packet, a cold cache line at low packet rates (about
// 80 ns of a ping's round trip, docs/benchmarks.md).
type Counters struct {
	IngressPackets uint64
	IngressBytes   uint64
	IngressDrops   uint64
	EgressPackets  uint64
	EgressBytes    uint64
	EgressDrops    uint64
}

// ProxyCounters count an endpoint's packets that involved the L7 proxy, summed over CPUs.
// They are kept apart from Counters, whose packets they are part of.
type ProxyCounters struct {
	// ToProxy: packets handed to a proxy socket at the endpoint's veth (its steered
	// connections, and its replies to the proxy's upstream connections).
	ToProxy uint64
	// FromProxy: packets of the proxy's upstream connections into the endpoint.
	FromProxy uint64
}

// drops are the counters the programs keep for an endpoint, summed over CPUs.
type drops struct {
	ingress, ingressBytes uint64
	egress, egressBytes   uint64
	proxy                 ProxyCounters
}

func (d *Endpoints) drops(epID uint32) (drops, error) {
	if epID >= d.MaxEndpoints() {
		return drops{}, fmt.Errorf("reading counters: endpoint ID %d out of range", epID)
	}
	var per []rampartEpCounters
	if err := d.objs.EndpointCounters.Lookup(&epID, &per); err != nil {
		return drops{}, fmt.Errorf("reading counters of endpoint %d: %w", epID, err)
	}
	var s drops
	for _, p := range per {
		s.ingress += p.IngressDrops
		s.ingressBytes += p.IngressDropBytes
		s.egress += p.EgressDrops
		s.egressBytes += p.EgressDropBytes
		s.proxy.ToProxy += p.ToProxyPackets
		s.proxy.FromProxy += p.FromProxyPackets
	}
	return s, nil
}

// ProxyCounters returns the L7 proxy counters of endpoint epID.
func (d *Endpoints) ProxyCounters(epID uint32) (ProxyCounters, error) {
	s, err := d.drops(epID)
	return s.proxy, err
}

// Counters returns the counters of endpoint epID, whose host-side interface is ifindex in
// the network namespace netnsPath ("" for the caller's).
func (d *Endpoints) Counters(netnsPath string, ifindex, epID uint32) (Counters, error) {
	s, err := d.drops(epID)
	if err != nil {
		return Counters{}, err
	}
	st, err := ifaceStats(netnsPath, ifindex)
	if err != nil {
		return Counters{}, fmt.Errorf("reading counters of endpoint %d: %w", epID, err)
	}
	// No base (an endpoint installed by a version before iface_base): the interface's
	// counts since it was created, a few packets more at most.
	var base rampartIfaceStats
	if err := d.objs.IfaceBase.Lookup(&ifindex, &base); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return Counters{}, fmt.Errorf("reading counters of endpoint %d: interface base: %w", epID, err)
	}
	// The interface's counts and the drops are read one after the other while packets
	// flow: a drop counted after the interface was read could make a difference negative
	// for a moment, hence since() rather than plain subtraction.
	return Counters{
		EgressPackets:  since(st.RxPackets, base.RxPackets, s.egress),
		EgressBytes:    since(st.RxBytes, base.RxBytes, s.egressBytes),
		EgressDrops:    s.egress,
		IngressPackets: since(st.TxPackets+st.TxDropped, base.TxPackets+base.TxDropped, 0),
		IngressBytes:   since(st.TxBytes, base.TxBytes, 0),
		IngressDrops:   s.ingress,
	}, nil
}

// since is now - base - minus, or 0 where that would be negative.
func since(now, base, minus uint64) uint64 {
	if now < base+minus {
		return 0
	}
	return now - base - minus
}

// recordBase writes the current statistics of interface ifindex in netnsPath as its base
// in iface_base: the point from which its endpoint's forwarded packets are counted.
func (d *Endpoints) recordBase(netnsPath string, ifindex uint32) error {
	st, err := ifaceStats(netnsPath, ifindex)
	if err != nil {
		return fmt.Errorf("recording the statistics of interface %d: %w", ifindex, err)
	}
	if err := d.objs.IfaceBase.Update(&ifindex, &st, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("recording the statistics of interface %d: %w", ifindex, err)
	}
	return nil
}

// ifaceStats reads the statistics of interface ifindex in netnsPath.
func ifaceStats(netnsPath string, ifindex uint32) (rampartIfaceStats, error) {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return rampartIfaceStats{}, err
	}
	defer h.Close()
	lnk, err := h.LinkByIndex(int(ifindex))
	if err != nil {
		return rampartIfaceStats{}, fmt.Errorf("interface %d: %w", ifindex, err)
	}
	s := lnk.Attrs().Statistics
	if s == nil {
		return rampartIfaceStats{}, fmt.Errorf("interface %d: no statistics", ifindex)
	}
	return rampartIfaceStats{
		RxPackets: s.RxPackets, RxBytes: s.RxBytes,
		TxPackets: s.TxPackets, TxBytes: s.TxBytes, TxDropped: s.TxDropped,
	}, nil
}

// legacyCountersPin is the counters map of versions that also counted forwarded packets
// in the programs (struct legacyCounters).
const legacyCountersPin = "counters"

// legacyCounters is the value layout of legacyCountersPin.
type legacyCounters struct {
	IngressPackets, IngressBytes, IngressDrops uint64
	EgressPackets, EgressBytes, EgressDrops    uint64
	ToProxy, FromProxy                         uint64
}

// migrateCounters moves the drop and proxy counts of an earlier version's counters map
// pinned in pinDir into endpoint_counters (its dropped bytes were not counted: they start
// at 0), then unpins it. Its forwarded counts have no place to go: they come from the
// interfaces now, which counted the same packets.
func migrateCounters(pinDir string, to *ebpf.Map) error {
	path := filepath.Join(pinDir, legacyCountersPin)
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("migrating counters: %w", err)
	}
	defer old.Close()
	n := min(old.MaxEntries(), to.MaxEntries())
	for ep := uint32(0); ep < n; ep++ {
		var per []legacyCounters
		if err := old.Lookup(&ep, &per); err != nil {
			return fmt.Errorf("migrating counters of endpoint %d: %w", ep, err)
		}
		out := make([]rampartEpCounters, len(per))
		moved := false
		for i, c := range per {
			out[i] = rampartEpCounters{
				IngressDrops: c.IngressDrops, EgressDrops: c.EgressDrops,
				ToProxyPackets: c.ToProxy, FromProxyPackets: c.FromProxy,
			}
			moved = moved || out[i] != rampartEpCounters{}
		}
		if !moved {
			continue
		}
		if err := to.Update(&ep, out, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("migrating counters of endpoint %d: %w", ep, err)
		}
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("migrating counters: unpinning %s: %w", legacyCountersPin, err)
	}
	return nil
}
