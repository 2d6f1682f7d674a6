package cli

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/monitor/join"
	"github.com/rampartnet/rampart/internal/monitor/suricata"
)

// An alert counts once per contract the join names (a contract that taps both ends of the
// flow is one), under "" with none; severities outside 1-4 count at the nearest end;
// drops count apart; the capture counters are the latest stats record's.
func TestMonitorCounts(t *testing.T) {
	var warn strings.Builder
	c := newMonitorCounts(&warn)
	both := []join.ContractRef{{Name: "shop-mirror", Endpoint: "shop/client"}, {Name: "shop-mirror", Endpoint: "shop/web"}}
	c.add(join.Alert{Event: "alert", Severity: 2, Contracts: both})
	c.add(join.Alert{Event: "alert", Severity: 2, Contracts: []join.ContractRef{{Name: "shop-mirror"}, {Name: "db-inline"}}})
	c.add(join.Alert{Event: "alert", Severity: 3})
	c.add(join.Alert{Event: "alert", Severity: 200})
	c.add(join.Alert{Event: "drop", Contracts: both})
	c.stats(suricata.Event{Type: "stats", Stats: &suricata.Stats{KernelPackets: 5}})
	c.stats(suricata.Event{Type: "stats", Stats: &suricata.Stats{KernelPackets: 9, KernelDrops: 1}})
	r := c.report()
	slices.SortFunc(r.Alerts, func(a, b api.MonitorAlertCount) int {
		return strings.Compare(a.Contract, b.Contract)*10 + a.Severity - b.Severity
	})
	want := []api.MonitorAlertCount{{Contract: "", Severity: 3, Count: 1}, {Contract: "", Severity: 4, Count: 1},
		{Contract: "db-inline", Severity: 2, Count: 1}, {Contract: "shop-mirror", Severity: 2, Count: 2}}
	if !slices.Equal(r.Alerts, want) || r.Drops != 1 || r.CapturePackets != 9 || r.CaptureKernelDrops != 1 {
		t.Errorf("report %+v, want alerts %+v, 1 drop, 9 packets, 1 kernel drop", r, want)
	}
	if err := r.Validate(); err != nil {
		t.Errorf("the report is not valid: %v", err)
	}

	// Beyond the agent's bound, alerts of new contracts are left out, with one warning,
	// so that the reports stay valid.
	for i := range api.MaxMonitorAlertCounts + 2 {
		c.add(join.Alert{Event: "alert", Severity: 1, Contracts: []join.ContractRef{{Name: "c" + strings.Repeat("x", i%250) + string(rune('a'+i/250))}}})
	}
	if r := c.report(); len(r.Alerts) != api.MaxMonitorAlertCounts || r.Validate() != nil {
		t.Errorf("%d alert counts (valid: %v), want the limit %d", len(r.Alerts), r.Validate(), api.MaxMonitorAlertCounts)
	}
	if strings.Count(warn.String(), "warning:") != 1 {
		t.Errorf("warnings: %q, want one", warn.String())
	}
}

// reportingAgent records the reports it gets, and refuses them while refuse is set.
type reportingAgent struct {
	mu      sync.Mutex
	reports []api.MonitorReport
	refuse  bool
}

func (f *reportingAgent) report(_ context.Context, r api.MonitorReport) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse {
		return api.NotFound("endpoint sec/ids not found")
	}
	f.reports = append(f.reports, r)
	return nil
}

func (f *reportingAgent) got() []api.MonitorReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reports)
}

// The reporter sends at most one report a monitorReportInterval, the latest, and the
// last one when it closes; the agent's errors are warnings for the command to print,
// once while they last.
func TestMonitorReporter(t *testing.T) {
	f := &reportingAgent{}
	r := startMonitorReporter("sec/ids", f.report)
	start := time.Now()
	for i := range 5 {
		if w := r.offer(api.MonitorReport{Drops: uint64(i)}); w != "" {
			t.Errorf("warning %q from an agent that takes the reports", w)
		}
	}
	if ws := r.close(api.MonitorReport{Drops: 99}); len(ws) != 0 {
		t.Errorf("warnings %q from an agent that takes the reports", ws)
	}
	if elapsed := time.Since(start); elapsed >= monitorReportInterval {
		t.Fatalf("the test took %s, longer than the interval it checks", elapsed)
	}
	// Within the interval: at most the one the goroutine sent at the first offer, and the
	// last counts, which the close sends.
	if got := f.got(); len(got) == 0 || len(got) > 2 || got[len(got)-1].Drops != 99 {
		t.Errorf("reports %+v, want at most one of the offers and then the last counts", got)
	}

	f.mu.Lock()
	f.refuse = true
	f.mu.Unlock()
	r = startMonitorReporter("sec/ids", f.report)
	var warnings []string
	for range 3 {
		if w := r.offer(api.MonitorReport{}); w != "" {
			warnings = append(warnings, w)
		}
	}
	warnings = append(warnings, r.close(api.MonitorReport{})...)
	want := "warning: reporting monitor sec/ids's counts to the agent: endpoint sec/ids not found"
	if len(warnings) != 1 || warnings[0] != want {
		t.Errorf("warnings %q, want %q once for the refused reports", warnings, want)
	}
}
