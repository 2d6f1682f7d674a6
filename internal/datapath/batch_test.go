package datapath

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
)

// failingWriter passes batches to the real map but makes the next batch of failAt
// (update or delete) complete only its first `after` entries and fail, as the kernel
// does when an entry fails (map full, no memory).
type failingWriter struct {
	*ebpf.Map        // the map it writes; it leaves the others to themselves (writerOf)
	failAt    string // "update" or "delete"
	after     int
	tripped   bool
}

var errInjected = errors.New("injected batch failure")

// writerOf makes w the writer of its map (mapWriters).
func (w *failingWriter) writerOf(m *ebpf.Map) batchWriter {
	if m != w.Map {
		return m
	}
	return w
}

// stepFunc is a stepObserver that calls itself.
type stepFunc func(step string)

func (f stepFunc) afterStep(step string) { f(step) }

func (w *failingWriter) BatchUpdate(keys, vals any, opts *ebpf.BatchOptions) (int, error) {
	if w.failAt != "update" || w.tripped {
		return w.Map.BatchUpdate(keys, vals, opts)
	}
	w.tripped = true
	k, v := reflect.ValueOf(keys), reflect.ValueOf(vals)
	n := min(w.after, k.Len())
	if n > 0 {
		if _, err := w.Map.BatchUpdate(k.Slice(0, n).Interface(), v.Slice(0, n).Interface(), opts); err != nil {
			return 0, err
		}
	}
	return n, fmt.Errorf("batch update: %w", errInjected)
}

func (w *failingWriter) BatchDelete(keys any, opts *ebpf.BatchOptions) (int, error) {
	if w.failAt != "delete" || w.tripped {
		return w.Map.BatchDelete(keys, opts)
	}
	w.tripped = true
	k := reflect.ValueOf(keys)
	n := min(w.after, k.Len())
	if n > 0 {
		if _, err := w.Map.BatchDelete(k.Slice(0, n).Interface(), opts); err != nil {
			return 0, err
		}
	}
	return n, fmt.Errorf("batch delete: %w", errInjected)
}

// TestBatchOpsOnThisKernel checks that the kernel takes the batch operations on the two
// LPM tries ApplyEndpoint and the ipcache write (no silent fall back to one system call
// per entry), and that a key already gone does not stop a batch delete.
func TestBatchOpsOnThisKernel(t *testing.T) {
	d := openTest(t, Config{})
	keys := make([]rampartPolicyKey, 3)
	vals := make([]rampartPolicyValue, 3)
	for i := range keys {
		k, v := allow(idA, in, tcp, uint16(100+i), 16, uint32(i+1))
		var err error
		if keys[i], err = policyKey(epID, k); err != nil {
			t.Fatal(err)
		}
		vals[i] = policyValue(v)
	}
	if n, err := d.objs.Policy.BatchUpdate(keys, vals, nil); err != nil || n != 3 {
		t.Fatalf("BatchUpdate on the policy map: %d, %v", n, err)
	}
	if err := d.objs.Policy.Delete(&keys[1]); err != nil {
		t.Fatal(err)
	}
	if n, err := batchDelete(d.objs.Policy, keys); err != nil || n != 3 {
		t.Fatalf("batchDelete with a missing key in the middle: %d, %v", n, err)
	}
	if got := dumpPolicy(t, d); len(got) != 0 {
		t.Errorf("map not empty after batchDelete: %v", got)
	}
	k, err := ipcacheKey(netip.MustParsePrefix("198.18.9.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.objs.Ipcache.BatchUpdate([]rampartIpcacheKey{k}, []rampartIpcacheValue{{Identity: 1234}}, nil); err != nil {
		t.Fatalf("BatchUpdate on the ipcache: %v", err)
	}
	if _, err := d.objs.Ipcache.BatchDelete([]rampartIpcacheKey{k}, nil); err != nil {
		t.Fatalf("BatchDelete on the ipcache: %v", err)
	}
}

// TestApplyEndpointBatchFailsMidway fails each batch of ApplyEndpoint part-way and checks
// that the endpoint is never more permissive than the old or the new policy, that the
// datapath's record of the map is exactly what the kernel holds (so nothing written is
// forgotten and nothing unwritten assumed), and that applying again, or going back to
// the old policy as the agent's rollback does, ends with exactly that policy in the map.
func TestApplyEndpointBatchFailsMidway(t *testing.T) {
	old := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(
		e(allow(idA, in, tcp, 80, 16, 1)),
		e(allow(idA, in, tcp, 81, 16, 2)),
		e(allow(idB, in, tcp, 8080, 16, 3)),
		e(deny(idB, in, tcp, 8087, 16, 4)),
		e(deny(idB, in, udp, 53, 16, 5)),
		e(deny(idB, in, tcp, 8088, 16, 6)),
	)}
	newP := mapstate.EndpointPolicy{EnforceIngress: true, EnforceEgress: true, Entries: entries(
		e(allow(idA, in, tcp, 80, 16, 1)), // kept
		e(allow(idB, in, tcp, 81, 16, 7)),
		e(allow(idA, in, tcp, 8080, 16, 8)),
		e(allow(idB, in, udp, 80, 16, 9)),
		e(deny(idA, in, tcp, 8087, 16, 10)),
		e(deny(idA, in, tcp, 8088, 16, 11)),
		e(deny(idA, in, udp, 53, 16, 12)),
		e(deny(idB, in, tcp, 8087, 16, 4)), // kept
	)}
	// Steps: 1 writes 3 denies, 2 deletes 2 allows, 3 writes 3 allows, 4 deletes 2 denies.
	for _, c := range []struct {
		failAt string
		nth    int // fail the nth batch of that kind (1 or 2)
		after  int
	}{
		{"update", 1, 0}, {"update", 1, 2},
		{"delete", 1, 1},
		{"update", 2, 2},
		{"delete", 2, 1},
	} {
		t.Run(fmt.Sprintf("%s-%d-after-%d", c.failAt, c.nth, c.after), func(t *testing.T) {
			f := newFixture(t, Config{})
			ep := EndpointInfo{EpID: epID, Identity: epIdent, Addr: epIP}
			if err := f.d.Endpoints.ApplyEndpoint(epIfindex, ep, old); err != nil {
				t.Fatal(err)
			}
			probes := probesFor()
			oldV := allowedNow(t, f, probes)
			seen := 0
			w := &failingWriter{Map: f.d.objs.Policy, failAt: c.failAt, after: c.after}
			f.d.writers = w
			// Let the first batch of the kind through when the second is to fail.
			if c.nth == 2 {
				w.tripped = true
				f.d.steps = stepFunc(func(step string) {
					if (c.failAt == "update" && step == stepWriteDenies) || (c.failAt == "delete" && step == stepDeleteAllows) {
						seen++
						w.tripped = false
					}
				})
			}
			err := f.d.Endpoints.ApplyEndpoint(epIfindex, ep, newP)
			f.d.steps = nil
			if !errors.Is(err, errInjected) {
				t.Fatalf("ApplyEndpoint with a failing batch: %v, want the injected error", err)
			}
			if c.nth == 2 && seen != 1 {
				t.Fatalf("the batch to fail was never reached")
			}
			if got, rec := dumpPolicy(t, f.d)[epID], f.d.Endpoints.InstalledPolicy(epID); !maps.Equal(got, rec) && !(len(got) == 0 && len(rec) == 0) {
				t.Errorf("after the failure the map holds\n %v\nthe datapath's record says\n %v", got, rec)
			}
			newV := map[int]bool{}
			f.d.writers = nil
			f.drain()
			now := allowedNow(t, f, probes)
			if err := f.d.Endpoints.ApplyEndpoint(epIfindex, ep, newP); err != nil {
				t.Fatalf("applying again: %v", err)
			}
			if got := dumpPolicy(t, f.d)[epID]; !maps.Equal(got, newP.Entries) {
				t.Errorf("after applying again the map holds\n %v\nwant\n %v", got, newP.Entries)
			}
			f.drain()
			for i, ok := range allowedNow(t, f, probes) {
				newV[i] = ok
			}
			for i, ok := range now {
				if ok && !oldV[i] && !newV[i] {
					t.Errorf("after the failed batch %v passes, denied by the old and the new policy", probes[i])
				}
			}
			// The agent's rollback: the old policy again, from wherever the map is.
			if err := f.d.Endpoints.ApplyEndpoint(epIfindex, ep, old); err != nil {
				t.Fatalf("rolling back: %v", err)
			}
			if got := dumpPolicy(t, f.d)[epID]; !maps.Equal(got, old.Entries) {
				t.Errorf("after rolling back the map holds\n %v\nwant\n %v", got, old.Entries)
			}
		})
	}
}

// TestUpdateIPCacheBatchFailsMidway checks that an ipcache batch failing part-way leaves
// the datapath's record equal to the map, and that the next update completes it.
func TestUpdateIPCacheBatchFailsMidway(t *testing.T) {
	for _, failAt := range []string{"update", "delete"} {
		t.Run(failAt, func(t *testing.T) {
			d := openTest(t, Config{})
			first := map[netip.Prefix]mapstate.IPCacheEntry{}
			for i := range 4 {
				first[netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 20, byte(i)}), 32)] = mapstate.IPCacheEntry{Identity: identity.Identity(3000 + i)}
			}
			if err := d.IPCache.UpdateIPCache(first, nil); err != nil {
				t.Fatal(err)
			}
			upsert := map[netip.Prefix]mapstate.IPCacheEntry{}
			for i := range 4 {
				upsert[netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 21, byte(i)}), 32)] = mapstate.IPCacheEntry{Identity: identity.Identity(4000 + i)}
			}
			var remove []netip.Prefix
			for p := range first {
				remove = append(remove, p)
			}
			w := &failingWriter{Map: d.objs.Ipcache, failAt: failAt, after: 2}
			d.writers = w
			if err := d.IPCache.UpdateIPCache(upsert, remove); !errors.Is(err, errInjected) {
				t.Fatalf("UpdateIPCache with a failing batch: %v", err)
			}
			d.writers = nil
			if got, rec := pinnedIPCache(t, d), d.IPCache.InstalledIPCache(); !maps.Equal(got, rec) {
				t.Errorf("after the failure the map holds\n %v\nthe record says\n %v", got, rec)
			}
			if err := d.IPCache.UpdateIPCache(upsert, remove); err != nil {
				t.Fatal(err)
			}
			if got := pinnedIPCache(t, d); !maps.Equal(got, upsert) {
				t.Errorf("after retrying the map holds\n %v\nwant\n %v", got, upsert)
			}
		})
	}
}
