package agent

import (
	"context"
	"time"

	"github.com/rampartnet/rampart/internal/api"
)

// monitorReport is the latest report of one monitor endpoint, and the endpoint's id when
// it came: a monitor deleted and added again under the same name is another endpoint,
// whose counts start from nothing.
type monitorReport struct {
	epID     uint32
	received time.Time
	report   api.MonitorReport
}

// ReportMonitor keeps the report of `monitor run` of monitor endpoint namespace/name in
// place of the previous one, for the metrics. The agent only holds reports of the
// monitor endpoints it has: one of another endpoint is refused, and a monitor's report
// goes with its endpoint (prune).
func (a *Agent) ReportMonitor(_ context.Context, namespace, name string, r api.MonitorReport) error {
	key := namespace + "/" + name
	if err := r.Validate(); err != nil {
		return api.BadRequest("report of monitor %s: %v", key, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	rec, ok := a.model.endpoints[key]
	if !ok {
		return api.NotFound("report of monitor %s: endpoint %s not found", key, key)
	}
	if !rec.Monitor {
		return api.BadRequest("report of monitor %s: endpoint %s is not a monitor", key, key)
	}
	a.pruneMonitorReports()
	if a.monitorReports == nil {
		a.monitorReports = map[string]monitorReport{}
	}
	a.monitorReports[key] = monitorReport{epID: rec.EpID, received: time.Now(), report: r}
	return nil
}

// pruneMonitorReports drops the reports of monitors that are gone (or are no monitors
// any more). It runs at every report and every read rather than at each change of the
// endpoints, which have many paths (the CLI, CNI, Kubernetes views): either way no
// report of a monitor that is gone is ever read, and the reports kept are at most one per
// monitor there was at the last report or read. a.mu must be held.
func (a *Agent) pruneMonitorReports() {
	for key, mr := range a.monitorReports {
		if rec, ok := a.model.endpoints[key]; !ok || !rec.Monitor || rec.EpID != mr.epID {
			delete(a.monitorReports, key)
		}
	}
}

// monitorMetrics returns the reports of the monitors there are, by key. a.mu must be
// held.
func (a *Agent) monitorMetrics() []api.MonitorMetrics {
	a.pruneMonitorReports()
	var out []api.MonitorMetrics
	for _, key := range sortedKeys(a.monitorReports) {
		mr := a.monitorReports[key]
		out = append(out, api.MonitorMetrics{Monitor: key, Received: mr.received, Report: mr.report})
	}
	return out
}
