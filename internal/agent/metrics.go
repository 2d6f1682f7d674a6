package agent

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/policy"
)

// The agent's metrics are counts it keeps anyway or can keep for almost nothing: the flow
// events and L7 requests it already reads (counted where they are published, under the
// lock that publishing takes), the time of each dataplane apply, and what the model and
// the counters maps hold, read only when Metrics is called. Nothing is added to the
// dataplane, and nothing grows without a reader: every count is keyed by names from
// small fixed sets.

// Bucket bounds, in seconds: an apply takes from well under a millisecond (one endpoint's
// policy) to seconds (a CIDR set change of millions of prefixes); an L7 request from tens
// of microseconds (the fast path's check) to its upstream's answer time.
var (
	applyBounds       = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	l7LatencyBounds   = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	propagationBounds = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
)

// histogram is a fixed-bucket distribution; its owner guards it.
type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, the last above every bound
	count  uint64
	sum    float64
}

func newHistogram(bounds []float64) histogram {
	return histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	h.counts[sort.SearchFloat64s(h.bounds, s)]++
	h.count++
	h.sum += s
}

func (h *histogram) snapshot() api.Histogram {
	return api.Histogram{Bounds: h.bounds, Counts: slices.Clone(h.counts), Count: h.count, Sum: h.sum}
}

// flowKey is what a flow event is counted by: each field takes one of a few values.
type flowKey struct {
	typ       flow.EventType
	verdict   flow.Verdict
	reason    flow.Reason
	direction policy.Direction
	protocol  uint8
	arp       bool
}

func flowKeyOf(ev flow.Event) flowKey {
	return flowKey{typ: ev.Type, verdict: ev.Verdict, reason: ev.Reason, direction: ev.Direction, protocol: uint8(ev.Protocol), arp: ev.Flags.Has(flow.FlagARP)}
}

// count renders the key with the names decorate gives the flow's fields.
func (k flowKey) count(n uint64) api.FlowCount {
	c := api.FlowCount{Type: k.typ.String(), Verdict: k.verdict.String(), Protocol: protocolName(k.protocol), Count: n}
	if k.reason != flow.ReasonNone {
		c.Reason = k.reason.String()
	}
	if k.direction == policy.Ingress || k.direction == policy.Egress {
		c.Direction = k.direction.String()
	}
	if k.arp {
		c.Protocol = "ARP"
	}
	return c
}

// l7Key is what an L7 request is counted by.
type l7Key struct {
	verdict, reason string
	sendSide        bool
}

func l7KeyOf(l *flow.AccessLog) l7Key {
	k := l7Key{verdict: flow.VerdictForwarded.String(), sendSide: l.Chain == flow.FlagSendSide.String()}
	switch {
	case l.Denied:
		k.verdict, k.reason = flow.VerdictDropped.String(), ReasonL7Denied
	case !l.Upstream:
		k.verdict, k.reason = flow.VerdictDropped.String(), ReasonL7Error
	}
	return k
}

// flowCounts are the flow hub's counts; the hub's mutex guards them.
type flowCounts struct {
	flows     map[flowKey]uint64
	l7        map[l7Key]uint64
	l7Latency histogram
}

func newFlowCounts() flowCounts {
	return flowCounts{flows: map[flowKey]uint64{}, l7: map[l7Key]uint64{}, l7Latency: newHistogram(l7LatencyBounds)}
}

func (h *flowHub) countsSnapshot() ([]api.FlowCount, []api.L7Count, api.Histogram) {
	h.mu.Lock()
	defer h.mu.Unlock()
	flows := make([]api.FlowCount, 0, len(h.counts.flows))
	for k, n := range h.counts.flows {
		flows = append(flows, k.count(n))
	}
	l7 := make([]api.L7Count, 0, len(h.counts.l7))
	for k, n := range h.counts.l7 {
		c := api.L7Count{Verdict: k.verdict, Reason: k.reason, Checker: "proxy", Count: n}
		if k.sendSide {
			c.Checker = flow.FlagSendSide.String()
		}
		l7 = append(l7, c)
	}
	return flows, l7, h.counts.l7Latency.snapshot()
}

// Metrics returns the agent's counts for its Prometheus metrics. The endpoints' counters
// are read after the agent's lock is released: they take a netlink request each.
func (a *Agent) Metrics(ctx context.Context) (api.Metrics, error) {
	var out api.Metrics
	out.Flows, out.L7, out.L7Latency = a.flows.countsSnapshot()
	type read struct {
		i             int
		ifindex, epID uint32
	}
	var reads []read
	a.mu.Lock()
	out.Apply, out.ApplyFailures = a.applyTimes.snapshot(), a.applyFailures
	out.Propagation = a.propagation.snapshot()
	out.Monitors = a.taps.Reports(a.isMonitor)
	for _, key := range sortedKeys(a.model.endpoints) {
		rec := a.model.endpoints[key]
		out.Endpoints = append(out.Endpoints, api.EndpointMetrics{Endpoint: key, PolicyEntries: len(a.cur.state.Endpoints[rec.EpID].Entries)})
		if ifindex, ok := a.ifindex[rec.EpID]; ok {
			reads = append(reads, read{i: len(out.Endpoints) - 1, ifindex: ifindex, epID: rec.EpID})
		}
	}
	netns := a.net.NetnsPath()
	a.mu.Unlock()
	for _, r := range reads {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		// An endpoint deleted meanwhile has no interface any more: it has no counters
		// in this scrape, and the next one no longer lists it.
		if c, err := a.dp.Counters(netns, r.ifindex, r.epID); err == nil {
			ac := api.Counters(c)
			out.Endpoints[r.i].Counters = &ac
		}
	}
	return out, nil
}
