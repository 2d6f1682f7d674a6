package datapath

import (
	"fmt"
)

// Counters are an endpoint's packet counters, summed over CPUs. Packets and bytes count
// forwarded packets; drops count dropped packets. Ingress is traffic into the endpoint.
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

func (d *Datapath) perCPUCounters(epID uint32) ([]rampartEpCounters, error) {
	if epID >= d.MaxEndpoints() {
		return nil, fmt.Errorf("reading counters: endpoint ID %d out of range", epID)
	}
	var per []rampartEpCounters
	if err := d.objs.Counters.Lookup(&epID, &per); err != nil {
		return nil, fmt.Errorf("reading counters of endpoint %d: %w", epID, err)
	}
	return per, nil
}

// ProxyCounters returns the L7 proxy counters of endpoint epID.
func (d *Datapath) ProxyCounters(epID uint32) (ProxyCounters, error) {
	per, err := d.perCPUCounters(epID)
	if err != nil {
		return ProxyCounters{}, err
	}
	var c ProxyCounters
	for _, p := range per {
		c.ToProxy += p.ToProxyPackets
		c.FromProxy += p.FromProxyPackets
	}
	return c, nil
}

// Counters returns the counters of endpoint epID.
func (d *Datapath) Counters(epID uint32) (Counters, error) {
	per, err := d.perCPUCounters(epID)
	if err != nil {
		return Counters{}, err
	}
	var c Counters
	for _, p := range per {
		c.IngressPackets += p.IngressPackets
		c.IngressBytes += p.IngressBytes
		c.IngressDrops += p.IngressDrops
		c.EgressPackets += p.EgressPackets
		c.EgressBytes += p.EgressBytes
		c.EgressDrops += p.EgressDrops
	}
	return c, nil
}

// LostEvents returns how many flow events were not sent because the ring buffer was full.
func (d *Datapath) LostEvents() (uint64, error) {
	var (
		zero uint32
		per  []uint64
	)
	if err := d.objs.EventsLost.Lookup(&zero, &per); err != nil {
		return 0, fmt.Errorf("reading lost event count: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}
