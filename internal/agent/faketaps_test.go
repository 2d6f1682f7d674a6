package agent

import (
	"net/netip"
	"slices"
	"sync"

	"github.com/rampartnet/rampart/internal/tap"
)

// fakeTaps is a TapTable that keeps the rules it was given, counts the replacements, can
// fail on demand and reports the counters a test sets.
type fakeTaps struct {
	mu       sync.Mutex
	rules    []tap.Rule
	replaces int
	fail     error
	counters map[tap.RuleKey]tap.Counters
	// onReplace, when set, runs at each successful replacement with the new rules.
	onReplace func(rules []tap.Rule)
	// monitors are the monitor endpoints whose interfaces are attached.
	monitors map[uint32]bool
}

func (f *fakeTaps) ReplaceTaps(rules []tap.Rule) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.rules = slices.Clone(rules)
	f.replaces++
	if f.onReplace != nil {
		f.onReplace(rules)
	}
	return nil
}

// AttachMonitor and DetachMonitor record the monitors whose interfaces are attached.
func (f *fakeTaps) AttachMonitor(_, _, _ string, epID uint32, _ netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.monitors == nil {
		f.monitors = map[uint32]bool{}
	}
	f.monitors[epID] = true
	return nil
}

func (f *fakeTaps) SetMonitorReading(uint32, bool) error { return nil }

func (f *fakeTaps) DetachMonitor(epID uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.monitors, epID)
	return nil
}

func (f *fakeTaps) TapCounters() (map[tap.RuleKey]tap.Counters, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counters, nil
}

// NodeTapCounters: the fake counts nothing outside rules.
func (f *fakeTaps) NodeTapCounters() (tap.NodeCounters, error) { return tap.NodeCounters{}, nil }

// installed renders the installed rules.
func (f *fakeTaps) installed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []string{}
	for _, r := range f.rules {
		out = append(out, r.String())
	}
	return out
}
