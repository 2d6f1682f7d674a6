package agent

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/tap"
)

// countingDataplane is a tapDataplane whose contracts count what ReplaceTaps installed
// under them: each installed rule adds one mirrored packet to its contract per count().
type countingDataplane struct {
	installed []datapath.TapRule
	counts    map[uint32]datapath.TapCounters
}

func (d *countingDataplane) AttachMonitor(string, string, string, uint32) (uint32, uint32, error) {
	return 0, 0, nil
}
func (d *countingDataplane) DetachMonitor(uint32, uint32) error         { return nil }
func (d *countingDataplane) SetMonitorKey(netip.Addr, uint32) error     { return nil }
func (d *countingDataplane) DeleteMonitorKey(netip.Addr) error          { return nil }
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
	k := newTapKernel(dp)
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
