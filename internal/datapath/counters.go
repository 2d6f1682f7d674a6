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

// Counters returns the counters of endpoint epID.
func (d *Datapath) Counters(epID uint32) (Counters, error) {
	if epID >= d.MaxEndpoints() {
		return Counters{}, fmt.Errorf("reading counters: endpoint ID %d out of range", epID)
	}
	var per []rampartEpCounters
	if err := d.objs.Counters.Lookup(&epID, &per); err != nil {
		return Counters{}, fmt.Errorf("reading counters of endpoint %d: %w", epID, err)
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
