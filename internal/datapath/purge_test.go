package datapath

import (
	"testing"

	"github.com/cilium/ebpf"
)

// RemoveEndpoint purges the endpoint's conntrack entries and only them, across more
// entries than one batch read holds.
func TestRemoveEndpointPurgesOnlyItsConntrack(t *testing.T) {
	d := openTest(t, Config{})
	const perEp = purgeBatch + 1000
	v := rampartCtValue{}
	keys := make([]rampartCt4Key, 0, 2*perEp)
	vals := make([]rampartCtValue, 0, 2*perEp)
	for ep := uint32(1); ep <= 2; ep++ {
		for i := range uint32(perEp) {
			keys = append(keys, rampartCt4Key{Laddr: 0xc6120000 + i, Raddr: 0xc6130001, Lport: uint16(i), Rport: 80, EpId: ep, Protocol: 6})
			vals = append(vals, v)
		}
	}
	if _, err := d.objs.Conntrack4Peer.BatchUpdate(keys, vals, &ebpf.BatchOptions{}); err != nil {
		t.Fatalf("filling conntrack: %v", err)
	}
	if err := d.Endpoints.RemoveEndpoint(0, 1); err != nil {
		t.Fatal(err)
	}
	count := map[uint32]int{}
	var (
		k  rampartCt4Key
		cv rampartCtValue
	)
	it := d.objs.Conntrack4Peer.Iterate()
	for it.Next(&k, &cv) {
		count[k.EpId]++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if count[1] != 0 || count[2] != perEp {
		t.Fatalf("after removing endpoint 1: %d of its entries left, %d of endpoint 2's (want 0 and %d)", count[1], count[2], perEp)
	}
}
