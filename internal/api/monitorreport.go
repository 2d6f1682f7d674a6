package api

import (
	"fmt"
	"time"
	"unicode/utf8"
)

// Bounds of a monitor report, so that what a client sends cannot grow the agent's memory
// or its metrics without bound: each alert count becomes a series of
// rampart_monitor_alerts_total.
const (
	// MaxMonitorAlertCounts bounds the alert counts of one report (pairs of contract
	// and severity).
	MaxMonitorAlertCounts = 1024
	// MaxContractNameBytes is the longest tap contract name (a DNS subdomain).
	MaxContractNameBytes = 253
	// MinSeverity and MaxSeverity bound an alert's severity: Suricata's priorities 1
	// (highest) to 4.
	MinSeverity, MaxSeverity = 1, 4
)

// MonitorReport is what `rampart monitor run` has read from its monitor's EVE file since
// it started (counts start again at 0 when it starts again), sent to the agent for its
// metrics.
type MonitorReport struct {
	// Alerts count alert records by the tap contracts the join attributed them to (an
	// alert tapped by two contracts counts in both) and severity.
	Alerts []MonitorAlertCount `json:"alerts,omitempty"`
	// Drops counts drop records: packets an inline monitor dropped.
	Drops uint64 `json:"drops"`
	// CapturePackets and CaptureKernelDrops are Suricata's own capture counters from its
	// latest stats record: packets the kernel handed it, and packets the kernel dropped
	// because its capture ring was full.
	CapturePackets     uint64 `json:"capturePackets"`
	CaptureKernelDrops uint64 `json:"captureKernelDrops"`
}

// MonitorAlertCount is how many alerts of one severity the join attributed to Contract
// ("" for alerts of no contract).
type MonitorAlertCount struct {
	Contract string `json:"contract"`
	Severity int    `json:"severity"`
	Count    uint64 `json:"count"`
}

// Validate checks the report's bounds: at most MaxMonitorAlertCounts alert counts, each
// pair of contract and severity once, severities MinSeverity to MaxSeverity, contract
// names of at most MaxContractNameBytes of UTF-8.
func (r *MonitorReport) Validate() error {
	if len(r.Alerts) > MaxMonitorAlertCounts {
		return fmt.Errorf("%d alert counts, more than the limit of %d", len(r.Alerts), MaxMonitorAlertCounts)
	}
	type key struct {
		contract string
		severity int
	}
	seen := make(map[key]bool, len(r.Alerts))
	for _, a := range r.Alerts {
		// The name is not repeated in the error: it may be up to a request body long.
		if len(a.Contract) > MaxContractNameBytes || !utf8.ValidString(a.Contract) {
			return fmt.Errorf("alert count of a contract name of %d bytes: want a tap contract name, UTF-8, at most %d bytes", len(a.Contract), MaxContractNameBytes)
		}
		if a.Severity < MinSeverity || a.Severity > MaxSeverity {
			return fmt.Errorf("alert count of contract %q: severity %d, want %d to %d", a.Contract, a.Severity, MinSeverity, MaxSeverity)
		}
		k := key{a.Contract, a.Severity}
		if seen[k] {
			return fmt.Errorf("alert count of contract %q, severity %d: given twice", a.Contract, a.Severity)
		}
		seen[k] = true
	}
	return nil
}

// MonitorMetrics is the latest report of one monitor endpoint of this node
// ("namespace/name") and when the agent received it.
type MonitorMetrics struct {
	Monitor  string        `json:"monitor"`
	Received time.Time     `json:"received"`
	Report   MonitorReport `json:"report"`
}
