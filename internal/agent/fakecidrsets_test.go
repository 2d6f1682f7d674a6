package agent

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/rampartnet/rampart/internal/cidrtable"
)

// fakeCIDRSets is CIDRSets: the prefixes of each set, as the tables keep them; an address
// is a member while any prefix of the set covers it.
type fakeCIDRSets struct {
	mu   sync.Mutex
	sets map[uint8][]netip.Prefix
	// setCalls records every set table call in order ("replace", "add", "remove").
	setCalls []setCall
	// failReplace makes ReplaceCIDRSets fail this many more times; failAddCIDRs makes
	// AddCIDRs fail once.
	failReplace  int
	failAddCIDRs bool
	// replaceDelay makes ReplaceCIDRSets take at least this long.
	replaceDelay time.Duration
}

type setCall struct {
	seq   int64
	op    string
	index uint8
	sets  map[uint8]int // replace: prefixes per set
	n     int           // add/remove: prefixes
}

func (d *fakeCIDRSets) ReplaceCIDRSets(sets map[uint8][]netip.Prefix) (cidrtable.Stats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	call := setCall{seq: seq.Add(1), op: "replace", sets: map[uint8]int{}}
	for i, ps := range sets {
		call.sets[i] = len(ps)
	}
	d.setCalls = append(d.setCalls, call)
	time.Sleep(d.replaceDelay) // stands for the work of a rebuild, for the timing test
	if d.failReplace > 0 {
		d.failReplace--
		return cidrtable.Stats{}, errors.New("injected set table failure")
	}
	d.sets = map[uint8][]netip.Prefix{}
	st := cidrtable.Stats{MemoryBytes: 1 << 20}
	for i, ps := range sets {
		d.sets[i] = slices.Clone(ps)
		for _, p := range ps {
			st.Prefixes++
			if p.Addr().Is4() {
				st.IPv4++
			} else {
				st.IPv6++
			}
		}
	}
	return st, nil
}

func (d *fakeCIDRSets) AddCIDRs(index uint8, prefixes []netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setCalls = append(d.setCalls, setCall{seq: seq.Add(1), op: "add", index: index, n: len(prefixes)})
	if d.failAddCIDRs {
		d.failAddCIDRs = false
		return errors.New("injected host table full")
	}
	if d.sets == nil {
		d.sets = map[uint8][]netip.Prefix{}
	}
	d.sets[index] = append(d.sets[index], prefixes...)
	return nil
}

func (d *fakeCIDRSets) RemoveCIDRs(index uint8, prefixes []netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setCalls = append(d.setCalls, setCall{seq: seq.Add(1), op: "remove", index: index, n: len(prefixes)})
	d.sets[index] = slices.DeleteFunc(d.sets[index], func(q netip.Prefix) bool { return slices.Contains(prefixes, q) })
	return nil
}

func (d *fakeCIDRSets) CIDRSetMembership(addr netip.Addr) (uint32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var m uint32
	for i, ps := range d.sets {
		if slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(addr) }) {
			m |= 1 << i
		}
	}
	return m, nil
}

// calls returns the recorded set table calls.
func (d *fakeCIDRSets) calls() []setCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.setCalls)
}
