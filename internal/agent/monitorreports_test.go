package agent

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
)

// The agent keeps the latest report of each monitor endpoint it has, in the metrics'
// counts, refuses reports of other endpoints and malformed ones, and drops a monitor's
// report with the monitor: a monitor added again under the same name starts without one.
func TestMonitorReports(t *testing.T) {
	h := newTapHarness(t)
	ctx := context.Background()
	h.addMonitor("sec", "ids")
	h.addMonitor("sec", "ids2")
	h.add("shop", "web", map[string]string{"app": "web"})

	monitors := func() []api.MonitorMetrics {
		t.Helper()
		m, err := h.a.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return m.Monitors
	}
	if got := monitors(); len(got) != 0 {
		t.Fatalf("reports before any: %+v", got)
	}

	first := api.MonitorReport{Alerts: []api.MonitorAlertCount{{Contract: "web-mirror", Severity: 2, Count: 3}}, CapturePackets: 10}
	if err := h.a.ReportMonitor(ctx, "sec", "ids", first); err != nil {
		t.Fatal(err)
	}
	latest := api.MonitorReport{
		Alerts:         []api.MonitorAlertCount{{Contract: "web-mirror", Severity: 2, Count: 5}, {Severity: 3, Count: 1}},
		Drops:          4,
		CapturePackets: 20, CaptureKernelDrops: 2,
	}
	if err := h.a.ReportMonitor(ctx, "sec", "ids", latest); err != nil {
		t.Fatal(err)
	}
	if err := h.a.ReportMonitor(ctx, "sec", "ids2", api.MonitorReport{CapturePackets: 1}); err != nil {
		t.Fatal(err)
	}
	got := monitors()
	if len(got) != 2 || got[0].Monitor != "sec/ids" || got[1].Monitor != "sec/ids2" {
		t.Fatalf("reports: %+v, want sec/ids and sec/ids2", got)
	}
	r := got[0].Report
	if len(r.Alerts) != 2 || r.Alerts[0] != latest.Alerts[0] || r.Alerts[1] != latest.Alerts[1] ||
		r.Drops != 4 || r.CapturePackets != 20 || r.CaptureKernelDrops != 2 || got[0].Received.IsZero() {
		t.Errorf("sec/ids: %+v received %s, want the latest report %+v", r, got[0].Received, latest)
	}

	status := func(err error) int {
		var e *api.Error
		if !errors.As(err, &e) {
			return 0
		}
		return e.Status
	}
	tooMany := api.MonitorReport{Alerts: make([]api.MonitorAlertCount, api.MaxMonitorAlertCounts+1)}
	for i := range tooMany.Alerts {
		tooMany.Alerts[i] = api.MonitorAlertCount{Contract: "c" + strings.Repeat("x", i%200), Severity: 1 + i%4}
	}
	for _, c := range []struct {
		name     string
		ns, ep   string
		report   api.MonitorReport
		status   int
		contains string
	}{
		{"unknown endpoint", "sec", "nope", api.MonitorReport{}, http.StatusNotFound, "endpoint sec/nope not found"},
		{"not a monitor", "shop", "web", api.MonitorReport{}, http.StatusBadRequest, "endpoint shop/web is not a monitor"},
		{"severity 0", "sec", "ids", api.MonitorReport{Alerts: []api.MonitorAlertCount{{Contract: "a", Severity: 0}}}, http.StatusBadRequest, "severity 0, want 1 to 4"},
		{"severity 5", "sec", "ids", api.MonitorReport{Alerts: []api.MonitorAlertCount{{Severity: 5}}}, http.StatusBadRequest, "severity 5"},
		{"twice", "sec", "ids", api.MonitorReport{Alerts: []api.MonitorAlertCount{{Contract: "a", Severity: 1}, {Contract: "a", Severity: 1}}}, http.StatusBadRequest, "given twice"},
		{"long name", "sec", "ids", api.MonitorReport{Alerts: []api.MonitorAlertCount{{Contract: strings.Repeat("a", 254), Severity: 1}}}, http.StatusBadRequest, "254 bytes"},
		{"too many", "sec", "ids", tooMany, http.StatusBadRequest, "1025 alert counts, more than the limit of 1024"},
	} {
		err := h.a.ReportMonitor(ctx, c.ns, c.ep, c.report)
		if status(err) != c.status || !strings.Contains(err.Error(), c.contains) {
			t.Errorf("%s: %v (status %d), want status %d and %q", c.name, err, status(err), c.status, c.contains)
		}
	}
	// A refused report leaves the previous one.
	if got := monitors(); got[0].Report.Drops != 4 {
		t.Errorf("after refused reports: %+v", got[0].Report)
	}

	// A monitor deleted and added again under its name, with no read between, is
	// another endpoint: the old one's report is not its.
	if err := h.a.DeleteEndpoint(ctx, "sec", "ids2"); err != nil {
		t.Fatal(err)
	}
	h.addMonitor("sec", "ids2")
	if got := monitors(); len(got) != 1 || got[0].Monitor != "sec/ids" {
		t.Errorf("reports after sec/ids2 was deleted and added again: %+v", got)
	}
	// The monitor goes, and its report with it.
	if err := h.a.DeleteEndpoint(ctx, "sec", "ids"); err != nil {
		t.Fatal(err)
	}
	if got := monitors(); len(got) != 0 {
		t.Errorf("reports after sec/ids was deleted: %+v", got)
	}
	h.a.mu.Lock()
	kept := h.a.taps.ReportsKept()
	h.a.mu.Unlock()
	if kept != 0 {
		t.Errorf("the agent keeps %d reports of monitors that are gone", kept)
	}
}
