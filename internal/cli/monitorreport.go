package cli

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/monitor/join"
	"github.com/rampartnet/rampart/internal/monitor/suricata"
)

// monitorReportInterval is the least time between two reports of monitor run to the
// agent: it reads EVE every monitorPollInterval, and a request per read would be ten a
// second per monitor for metrics scraped every few seconds at most.
const monitorReportInterval = time.Second

// monitorReportTimeout bounds one report: an agent that does not answer delays the next
// report, never the monitor.
const monitorReportTimeout = 5 * time.Second

type alertCountKey struct {
	contract string
	severity int
}

// monitorCounts are what monitor run has read from its monitor's EVE file since it
// started, for the agent's metrics (api.MonitorReport).
type monitorCounts struct {
	alerts  map[alertCountKey]uint64
	drops   uint64
	capture suricata.Stats
	// overflow: alerts of contracts beyond api.MaxMonitorAlertCounts were left out (and
	// said so once), since the agent refuses a report with more.
	overflow bool
	warn     io.Writer
}

func newMonitorCounts(warn io.Writer) *monitorCounts {
	return &monitorCounts{alerts: map[alertCountKey]uint64{}, warn: warn}
}

// add counts an alert or drop as it was printed. An alert counts once for each contract
// the join attributed it to (once for contract "" with none). Suricata's priorities go
// from 1 to 255, the severities reported from 1 to 4: lower priorities count as 4.
// Nothing of the signature is kept, so that the agent's series stay as few as the
// contracts.
func (c *monitorCounts) add(al join.Alert) {
	if c == nil {
		return
	}
	if al.Event == suricata.TypeDrop {
		c.drops++
		return
	}
	sev := min(max(al.Severity, api.MinSeverity), api.MaxSeverity)
	names := map[string]bool{}
	for _, ref := range al.Contracts {
		names[ref.Name] = true
	}
	if len(names) == 0 {
		names[""] = true
	}
	for name := range names {
		k := alertCountKey{name, sev}
		if _, ok := c.alerts[k]; !ok && len(c.alerts) >= api.MaxMonitorAlertCounts {
			if !c.overflow {
				fmt.Fprintf(c.warn, "warning: alerts of more than %d contracts and severities: those of the others are not reported to the agent\n", api.MaxMonitorAlertCounts)
			}
			c.overflow = true
			continue
		}
		c.alerts[k]++
	}
}

// stats keeps the capture counters of a stats record: totals since Suricata started.
func (c *monitorCounts) stats(ev suricata.Event) {
	if c != nil && ev.Stats != nil {
		c.capture = *ev.Stats
	}
}

func (c *monitorCounts) report() api.MonitorReport {
	r := api.MonitorReport{Drops: c.drops, CapturePackets: c.capture.KernelPackets, CaptureKernelDrops: c.capture.KernelDrops}
	for k, n := range c.alerts {
		r.Alerts = append(r.Alerts, api.MonitorAlertCount{Contract: k.contract, Severity: k.severity, Count: n})
	}
	return r
}

// monitorReporter sends monitor run's counts to the agent from a goroutine of its own,
// at most once a monitorReportInterval: an agent slow to answer (a long change holds it)
// must not hold up the reading and printing of alerts. Only the latest counts matter, so
// a report not sent yet is replaced by a newer one. An error is a warning, which the
// command prints (the goroutine writes nothing): the monitor goes on without the agent's
// metrics.
type monitorReporter struct {
	send func(context.Context, api.MonitorReport) error
	key  string // the monitor's, for warnings

	mu   sync.Mutex
	next *api.MonitorReport
	// warning is a failed report's, not printed yet; lastErr the previous report's
	// error, so that an agent that stays away is a warning once, not every second.
	warning, lastErr string

	wake, stop, done chan struct{}
}

func startMonitorReporter(key string, send func(context.Context, api.MonitorReport) error) *monitorReporter {
	r := &monitorReporter{send: send, key: key, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// offer makes rep the next report, and returns the warning of a report that failed since
// the previous call ("": none) for the caller to print.
func (r *monitorReporter) offer(rep api.MonitorReport) string {
	r.mu.Lock()
	r.next = &rep
	w := r.warning
	r.warning = ""
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return w
}

func (r *monitorReporter) run() {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			return
		case <-r.wake:
		}
		r.sendNext()
		select {
		case <-r.stop:
			return
		case <-time.After(monitorReportInterval):
		}
	}
}

func (r *monitorReporter) sendNext() {
	r.mu.Lock()
	rep := r.next
	r.next = nil
	r.mu.Unlock()
	if rep == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), monitorReportTimeout)
	defer cancel()
	err := r.send(ctx, *rep)
	r.mu.Lock()
	defer r.mu.Unlock()
	msg := ""
	if err != nil {
		msg = err.Error()
		if msg != r.lastErr {
			r.warning = fmt.Sprintf("warning: reporting monitor %s's counts to the agent: %v", r.key, err)
		}
	}
	r.lastErr = msg
}

// close stops the goroutine and sends last, the counts at the end of the run; it returns
// the warnings not printed yet.
func (r *monitorReporter) close(last api.MonitorReport) []string {
	close(r.stop)
	<-r.done
	var ws []string
	if w := r.offer(last); w != "" {
		ws = append(ws, w)
	}
	r.sendNext()
	if r.warning != "" {
		ws = append(ws, r.warning)
	}
	return ws
}
