package main_test

import (
	"encoding/json"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/promtest"
)

// TestDaemonMetrics runs rampartd with --metrics-address and reads its metrics as
// Prometheus would while real traffic between endpoints is allowed and then denied.
func TestDaemonMetrics(t *testing.T) {
	testenv.RequireRoot(t)
	bin := bins.Dir(t)
	sockDir, flags := instanceFlags(t, "mx", "198.19.27.0/24")
	addr, log := startServing(t, bin, sockDir, flags, "serving metrics", "--metrics-address", "127.0.0.1:0")
	must := mustCLI(t, bin, sockDir, log)
	scrape := func() metricFamilies { return scrapeMetrics(t, addr) }

	m := scrape()
	if got := m.value(t, "rampart_endpoints"); got != 0 {
		t.Fatalf("rampart_endpoints = %v with no endpoint", got)
	}
	must("endpoint", "add", "x/a", "--labels", "pod=a")
	must("endpoint", "add", "y/b", "--labels", "pod=b", "--ip", "198.19.27.50")
	serveTCP(t, bin, sockDir, "y/b", "80")
	probe := prober(bin, sockDir, "x/a", "198.19.27.50:80")

	newTCP := []string{"type", "new", "verdict", "FORWARDED", "direction", "ingress", "protocol", "TCP"}
	if !probe() {
		t.Fatal("x/a -> y/b:80 blocked without policy")
	}
	// The flow reader polls the event ring: the count comes within a poll or two.
	if !testenv.Eventually(5*time.Second, func() bool { return scrape().find("rampart_flows_total", newTCP...) >= 1 }) {
		t.Fatalf("the allowed connection is not counted:\n%s", scrape().Text("rampart_flows_total"))
	}
	m = scrape()
	if got := m.value(t, "rampart_endpoints"); got != 2 {
		t.Errorf("rampart_endpoints = %v, want 2", got)
	}
	applies := m.histogram(t, "rampart_policy_apply_duration_seconds").GetSampleCount()

	must("apply", "-f", defaultDenyFile(t, "y"))
	m = scrape()
	if got := m.histogram(t, "rampart_policy_apply_duration_seconds").GetSampleCount(); got != applies+1 {
		t.Errorf("apply histogram counts %d applies after one policy, %d before", got, applies)
	}
	if got := m.value(t, "rampart_policies"); got != 1 {
		t.Errorf("rampart_policies = %v, want 1", got)
	}
	if got := m.value(t, "rampart_policy_apply_failures_total"); got != 0 {
		t.Errorf("rampart_policy_apply_failures_total = %v", got)
	}

	if probe() {
		t.Fatal("x/a -> y/b:80 passes a default deny")
	}
	deny := []string{"type", "drop", "verdict", "DROPPED", "reason", "policy-default-deny", "direction", "ingress", "protocol", "TCP"}
	if !testenv.Eventually(5*time.Second, func() bool { return scrape().find("rampart_flows_total", deny...) >= 1 }) {
		t.Fatalf("the denied probe is not counted with its reason:\n%s", scrape().Text("rampart_flows_total"))
	}
	m = scrape()
	// Each probe is one SYN: admitted leaving x/a (both probes) and entering y/b (the
	// first), then dropped entering y/b.
	newEgress := []string{"type", "new", "verdict", "FORWARDED", "direction", "egress", "protocol", "TCP"}
	for _, c := range []struct {
		labels []string
		want   float64
	}{{deny, 1}, {newTCP, 1}, {newEgress, 2}} {
		if got := m.value(t, "rampart_flows_total", c.labels...); got != c.want {
			t.Errorf("rampart_flows_total%v = %v, want %v\n%s", c.labels, got, c.want, m.Text("rampart_flows_total"))
		}
	}
	// Every dropped packet is an event and a count in the endpoint's counters.
	if got := m.value(t, "rampart_endpoint_dropped_packets_total", "endpoint", "y/b", "direction", "ingress"); got != 1 {
		t.Errorf("y/b ingress drops: counters say %v, want 1", got)
	}
	if got := m.value(t, "rampart_endpoint_packets_total", "endpoint", "y/b", "direction", "ingress"); got < 1 {
		t.Errorf("y/b forwarded ingress packets = %v after an allowed connection", got)
	}
	// The default deny's only entry in y/b's policy admits the host (--host-traffic=allow);
	// x/a is selected by no policy.
	if a, b := m.value(t, "rampart_endpoint_policy_entries", "endpoint", "x/a"), m.value(t, "rampart_endpoint_policy_entries", "endpoint", "y/b"); a != 0 || b != 1 {
		t.Errorf("policy entries: x/a %v, y/b %v; want 0 and 1\n%s", a, b, m.Text("rampart_endpoint_policy_entries"))
	}

	// The same facts as the status the CLI shows.
	var st api.Status
	if err := json.Unmarshal([]byte(must("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if got := m.value(t, "rampart_identities"); got != float64(st.Identities) || got < 2 {
		t.Errorf("rampart_identities = %v, status says %d", got, st.Identities)
	}
	var policyMap api.MapMemory
	for _, mm := range st.Memory.Maps {
		if mm.Name == "policy" {
			policyMap = mm
		}
	}
	if got := m.value(t, "rampart_bpf_map_memory_bytes", "map", "policy", "type", policyMap.Type); got != float64(policyMap.Bytes) || got == 0 {
		t.Errorf("policy map memory = %v, status says %+v", got, policyMap)
	}
	if got := m.value(t, "rampart_bpf_map_max_entries", "map", "policy", "type", policyMap.Type); got != float64(policyMap.MaxEntries) || got == 0 {
		t.Errorf("policy map capacity = %v, status says %+v", got, policyMap)
	}
	for _, src := range []string{"status", "counts", "cidrsets", "taps"} {
		if got := m.value(t, "rampart_scrape_source_up", "source", src); got != 1 {
			t.Errorf("rampart_scrape_source_up{source=%q} = %v", src, got)
		}
	}
}

type metricFamilies struct{ promtest.Families }

// scrapeMetrics reads the agent's metrics from its --metrics-address addr as Prometheus
// would.
func scrapeMetrics(t *testing.T, addr string) metricFamilies {
	t.Helper()
	return metricFamilies{promtest.Scrape(t, addr)}
}

// value is the value of the gauge or counter name with exactly the labels given as name,
// value pairs (empty-valued labels are absent, as Prometheus has them); 0 when the
// series does not exist. The metric must exist.
func (fams metricFamilies) value(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	if fams.Families[name] == nil {
		t.Fatalf("no metric %s", name)
	}
	return fams.find(name, labels...)
}

// find is value for a metric that may not exist yet (no series: 0).
func (fams metricFamilies) find(name string, labels ...string) float64 {
	v, _ := fams.Value(name, labels...)
	return v
}

func (fams metricFamilies) histogram(t *testing.T, name string) *dto.Histogram {
	t.Helper()
	f := fams.Families[name]
	if f == nil || len(f.Metric) != 1 || f.Metric[0].Histogram == nil {
		t.Fatalf("no histogram %s", name)
	}
	return f.Metric[0].Histogram
}
