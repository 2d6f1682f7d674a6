package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// The endpoint records the concepts share: the endpoints map, endpoint_slots and
// endpoints_by_id, which Endpoints writes for each endpoint and Taps for the tap bits in
// an endpoint's info. Each write keeps the handle's record of the three in step with the
// maps; d.mu must be held.

// putEndpoint writes the endpoint info of ifindex, and the same info by ep_id (which
// other endpoints' veths use to evaluate this endpoint's ingress policy for L7 steering).
func (d *handle) putEndpoint(ifindex uint32, info rampartEndpointInfo) error {
	if err := d.objs.Endpoints.Update(&ifindex, &info, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("writing endpoint info of ifindex %d: %w", ifindex, err)
	}
	d.endpoints[ifindex] = info
	if err := d.claimSlot(ifindex); err != nil {
		return err
	}
	if err := d.objs.EndpointsById.Update(&info.EpId, &info, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("writing endpoint info of endpoint %d: %w", info.EpId, err)
	}
	return nil
}

// deleteEndpoint deletes the endpoint info of ifindex; the info by ep_id goes too unless
// the endpoint is still installed on another interface.
func (d *handle) deleteEndpoint(ifindex uint32) error {
	// The slot first: it is what the programs look at first.
	slot := d.slotOf(ifindex)
	if d.slots[slot] == ifindex {
		if err := d.writeSlot(slot, rampartEndpointSlot{}); err != nil {
			return err
		}
	}
	if err := d.objs.Endpoints.Delete(&ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting endpoint info of ifindex %d: %w", ifindex, err)
	}
	old, ok := d.endpoints[ifindex]
	delete(d.endpoints, ifindex)
	// Another endpoint whose interface falls in the freed slot takes it.
	if d.slots[slot] == 0 {
		if err := d.fillSlot(slot); err != nil {
			return err
		}
	}
	if ok {
		return d.syncByID(old.EpId)
	}
	return nil
}

// slotOf is the endpoint_slots slot of interface ifindex (the table's size is a power of
// two, checked by Open).
func (d *handle) slotOf(ifindex uint32) uint32 {
	return ifindex & (d.objs.EndpointSlots.MaxEntries() - 1)
}

// writeSlot writes slot and records which interface it now holds (0: none).
func (d *handle) writeSlot(slot uint32, v rampartEndpointSlot) error {
	if err := d.objs.EndpointSlots.Update(&slot, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("writing endpoint slot %d: %w", slot, err)
	}
	d.slots[slot] = v.Ifindex
	return nil
}

// claimSlot puts the endpoint of ifindex (already in d.endpoints) into its slot, if the
// slot is free or already its own; otherwise the programs find it in the endpoints hash.
func (d *handle) claimSlot(ifindex uint32) error {
	slot := d.slotOf(ifindex)
	if owner := d.slots[slot]; owner != 0 && owner != ifindex {
		return nil
	}
	return d.writeSlot(slot, rampartEndpointSlot{Info: d.endpoints[ifindex], Ifindex: ifindex})
}

// fillSlot gives the free slot to the installed endpoint with the lowest ifindex that
// falls in it, if any (the lowest: a deterministic choice).
func (d *handle) fillSlot(slot uint32) error {
	var best uint32
	for ifindex := range d.endpoints {
		if d.slotOf(ifindex) == slot && (best == 0 || ifindex < best) {
			best = ifindex
		}
	}
	if best == 0 {
		return nil
	}
	return d.claimSlot(best)
}

// readSlots reads endpoint_slots back and makes it agree with d.endpoints (read from the
// endpoints hash): a slot holding an interface that has no endpoint, or other info, is
// rewritten or emptied, and free slots are filled. Pins from before the table have none
// of it: the programs find every endpoint in the hash until this has run.
func (d *handle) readSlots() error {
	n := d.objs.EndpointSlots.MaxEntries()
	if n == 0 || n&(n-1) != 0 {
		return fmt.Errorf("endpoint slots: %d entries, not a power of two", n)
	}
	d.slots = make([]uint32, n)
	var v rampartEndpointSlot
	for slot := uint32(0); slot < n; slot++ {
		if err := d.objs.EndpointSlots.Lookup(&slot, &v); err != nil {
			return fmt.Errorf("reading endpoint slot %d: %w", slot, err)
		}
		info, ok := d.endpoints[v.Ifindex]
		switch {
		case v.Ifindex == 0:
		case ok && d.slotOf(v.Ifindex) == slot && info == v.Info:
			d.slots[slot] = v.Ifindex
		case ok && d.slotOf(v.Ifindex) == slot:
			if err := d.writeSlot(slot, rampartEndpointSlot{Info: info, Ifindex: v.Ifindex}); err != nil {
				return err
			}
		default:
			if err := d.writeSlot(slot, rampartEndpointSlot{}); err != nil {
				return err
			}
		}
	}
	for ifindex := range d.endpoints {
		if err := d.claimSlot(ifindex); err != nil {
			return err
		}
	}
	return nil
}

// syncByID makes the info of epID in endpoints_by_id that of an interface it is installed
// on, or removes it when there is none.
func (d *handle) syncByID(epID uint32) error {
	for _, info := range d.endpoints {
		if info.EpId == epID {
			if err := d.objs.EndpointsById.Update(&epID, &info, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("writing endpoint info of endpoint %d: %w", epID, err)
			}
			return nil
		}
	}
	if err := d.objs.EndpointsById.Delete(&epID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting endpoint info of endpoint %d: %w", epID, err)
	}
	return nil
}

// resyncByID rebuilds endpoints_by_id from the endpoints map (after Open: pins left by a
// version without it, or an agent that stopped between the two writes).
func (d *handle) resyncByID() error {
	var (
		id   uint32
		info rampartEndpointInfo
		ids  []uint32
	)
	it := d.objs.EndpointsById.Iterate()
	for it.Next(&id, &info) {
		ids = append(ids, id)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading endpoints_by_id map: %w", err)
	}
	seen := make(map[uint32]bool)
	for _, info := range d.endpoints {
		seen[info.EpId] = true
	}
	for _, id := range ids {
		if !seen[id] {
			if err := d.syncByID(id); err != nil {
				return err
			}
		}
	}
	for id := range seen {
		if err := d.syncByID(id); err != nil {
			return err
		}
	}
	return nil
}
