package metrics

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rampartnet/rampart/internal/api"
)

// Source is what the collector reads from the agent (*agent.Agent).
type Source interface {
	Status(ctx context.Context) (api.Status, error)
	ListCIDRSets(ctx context.Context) ([]api.CIDRSet, error)
	ListTaps(ctx context.Context) ([]api.Tap, error)
	Metrics(ctx context.Context) (api.Metrics, error)
}

// scrapeTimeout bounds one scrape, below Prometheus's default scrape timeout (10 s). The
// agent's methods wait for its lock whatever the context says; the context stops the
// endpoints' counter reads, and the handler's timeout (a second more) answers the scraper.
const scrapeTimeout = 8 * time.Second

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	src Source
	log *slog.Logger
}

// NewCollector returns a collector reading src at each scrape; log gets what could not be
// read (nil: slog.Default()).
func NewCollector(src Source, log *slog.Logger) *Collector {
	if log == nil {
		log = slog.Default()
	}
	return &Collector{src: src, log: log}
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect reads the source and sends its metrics. A part that cannot be read is left out
// and its rampart_scrape_source_up is 0; the rest is sent.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	e := emitter{ch: ch}
	up := func(source string, err error) {
		v := 1.0
		if err != nil {
			v = 0
			c.log.Warn("metrics: reading the agent", "source", source, "error", err)
		}
		e.gauge(descSourceUp, v, source)
	}
	st, err := c.src.Status(ctx)
	up("status", err)
	if err == nil {
		e.status(st)
	}
	m, err := c.src.Metrics(ctx)
	up("counts", err)
	if err == nil {
		e.counts(m, st.Kubernetes != nil)
	}
	sets, err := c.src.ListCIDRSets(ctx)
	up("cidrsets", err)
	if err == nil {
		e.cidrSets(sets)
	}
	taps, err := c.src.ListTaps(ctx)
	up("taps", err)
	if err == nil {
		e.taps(taps)
	}
}

// emitter sends constant metrics.
type emitter struct{ ch chan<- prometheus.Metric }

func (e emitter) gauge(d *prometheus.Desc, v float64, labels ...string) {
	e.ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func (e emitter) counter(d *prometheus.Desc, v uint64, labels ...string) {
	e.ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

func (e emitter) histogram(d *prometheus.Desc, h api.Histogram) {
	buckets := make(map[float64]uint64, len(h.Bounds))
	var cum uint64
	for i, b := range h.Bounds {
		if i < len(h.Counts) {
			cum += h.Counts[i]
		}
		buckets[b] = cum
	}
	e.ch <- prometheus.MustNewConstHistogram(d, h.Count, h.Sum, buckets)
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// proxyStates are the L7 proxy's states (api.ProxyStatus.State), each a series of
// rampart_l7_proxy_state, so that a state that was never reached is 0 and not absent.
var proxyStates = []string{"not started", "starting", "running", "restarting", "unavailable"}

func (e emitter) status(st api.Status) {
	e.gauge(descBuildInfo, 1, st.Version)
	e.gauge(descEndpoints, float64(st.Endpoints))
	e.gauge(descPolicies, float64(st.Policies))
	e.gauge(descIdentities, float64(st.Identities))
	e.gauge(descDegraded, boolValue(st.Degraded != ""))
	e.counter(descObserverLost, st.FlowsLost)

	known := false
	for _, s := range proxyStates {
		e.gauge(descProxyState, boolValue(st.Proxy.State == s), s)
		known = known || st.Proxy.State == s
	}
	if !known && st.Proxy.State != "" {
		e.gauge(descProxyState, 1, st.Proxy.State)
	}
	e.counter(descProxyRestarts, uint64(st.Proxy.Restarts))
	if fp := st.Proxy.FastPath; fp != nil {
		e.counter(descFastPathRequests, fp.Requests)
		e.counter(descFastPathDenied, fp.Denied)
		e.counter(descFastPathHandedOver, fp.HandedOver)
		e.gauge(descFastPathOpen, float64(fp.Open))
	}
	if ss := st.SendSide; ss != nil {
		e.gauge(descSendSidePairs, float64(ss.Pairs))
		e.counter(descSendSideRequests, ss.Passed, "passed")
		e.counter(descSendSideRequests, ss.Refused, "refused")
		e.counter(descSendSideRequests, ss.OutsideSubset, "outside-subset")
		e.counter(descSendSideRequests, ss.SendFailed, "send-failed")
		e.counter(descSendSideEventsLost, ss.EventsLost)
	}

	d := st.DNS
	e.counter(descDNSQueries, d.Queries)
	e.counter(descDNSResults, d.Allowed, "allowed")
	e.counter(descDNSResults, d.Refused, "refused")
	e.counter(descDNSResults, d.Forwarded, "forwarded")
	e.counter(descDNSResults, d.UpstreamErrors, "upstream-error")
	e.counter(descDNSResults, d.LearnErrors, "learn-error")
	for reason, n := range d.Drops {
		e.counter(descDNSDrops, n, reason)
	}
	e.gauge(descFQDNNames, float64(d.Names))
	e.gauge(descFQDNAddresses, float64(d.Addresses))
	e.counter(descFQDNEvicted, d.Evicted)

	if mem := st.Memory; mem != nil {
		// Maps of the same name (unpinned maps of two programs can share one) are summed:
		// a series per name.
		type usage struct {
			typ        string
			bytes, max uint64
		}
		byName := map[string]*usage{}
		var order []string
		for _, m := range mem.Maps {
			u, ok := byName[m.Name]
			if !ok {
				u = &usage{typ: m.Type}
				byName[m.Name] = u
				order = append(order, m.Name)
			}
			u.bytes += m.Bytes
			u.max += uint64(m.MaxEntries)
		}
		for _, name := range order {
			u := byName[name]
			e.gauge(descMapBytes, float64(u.bytes), name, u.typ)
			e.gauge(descMapMaxEntries, float64(u.max), name, u.typ)
		}
	}

	if k := st.Kubernetes; k != nil {
		e.gauge(descK8sSynced, boolValue(k.Synced))
		e.gauge(descK8sFailing, boolValue(k.Failing))
		e.counter(descK8sSyncs, k.Syncs)
		e.counter(descK8sWatchErrors, k.WatchErrors)
		e.counter(descK8sSyncFailures, k.SyncFailures)
		if !k.LastSync.IsZero() {
			e.gauge(descK8sLastSync, float64(k.LastSync.UnixNano())/1e9)
		}
		e.gauge(descK8sRefused, float64(len(k.Refused)))
		e.gauge(descK8sProblems, float64(len(k.Problems)))
		e.gauge(descK8sUnresolved, float64(len(k.Unresolved)))
		e.gauge(descK8sQuarantined, float64(len(k.Quarantined)))
		e.gauge(descK8sNodes, float64(k.Nodes))
		e.gauge(descK8sRemotes, float64(k.RemoteEndpoints))
	}

	if mo := st.Monitors; mo != nil {
		e.gauge(descMonitors, float64(mo.Monitors))
		e.gauge(descMonitorsDown, float64(len(mo.Down)))
		e.counter(descMonitorRemoteCopies, mo.CopiesFromOtherNodes, "delivered")
		e.counter(descMonitorRemoteCopies, mo.CopiesFromOtherNodesLost, "lost")
		e.counter(descMonitorNotDiverted, mo.NotDiverted)
	}
}

func (e emitter) counts(m api.Metrics, kubernetes bool) {
	for _, f := range m.Flows {
		e.counter(descFlows, f.Count, f.Type, f.Verdict, f.Reason, f.Direction, f.Protocol)
	}
	for _, l := range m.L7 {
		e.counter(descL7Requests, l.Count, l.Verdict, l.Reason, l.Checker)
	}
	e.histogram(descL7Duration, m.L7Latency)
	e.histogram(descApplyDuration, m.Apply)
	e.counter(descApplyFailures, m.ApplyFailures)
	if kubernetes {
		e.histogram(descK8sPropagation, m.Propagation)
	}
	e.monitors(m.Monitors)
	for _, ep := range m.Endpoints {
		e.gauge(descPolicyEntries, float64(ep.PolicyEntries), ep.Endpoint)
		if c := ep.Counters; c != nil {
			e.counter(descEndpointPackets, c.IngressPackets, ep.Endpoint, "ingress")
			e.counter(descEndpointPackets, c.EgressPackets, ep.Endpoint, "egress")
			e.counter(descEndpointBytes, c.IngressBytes, ep.Endpoint, "ingress")
			e.counter(descEndpointBytes, c.EgressBytes, ep.Endpoint, "egress")
			e.counter(descEndpointDrops, c.IngressDrops, ep.Endpoint, "ingress")
			e.counter(descEndpointDrops, c.EgressDrops, ep.Endpoint, "egress")
		}
	}
}

func (e emitter) monitors(mons []api.MonitorMetrics) {
	for _, mo := range mons {
		r := mo.Report
		for _, a := range r.Alerts {
			e.counter(descMonitorAlerts, a.Count, mo.Monitor, a.Contract, strconv.Itoa(a.Severity))
		}
		e.counter(descMonitorDrops, r.Drops, mo.Monitor)
		e.counter(descMonitorCapturePackets, r.CapturePackets, mo.Monitor)
		e.counter(descMonitorCaptureKernelDrops, r.CaptureKernelDrops, mo.Monitor)
		e.gauge(descMonitorLastReport, float64(mo.Received.UnixNano())/1e9, mo.Monitor)
	}
}

func (e emitter) cidrSets(sets []api.CIDRSet) {
	for _, s := range sets {
		e.gauge(descCIDRSetPrefixes, float64(s.IPv4), s.Name, "ipv4")
		e.gauge(descCIDRSetPrefixes, float64(s.IPv6), s.Name, "ipv6")
	}
}

func (e emitter) taps(taps []api.Tap) {
	for _, t := range taps {
		c := t.Counters
		if c == nil {
			continue
		}
		e.counter(descTapMirroredPackets, c.MirroredPackets, t.Name)
		e.counter(descTapMirroredBytes, c.MirroredBytes, t.Name)
		e.counter(descTapRedirectedPackets, c.RedirectedPackets, t.Name)
		e.counter(descTapRedirectedBytes, c.RedirectedBytes, t.Name)
		e.counter(descTapCopiesLost, c.CopiesLost, t.Name)
		e.counter(descTapDropped, c.DroppedByMonitor, t.Name, "not-returned")
		e.counter(descTapDropped, c.DroppedUnavailable, t.Name, "monitor-unavailable")
	}
}
