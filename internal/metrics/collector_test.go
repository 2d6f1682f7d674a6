package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv/promtest"
)

// fakeSource is a Source with fixed answers; errs fail the named reads.
type fakeSource struct {
	status  api.Status
	metrics api.Metrics
	sets    []api.CIDRSet
	taps    []api.Tap
	errs    map[string]error
}

func (f *fakeSource) Status(context.Context) (api.Status, error) { return f.status, f.errs["status"] }
func (f *fakeSource) Metrics(context.Context) (api.Metrics, error) {
	return f.metrics, f.errs["counts"]
}
func (f *fakeSource) ListCIDRSets(context.Context) ([]api.CIDRSet, error) {
	return f.sets, f.errs["cidrsets"]
}
func (f *fakeSource) ListTaps(context.Context) ([]api.Tap, error) { return f.taps, f.errs["taps"] }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newFake() *fakeSource {
	return &fakeSource{
		status: api.Status{
			Version: "v1.2.3", Endpoints: 3, Policies: 2, Identities: 5, FlowsLost: 7,
			Proxy: api.ProxyStatus{State: "running", Restarts: 1, FastPath: &api.FastPathStatus{Requests: 10, Denied: 4, Open: 2}},
			DNS:   api.DNSStatus{Queries: 9, Drops: map[string]uint64{"malformed": 2}},
			Memory: &api.MemoryStatus{Maps: []api.MapMemory{
				{Name: "policy", Type: "Hash", MaxEntries: 65536, Bytes: 4096},
				{Name: ".rodata", Type: "Array", MaxEntries: 1, Bytes: 100},
				{Name: ".rodata", Type: "Array", MaxEntries: 1, Bytes: 50},
			}},
			Kubernetes: &api.KubernetesStatus{Synced: true, Syncs: 4, WatchErrors: 1, SyncFailures: 2, LastSync: time.Unix(1700000000, 0), Refused: []api.RefusedObject{{Object: "a"}}},
			Monitors:   &api.MonitorsStatus{Monitors: 1, Down: []string{"m/x: not reading"}, CopiesFromOtherNodes: 3},
		},
		metrics: api.Metrics{
			Flows: []api.FlowCount{
				{Type: "drop", Verdict: "DROPPED", Reason: "policy-deny", Direction: "egress", Protocol: "TCP", Count: 6},
				{Type: "new", Verdict: "FORWARDED", Direction: "ingress", Protocol: "UDP", Count: 11},
			},
			L7:            []api.L7Count{{Verdict: "DROPPED", Reason: "l7-denied", Checker: "proxy", Count: 2}},
			L7Latency:     api.Histogram{Bounds: []float64{0.001, 0.01}, Counts: []uint64{1, 2, 1}, Count: 4, Sum: 0.5},
			Apply:         api.Histogram{Bounds: []float64{0.001, 0.01}, Counts: []uint64{3, 0, 1}, Count: 4, Sum: 12},
			ApplyFailures: 1,
			Propagation:   api.Histogram{Bounds: []float64{0.1}, Counts: []uint64{1, 0}, Count: 1, Sum: 0.05},
			Endpoints: []api.EndpointMetrics{
				{Endpoint: "x/a", PolicyEntries: 12, Counters: &api.Counters{IngressPackets: 100, EgressDrops: 3}},
				{Endpoint: "x/b", PolicyEntries: 0},
			},
			Monitors: []api.MonitorMetrics{{
				Monitor: "sec/ids", Received: time.Unix(1700000100, 500000000),
				Report: api.MonitorReport{
					Alerts: []api.MonitorAlertCount{
						{Contract: "web-mirror", Severity: 2, Count: 5},
						{Contract: "web-mirror", Severity: 3, Count: 1},
						{Severity: 1, Count: 2},
					},
					Drops: 4, CapturePackets: 900, CaptureKernelDrops: 7,
				},
			}},
		},
		sets: []api.CIDRSet{{Name: "threats", IPv4: 1000, IPv6: 20}},
		taps: []api.Tap{
			{Name: "ids", Counters: &api.TapCounters{MirroredPackets: 50, CopiesLost: 2}},
			{Name: "idle"},
		},
	}
}

// value returns the value of the series of family name with exactly labels (name=value
// pairs), failing the test if there is none.
func value(t *testing.T, fams promtest.Families, name string, labels ...string) float64 {
	t.Helper()
	m := fams.Series(name, labels...)
	if m == nil {
		t.Fatalf("no series %s%v", name, labels)
	}
	if m.Gauge == nil && m.Counter == nil {
		t.Fatalf("%s%v is neither a gauge nor a counter", name, labels)
	}
	v, _ := fams.Value(name, labels...)
	return v
}

func TestCollectorValues(t *testing.T) {
	fams := promtest.Gather(t, NewCollector(newFake(), quiet()))
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"rampart_build_info", []string{"version", "v1.2.3"}, 1},
		{"rampart_endpoints", nil, 3},
		{"rampart_identities", nil, 5},
		{"rampart_degraded", nil, 0},
		{"rampart_observe_flows_lost_total", nil, 7},
		{"rampart_flows_total", []string{"type", "drop", "verdict", "DROPPED", "reason", "policy-deny", "direction", "egress", "protocol", "TCP"}, 6},
		{"rampart_flows_total", []string{"type", "new", "verdict", "FORWARDED", "direction", "ingress", "protocol", "UDP"}, 11},
		{"rampart_l7_requests_total", []string{"verdict", "DROPPED", "reason", "l7-denied", "checker", "proxy"}, 2},
		{"rampart_l7_proxy_state", []string{"state", "running"}, 1},
		{"rampart_l7_proxy_state", []string{"state", "unavailable"}, 0},
		{"rampart_l7_fastpath_denied_total", nil, 4},
		{"rampart_l7_fastpath_open_connections", nil, 2},
		{"rampart_policy_apply_failures_total", nil, 1},
		{"rampart_endpoint_policy_entries", []string{"endpoint", "x/a"}, 12},
		{"rampart_endpoint_policy_entries", []string{"endpoint", "x/b"}, 0},
		{"rampart_endpoint_packets_total", []string{"endpoint", "x/a", "direction", "ingress"}, 100},
		{"rampart_endpoint_dropped_packets_total", []string{"endpoint", "x/a", "direction", "egress"}, 3},
		{"rampart_cidr_set_prefixes", []string{"set", "threats", "family", "ipv4"}, 1000},
		{"rampart_cidr_set_prefixes", []string{"set", "threats", "family", "ipv6"}, 20},
		{"rampart_tap_mirrored_packets_total", []string{"tap", "ids"}, 50},
		{"rampart_tap_copies_lost_total", []string{"tap", "ids"}, 2},
		{"rampart_monitors_down", nil, 1},
		{"rampart_monitor_remote_copies_total", []string{"result", "delivered"}, 3},
		{"rampart_dns_queries_dropped_total", []string{"reason", "malformed"}, 2},
		// Two maps of one name are one series, their sum.
		{"rampart_bpf_map_memory_bytes", []string{"map", ".rodata", "type", "Array"}, 150},
		{"rampart_bpf_map_max_entries", []string{"map", "policy", "type", "Hash"}, 65536},
		{"rampart_kubernetes_synced", nil, 1},
		{"rampart_kubernetes_sync_failures_total", nil, 2},
		{"rampart_kubernetes_watch_errors_total", nil, 1},
		{"rampart_kubernetes_refused_objects", nil, 1},
		{"rampart_kubernetes_last_sync_timestamp_seconds", nil, 1700000000},
		{"rampart_scrape_source_up", []string{"source", "taps"}, 1},
		{"rampart_monitor_alerts_total", []string{"monitor", "sec/ids", "contract", "web-mirror", "severity", "2"}, 5},
		{"rampart_monitor_alerts_total", []string{"monitor", "sec/ids", "contract", "web-mirror", "severity", "3"}, 1},
		// Alerts of no contract: an empty label, which Prometheus reads as absent.
		{"rampart_monitor_alerts_total", []string{"monitor", "sec/ids", "severity", "1"}, 2},
		{"rampart_monitor_drops_total", []string{"monitor", "sec/ids"}, 4},
		{"rampart_monitor_capture_packets_total", []string{"monitor", "sec/ids"}, 900},
		{"rampart_monitor_capture_kernel_drops_total", []string{"monitor", "sec/ids"}, 7},
		{"rampart_monitor_last_report_timestamp_seconds", []string{"monitor", "sec/ids"}, 1700000100.5},
	} {
		if got := value(t, fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// Endpoints without counters and taps without counters have no counter series.
	if fams.Series("rampart_endpoint_packets_total", "endpoint", "x/b", "direction", "ingress") != nil || fams.Series("rampart_tap_mirrored_packets_total", "tap", "idle") != nil {
		t.Error("counters of an endpoint or tap that has none")
	}
	// Histograms: buckets are cumulative.
	h := fams.Series("rampart_policy_apply_duration_seconds").GetHistogram()
	if h.GetSampleCount() != 4 || h.GetSampleSum() != 12 || len(h.Bucket) != 2 ||
		h.Bucket[0].GetUpperBound() != 0.001 || h.Bucket[0].GetCumulativeCount() != 3 || h.Bucket[1].GetCumulativeCount() != 3 {
		t.Errorf("apply histogram: %v", h)
	}
	h = fams.Series("rampart_l7_request_duration_seconds").GetHistogram()
	if h.GetSampleCount() != 4 || h.Bucket[1].GetCumulativeCount() != 3 {
		t.Errorf("L7 latency histogram: %v", h)
	}
	if fams.Series("rampart_kubernetes_propagation_duration_seconds").GetHistogram().GetSampleCount() != 1 {
		t.Error("propagation histogram missing in Kubernetes mode")
	}
	if f := fams["rampart_monitor_alerts_total"]; f.GetType() != dto.MetricType_COUNTER || len(f.Metric) != 3 {
		t.Errorf("rampart_monitor_alerts_total: %v, want 3 counters", f)
	}
}

func TestCollectorOutsideKubernetesAndFailedReads(t *testing.T) {
	src := newFake()
	src.status.Kubernetes, src.status.Monitors, src.status.Proxy.FastPath = nil, nil, nil
	src.metrics.Monitors = nil
	fams := promtest.Gather(t, NewCollector(src, quiet()))
	for _, name := range []string{"rampart_kubernetes_synced", "rampart_kubernetes_propagation_duration_seconds", "rampart_monitors", "rampart_l7_fastpath_requests_total",
		"rampart_monitor_alerts_total", "rampart_monitor_last_report_timestamp_seconds"} {
		if fams[name] != nil {
			t.Errorf("%s present", name)
		}
	}
	// A read that fails leaves its metrics out, says so, and the others stand.
	src.errs = map[string]error{"taps": errors.New("reading tap counters: boom")}
	fams = promtest.Gather(t, NewCollector(src, quiet()))
	if value(t, fams, "rampart_scrape_source_up", "source", "taps") != 0 || value(t, fams, "rampart_scrape_source_up", "source", "status") != 1 {
		t.Error("source_up does not tell the failed read")
	}
	if fams["rampart_tap_mirrored_packets_total"] != nil || value(t, fams, "rampart_endpoints") != 3 {
		t.Error("a failed read changed the wrong metrics")
	}
}

// TestCollectorLint checks the names, types and help against Prometheus's conventions
// (the linter of promtool check metrics).
func TestCollectorLint(t *testing.T) {
	problems, err := testutil.CollectAndLint(NewCollector(newFake(), quiet()))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestServerServesMetrics(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", newFake(), quiet())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	resp, err := http.Get("http://" + srv.Addr().String() + Path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s: %s", resp.Status, body)
	}
	for _, want := range []string{"rampart_endpoints 3\n", "# TYPE rampart_flows_total counter\n", "go_goroutines ", "process_resident_memory_bytes "} {
		if !strings.Contains(string(body), want) {
			t.Errorf("no %q in the metrics", want)
		}
	}
}
