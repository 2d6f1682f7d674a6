package datapath

import (
	"errors"

	"github.com/cilium/ebpf"
)

// Map writes of a policy change go to the kernel in batches (BPF_MAP_UPDATE_BATCH,
// BPF_MAP_DELETE_BATCH): one system call for a step of ApplyEndpoint instead of one per
// entry, which is most of what a large policy cost to apply (docs/benchmarks.md, "Apply to
// enforcement"). The kernel processes a batch in order and stops at the first failure,
// reporting how many entries it completed, so a failed batch leaves exactly a prefix of
// its entries written: the callers record that prefix, which keeps their view of the map
// exact and a retry resumes where the batch stopped.

// batchWriter is the part of *ebpf.Map the batch helpers use; tests wrap it to fail a
// batch part-way.
type batchWriter interface {
	BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error)
	BatchDelete(keys any, opts *ebpf.BatchOptions) (int, error)
	Update(key, value any, flags ebpf.MapUpdateFlags) error
	Delete(key any) error
}

// batchPut writes vals[i] under keys[i], in order. It returns how many leading entries
// are written: all of them, or on error exactly keys[:n]. Where the kernel has no batch
// operation for the map it writes one entry at a time.
func batchPut[K, V any](m batchWriter, keys []K, vals []V) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	n, err := m.BatchUpdate(keys, vals, nil)
	switch {
	case err == nil:
		return len(keys), nil
	case n == 0 && errors.Is(err, ebpf.ErrNotSupported):
		for i := range keys {
			if err := m.Update(&keys[i], &vals[i], ebpf.UpdateAny); err != nil {
				return i, err
			}
		}
		return len(keys), nil
	}
	return min(max(n, 0), len(keys)), err
}

// batchDelete deletes keys, in order; a key already absent counts as deleted. It returns
// how many leading keys are gone: all of them, or on error exactly keys[:n].
func batchDelete[K any](m batchWriter, keys []K) (int, error) {
	done := 0
	for done < len(keys) {
		n, err := m.BatchDelete(keys[done:], nil)
		n = min(max(n, 0), len(keys)-done)
		switch {
		case err == nil:
			return len(keys), nil
		case errors.Is(err, ebpf.ErrKeyNotExist):
			// The batch stopped at a key the map does not hold: it is as good as deleted.
			done += n + 1
		case n == 0 && done == 0 && errors.Is(err, ebpf.ErrNotSupported):
			for i := range keys {
				if err := m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return i, err
				}
			}
			return len(keys), nil
		default:
			return done + n, err
		}
	}
	return len(keys), nil
}

// mapWriters gives the writer of a map that ApplyEndpoint or the ipcache write in batches:
// a test's, to fail a batch part-way (handle.writers; nil: the map itself).
type mapWriters interface {
	writerOf(m *ebpf.Map) batchWriter
}

// stepObserver is told of each ordered step of ApplyEndpoint: a test's, to check the
// traffic between the steps (handle.steps; nil: none).
type stepObserver interface {
	afterStep(step string)
}

// writer is how ApplyEndpoint and the ipcache write m: m itself, or the test's writer.
func (d *handle) writer(m *ebpf.Map) batchWriter {
	if d.writers != nil {
		return d.writers.writerOf(m)
	}
	return m
}

// step tells the test's observer, if any, that ApplyEndpoint completed step name.
func (d *handle) step(name string) {
	if d.steps != nil {
		d.steps.afterStep(name)
	}
}
