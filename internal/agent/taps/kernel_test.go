package taps

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/tap"
)

// countingDataplane is a Dataplane whose contracts count what ReplaceTaps installed
// under them: each installed rule adds one mirrored packet to its contract per count().
type countingDataplane struct {
	installed []datapath.TapRule
	counts    map[uint32]datapath.TapCounters
	keys      map[netip.Addr]uint32 // monitor keys set, by address
	keyWrites int                   // SetMonitorKey and DeleteMonitorKey calls
}

func (d *countingDataplane) AttachMonitor(string, string, string, uint32) (uint32, uint32, error) {
	return 0, 0, nil
}
func (d *countingDataplane) DetachMonitor(uint32, uint32) error { return nil }
func (d *countingDataplane) SetMonitorKey(addr netip.Addr, rx uint32) error {
	d.keyWrites++
	if d.keys == nil {
		d.keys = map[netip.Addr]uint32{}
	}
	d.keys[addr] = rx
	return nil
}
func (d *countingDataplane) DeleteMonitorKey(addr netip.Addr) error {
	d.keyWrites++
	delete(d.keys, addr)
	return nil
}
func (d *countingDataplane) EndpointIfindex(epID uint32) (uint32, bool) { return epID + 100, true }
func (d *countingDataplane) TapTunnelIfindex() uint32                   { return 0 }
func (d *countingDataplane) ReplaceTaps(rules []datapath.TapRule) error {
	d.installed = rules
	return nil
}
func (d *countingDataplane) ResetTapCounters(id uint32) error { delete(d.counts, id); return nil }
func (d *countingDataplane) TapCounters(ids ...uint32) (map[uint32]datapath.TapCounters, error) {
	out := map[uint32]datapath.TapCounters{}
	for _, id := range ids {
		out[id] = d.counts[id]
	}
	return out, nil
}

// count is traffic: every installed rule's contract counts one more copy.
func (d *countingDataplane) count() {
	for _, r := range d.installed {
		c := d.counts[r.ContractID]
		c.MirroredPackets++
		d.counts[r.ContractID] = c
	}
}

// Counters belong to their contract: a contract added on the same endpoint, whose name
// sorts first (so its rule takes index 0), starts from zero and does not take over the
// counts of the contract that was there.
func TestTapKernelCountersFollowTheirContract(t *testing.T) {
	dp := &countingDataplane{counts: map[uint32]datapath.TapCounters{}}
	k := NewKernel(dp)
	rule := func(contract string, index int) tap.Rule {
		return tap.Rule{Endpoint: "shop/web", EndpointID: 7, Index: index, Contract: contract,
			Match: tap.Match{Direction: tap.Egress}, Action: tap.Mirror, Effect: tap.EffectMirror}
	}
	if err := k.ReplaceTaps([]tap.Rule{rule("web-b", 0)}); err != nil {
		t.Fatal(err)
	}
	dp.count()
	dp.count()
	if err := k.ReplaceTaps([]tap.Rule{rule("web-a", 0), rule("web-b", 1)}); err != nil {
		t.Fatal(err)
	}
	dp.count()
	got, err := k.TapCounters()
	if err != nil {
		t.Fatal(err)
	}
	a := got[tap.RuleKey{EndpointID: 7, Contract: "web-a"}].MirroredPackets
	b := got[tap.RuleKey{EndpointID: 7, Contract: "web-b"}].MirroredPackets
	if a != 1 || b != 3 {
		t.Errorf("counters: web-a %d, web-b %d; want 1 and 3 (%+v)", a, b, got)
	}
}

// A monitor that does not read has its key withdrawn, so copies other nodes send it are
// counted lost on arrival; reading again, the key is back. Setting the same state twice
// writes nothing, and a monitor that is not attached is left alone.
func TestTapKernelWithdrawsKeyOfMonitorNotReading(t *testing.T) {
	dp := &countingDataplane{}
	k := NewKernel(dp)
	addr := netip.MustParseAddr("198.18.0.9")
	if err := k.AttachMonitor("", "rx", "tx", 9, addr); err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct {
		reading, keyed bool
		writes         int // key writes so far
	}{{false, false, 2}, {false, false, 2}, {true, true, 3}, {true, true, 3}} {
		if err := k.SetMonitorReading(9, step.reading); err != nil {
			t.Fatal(err)
		}
		if _, keyed := dp.keys[addr]; keyed != step.keyed || dp.keyWrites != step.writes {
			t.Errorf("step %d, reading %v: keyed %v after %d writes, want %v after %d", i, step.reading, keyed, dp.keyWrites, step.keyed, step.writes)
		}
	}
	if err := k.SetMonitorReading(4, false); err != nil || dp.keyWrites != 3 {
		t.Errorf("a monitor not attached: %v, %d writes", err, dp.keyWrites)
	}
}
