package tappolicy

import (
	"fmt"
	"sort"
	"strings"
)

// placer chooses a monitor for each inspect request, in the order of the requests (sorted,
// so a compilation is deterministic). Every request a monitor takes adds one to its load,
// so the sources of a node (or an application) are sliced across its monitors: each goes
// to the least loaded monitor at its turn, ties broken by name.
type placer struct {
	strategy string
	monitors []Endpoint
	load     map[string]int64 // monitor -> its load plus the requests placed on it
}

func newPlacer(strategy string, f Facts) *placer {
	p := &placer{strategy: strategy, load: map[string]int64{}}
	for _, e := range f.Endpoints {
		if e.Monitor != nil {
			p.monitors = append(p.monitors, e)
			p.load[e.Key()] = e.Monitor.Load
		}
	}
	sort.Slice(p.monitors, func(i, j int) bool { return p.monitors[i].Key() < p.monitors[j].Key() })
	return p
}

// place returns the monitor for a request to inspect what on src's flows, and the reason
// (why this one, or why none). A redirect's monitor runs on src's node: diverted packets
// return there with the identity they left with, which only that node knows.
func (p *placer) place(src Endpoint, what string, redirect bool) (string, string, bool) {
	var cands []Endpoint
	var scope string
	switch p.strategy {
	case PerApp:
		app, ok := src.Labels["app"]
		if !ok {
			return "", fmt.Sprintf("%s: %s has no app label", PerApp, src.Key()), false
		}
		scope = fmt.Sprintf("monitors of application %q (label %s=%s)", app, MonitorForLabel, app)
		if redirect {
			scope = fmt.Sprintf("monitors of application %q (label %s=%s) on node %s", app, MonitorForLabel, app, src.Node)
		}
		for _, m := range p.monitors {
			if m.Labels[MonitorForLabel] == app && inspects(m, what) && (!redirect || m.Node == src.Node) {
				cands = append(cands, m)
			}
		}
	default:
		scope = fmt.Sprintf("monitors on node %s", src.Node)
		for _, m := range p.monitors {
			if m.Node == src.Node && inspects(m, what) {
				cands = append(cands, m)
			}
		}
	}
	if len(cands) == 0 {
		why := fmt.Sprintf("%s: no %s inspect %q", p.strategy, scope, what)
		if redirect && p.strategy == PerApp {
			why += " (a redirect's monitor runs on its source's node)"
		}
		return "", why, false
	}
	best := cands[0]
	var loads []string
	for _, m := range cands {
		loads = append(loads, fmt.Sprintf("%s load %d", m.Key(), p.load[m.Key()]))
		if p.load[m.Key()] < p.load[best.Key()] {
			best = m
		}
	}
	reason := fmt.Sprintf("%s: the least loaded of the %s that inspect %q (%s)", p.strategy, scope, what, strings.Join(loads, ", "))
	p.load[best.Key()]++
	return best.Key(), reason, true
}

// inspects says whether monitor m understands what ("any" understands everything).
func inspects(m Endpoint, what string) bool {
	for _, w := range m.Monitor.Inspects {
		if w = strings.ToLower(w); w == what || w == "any" {
			return true
		}
	}
	return false
}
