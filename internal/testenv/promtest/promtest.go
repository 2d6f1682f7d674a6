// Package promtest reads Prometheus metrics in tests: scraped from a server as Prometheus
// does, or gathered from a collector, and looked up by family name and exact labels.
package promtest

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are metric families by name.
type Families map[string]*dto.MetricFamily

// Scrape reads the metrics served at http://addr/metrics as Prometheus would, failing
// the test if it cannot.
func Scrape(t testing.TB, addr string) Families {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing the metrics: %v", err)
	}
	return fams
}

// Gather collects c through a pedantic registry, failing the test if it cannot.
func Gather(t testing.TB, c prometheus.Collector) Families {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := Families{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// Series is the series of family name with exactly labels, given as name, value pairs
// (an empty value is an absent label, as Prometheus has it); nil if there is none.
func (fams Families) Series(name string, labels ...string) *dto.Metric {
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		if labels[i+1] != "" {
			want[labels[i]] = labels[i+1]
		}
	}
next:
	for _, m := range fams[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.Label {
			if l.GetValue() != "" {
				got[l.GetName()] = l.GetValue()
			}
		}
		if len(got) != len(want) {
			continue
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

// Value is the value of the counter or gauge series of family name with exactly labels
// (as Series), and whether there is such a series.
func (fams Families) Value(name string, labels ...string) (float64, bool) {
	m := fams.Series(name, labels...)
	switch {
	case m == nil:
		return 0, false
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	}
	return m.Gauge.GetValue(), true
}

// Text renders family name's series in the exposition format, for failure messages.
func (fams Families) Text(name string) string {
	var b strings.Builder
	if f := fams[name]; f != nil {
		expfmt.MetricFamilyToText(&b, f)
	}
	return b.String()
}
