package agent

import (
	"maps"
	"time"

	"github.com/rampartnet/rampart/internal/endpoint"
)

// monitorCheckInterval is how often the agent checks that its monitors read: a monitor
// process that died is shown down, and what is sent to it counted as lost or dropped,
// within this time (and at once when the taps are listed).
const monitorCheckInterval = time.Second

// watchMonitors checks the local monitors every monitorCheckInterval until stop closes.
func (a *Agent) watchMonitors(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(monitorCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			a.refreshMonitors()
		}
	}
}

// refreshMonitors checks whether each local monitor reads its receive interface
// (endpoint.MonitorReading) and, when that changed, resolves the taps again: a monitor
// that does not read is down, like a missing one, so the dataplane counts the copies
// sent to it as lost and drops what a fail-closed redirect would divert to it (counted
// as dropped, monitor unavailable), rather than count them as mirrored or redirected
// into an interface nothing reads. A check that fails counts as not reading.
func (a *Agent) refreshMonitors() {
	type monitor struct{ key, netns string }
	var mons []monitor
	a.mu.Lock()
	if a.dp.Monitors != nil && a.dp.Taps != nil {
		for key, rec := range a.model.endpoints {
			if rec.Monitor {
				mons = append(mons, monitor{key, endpointNetnsPath(a.net, rec)})
			}
		}
	}
	a.mu.Unlock()
	down := map[string]string{}
	for _, m := range mons {
		reading, err := a.net.MonitorReading(m.netns)
		switch {
		case err != nil:
			down[m.key] = "not reading: " + err.Error()
		case !reading:
			down[m.key] = endpoint.NotReadingProblem
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for key := range down {
		// Deleted (or no longer a monitor) while it was checked.
		if rec, ok := a.model.endpoints[key]; !ok || !rec.Monitor {
			delete(down, key)
		}
	}
	// Copies from other nodes are refused on arrival for a monitor that is down. Set at
	// every check (the kernel side keeps what it set), so that a monitor attached again
	// while down is withdrawn too.
	for key, rec := range a.model.endpoints {
		if !rec.Monitor {
			continue
		}
		_, isDown := down[key]
		if err := a.dp.Monitors.SetMonitorReading(rec.EpID, !isDown); err != nil {
			a.log.Warn("applying a monitor's state to copies from other nodes", "monitor", key, "error", err)
		}
	}
	if maps.Equal(down, a.model.monitorsDown) {
		return
	}
	for key, why := range down {
		if _, was := a.model.monitorsDown[key]; !was {
			a.log.Warn("monitor down", "monitor", key, "reason", why)
		}
	}
	for key := range a.model.monitorsDown {
		if _, is := down[key]; !is {
			a.log.Info("monitor reading again", "monitor", key)
		}
	}
	if _, _, err := a.change(func(m *model) error { m.monitorsDown = down; return nil }); err != nil {
		a.log.Warn("applying the monitors' state", "error", err)
	}
}
