package datapath

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"
)

// Conntrack reads the conntrack maps.
type Conntrack struct{ *handle }

// ConntrackPeers returns the peer addresses (the far side, seen from the endpoint) of the
// conntrack entries whose last packet is at most maxIdle old: the addresses some
// connection may still use. The agent keeps the identity of an address that DNS taught it
// while a connection to it lives (toFQDNs: a TTL that runs out closes no open
// connection). One walk over the table.
func (d *Conntrack) ConntrackPeers(maxIdle time.Duration) (map[netip.Addr]bool, error) {
	now, err := jiffiesNow()
	if err != nil {
		return nil, err
	}
	tick, err := kernelTick()
	if err != nil {
		return nil, err
	}
	idle := toJiffies(maxIdle, tick)
	out := map[netip.Addr]bool{}
	var (
		k rampartCt4Key
		v rampartCtValue
	)
	it := d.objs.Conntrack4Peer.Iterate()
	for it.Next(&k, &v) {
		if v.LastSeen+idle < now {
			continue
		}
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], k.Raddr)
		out[netip.AddrFrom4(b)] = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("walking conntrack: %w", err)
	}
	var k6 rampartCt6Key
	it = d.objs.Conntrack6.Iterate()
	for it.Next(&k6, &v) {
		if v.LastSeen+idle >= now {
			out[netip.AddrFrom16(k6.Raddr)] = true
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("walking IPv6 conntrack: %w", err)
	}
	return out, nil
}
