package taps

import (
	"sort"
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

// Monitor says whether key is a monitor endpoint and its endpoint id.
type Monitor func(key string) (epID uint32, ok bool)

// KeepReport keeps the report of `monitor run` of monitor key (endpoint epID) in place of
// the previous one, for the metrics; current says which monitors there are.
func (s *Subsystem) KeepReport(key string, epID uint32, r api.MonitorReport, current Monitor) {
	s.pruneReports(current)
	if s.reports == nil {
		s.reports = map[string]monitorReport{}
	}
	s.reports[key] = monitorReport{epID: epID, received: time.Now(), report: r}
}

// pruneReports drops the reports of monitors that are gone (or are no monitors any
// more). It runs at every report and every read rather than at each change of the
// endpoints, which have many paths (the CLI, CNI, Kubernetes views): either way no report
// of a monitor that is gone is ever read, and the reports kept are at most one per monitor
// there was at the last report or read.
func (s *Subsystem) pruneReports(current Monitor) {
	for key, mr := range s.reports {
		if epID, ok := current(key); !ok || epID != mr.epID {
			delete(s.reports, key)
		}
	}
}

// Reports returns the reports of the monitors there are (current), by key.
func (s *Subsystem) Reports(current Monitor) []api.MonitorMetrics {
	s.pruneReports(current)
	keys := make([]string, 0, len(s.reports))
	for key := range s.reports {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	var out []api.MonitorMetrics
	for _, key := range keys {
		mr := s.reports[key]
		out = append(out, api.MonitorMetrics{Monitor: key, Received: mr.received, Report: mr.report})
	}
	return out
}

// ReportsKept is how many reports the subsystem holds (tests: none of monitors that are
// gone once read).
func (s *Subsystem) ReportsKept() int { return len(s.reports) }
