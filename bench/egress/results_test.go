package egress

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// metrics builds one measurement with throughput tcp (Gbit/s) and latency lat (us).
func metrics(tcp, lat float64) *Metrics {
	return &Metrics{
		TCP:        Iperf{BitsPerSecond: tcp * 1e9},
		UDP:        Iperf{BitsPerSecond: tcp / 3 * 1e9, SenderBps: tcp / 2 * 1e9},
		CPU:        Iperf{BitsPerSecond: 1e9, SenderBps: 1e9, HostCPU: 40 * 10 / tcp},
		CPUPercent: 40 * 10 / tcp,
		Ping:       Ping{P50Us: lat, P99Us: 2 * lat},
		RR:         benchkit.RRResult{P50Us: lat + 10, P99Us: lat + 50},
	}
}

// sampleResult is a run with the baseline at 10 Gbit/s and 20 us, ipset and Rampart at two
// counts, iptables skipped at the larger.
func sampleResult(rampart10M float64, rampartSetup1M, ipsetSetup1M float64) *Result {
	res := &Result{Schema: Schema, Started: time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC),
		Settings: Settings{Repeats: 3, CPURate: "1G", Filters: []string{FilterNone, FilterIptables, FilterIpset, FilterRampart}, Mix: DefaultMix}}
	for _, n := range []int{1_000_000, 10_000_000} {
		c := CountResult{Count: n}
		base := FilterResult{Filter: FilterNone, Status: StatusBaseline}
		mk := func(name string, tcp, setup float64) FilterResult {
			f := FilterResult{Filter: name, Status: StatusMeasured, Setup: &Setup{Seconds: setup}, Checks: map[string]string{}}
			for round, noise := range []float64{1, 0.9, 1.1} {
				p := Pair{Round: round, Filter: metrics(tcp*noise, 20/(tcp/10)*noise), Base: metrics(10*noise, 20*noise)}
				f.Pairs = append(f.Pairs, p)
				base.Pairs = append(base.Pairs, Pair{Round: len(base.Pairs), Base: p.Base})
			}
			return f
		}
		ipt := FilterResult{Filter: FilterIptables, Status: StatusSkipped, Reason: "predicted 900 s is over the 10m0s budget",
			Prediction: &Prediction{SetupSeconds: 800, TotalSeconds: 900, MemoryBytes: 1 << 30}}
		var rp FilterResult
		if n == 1_000_000 {
			ipt = mk(FilterIptables, 1, 3)
			rp = mk(FilterRampart, 9.9, rampartSetup1M)
		} else {
			rp = mk(FilterRampart, rampart10M, 0.5)
		}
		ctl := mk(FilterControl, 10, 0)
		ctl.Status, ctl.Setup = StatusControl, nil
		c.Filters = []FilterResult{base, ctl, ipt, mk(FilterIpset, 9.8, ipsetSetup1M), rp}
		res.Counts = append(res.Counts, c)
	}
	summarize(res)
	return res
}

func TestSummarize(t *testing.T) {
	res := sampleResult(9.7, 0.4, 4)
	ipt := res.find(1_000_000, FilterIptables).Summary
	// Every pair has the filter at a tenth of its baseline: the ratio is 0.1 exactly.
	if r := ipt.RatioRanges["tcp"]; math.Abs(float64(ipt.TCPRatio)-0.1) > 1e-9 || math.Abs(float64(r[0])-0.1) > 1e-9 || math.Abs(float64(r[1])-0.1) > 1e-9 || ipt.Rounds != 3 {
		t.Errorf("iptables TCP ratio %v (%v), rounds %d", ipt.TCPRatio, ipt.RatioRanges["tcp"], ipt.Rounds)
	}
	if math.Abs(float64(ipt.PingP50Ratio)-10) > 1e-9 || math.Abs(float64(ipt.CPURatio)-10) > 1e-9 {
		t.Errorf("iptables ping ratio %v, CPU ratio %v, want 10", ipt.PingP50Ratio, ipt.CPURatio)
	}
	// UDP throughput is the sender's rate, as the original benchmark reports it.
	if float64(ipt.UDPGbps) != 0.5 {
		t.Errorf("iptables UDP %v Gbit/s, want the sender's 0.5", ipt.UDPGbps)
	}
	if float64(ipt.TCPGbps) != 1 || float64(ipt.SetupSeconds) != 3 {
		t.Errorf("iptables median %v Gbit/s, set-up %v", ipt.TCPGbps, ipt.SetupSeconds)
	}
	base := res.find(1_000_000, FilterNone).Summary
	if float64(base.TCPGbps) != 10 || base.TCPRatio.Valid() || base.Rounds != 12 {
		t.Errorf("baseline %v Gbit/s, ratio %v, %d rounds", base.TCPGbps, base.TCPRatio, base.Rounds)
	}
	skipped := res.find(10_000_000, FilterIptables).Summary
	if skipped.TCPGbps.Valid() || skipped.SetupSeconds.Valid() {
		t.Errorf("a skipped filter has numbers: %+v", skipped)
	}
}

func TestTargets(t *testing.T) {
	verdicts := func(res *Result) map[string]string {
		out := map[string]string{}
		for _, tg := range res.Targets {
			out[tg.Name] = tg.Verdict
		}
		return out
	}
	pass := verdicts(sampleResult(9.7, 0.4, 4))
	for name, v := range pass {
		if v != VerdictPass {
			t.Errorf("%s: %s, want PASS", name, v)
		}
	}
	if len(pass) != 7 {
		t.Errorf("%d targets, want 7", len(pass))
	}
	// Ratio targets say how many pairs and how far they spread, and what the A/A control
	// gave at the same count.
	for _, tg := range sampleResult(9.7, 0.4, 4).Targets[:4] {
		if !strings.Contains(tg.Note, "3 pair(s), ") || !strings.Contains(tg.Note, "control (A/A) 1.00, 3 pair(s), 1.00-1.00") {
			t.Errorf("%s: note %q", tg.Name, tg.Note)
		}
	}
	miss := verdicts(sampleResult(9, 5, 4))
	for _, name := range []string{"Rampart TCP throughput at 10M / no filter", "Rampart ping p50 at 10M / no filter",
		"Rampart set-up at 1M vs ipset", "Rampart set-up at 1M (command to enforcement)"} {
		if miss[name] != VerdictMiss {
			t.Errorf("%s: %s, want MISS", name, miss[name])
		}
	}
	if miss["Rampart set-up at 10M (command to enforcement)"] != VerdictPass {
		t.Error("10M set-up of 0.5 s is not a PASS")
	}
	// Rampart not available: every target says so, with the reason.
	res := sampleResult(9.7, 0.4, 4)
	for i := range res.Counts {
		for j := range res.Counts[i].Filters {
			if f := &res.Counts[i].Filters[j]; f.Filter == FilterRampart {
				*f = FilterResult{Filter: FilterRampart, Status: StatusNotAvailable, Reason: "no cidrset command"}
			}
		}
	}
	summarize(res)
	for _, tg := range res.Targets {
		if tg.Verdict != VerdictNotAvailable || !strings.Contains(tg.Note, "no cidrset command") || tg.Value.Valid() {
			t.Errorf("%s: %s %q %v", tg.Name, tg.Verdict, tg.Note, tg.Value)
		}
	}
}

func TestReportFiles(t *testing.T) {
	res := sampleResult(9.7, 0.4, 4)
	dir := t.TempDir()
	if _, err := res.WriteJSON(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := res.WriteTable(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(res.JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var back Result
	if err := dec.Decode(&back); err != nil {
		t.Fatal(err)
	}
	if back.find(1_000_000, FilterIpset).Summary.TCPRatio != res.find(1_000_000, FilterIpset).Summary.TCPRatio {
		t.Error("the JSON does not read back")
	}
	if strings.Contains(string(b), "NaN") {
		t.Error("NaN in the JSON")
	}
	back2, err := ReadResult(res.JSONPath)
	if err != nil || back2.Counts[1].Filters[1].Reason != res.Counts[1].Filters[1].Reason {
		t.Errorf("ReadResult: %v", err)
	}
	var printed, errs bytes.Buffer
	if code := Subcommand("report", []string{"--plot", filepath.Join(dir, "again.png"), res.JSONPath}, &printed, &errs); code != 0 {
		t.Errorf("report: exit %d: %s", code, errs.String())
	}
	md, err := os.ReadFile(res.TablePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| 1M | iptables | MEASURED | 1.00 (0.10) |", "| 10M | iptables | SKIPPED: predicted 900 s", "~800 predicted",
		"| Rampart set-up at 1M vs ipset | < ipset's set-up time | 0.100 | PASS |", "| 10M | none | BASELINE | 10.00 |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
	if printed.String() != string(md) {
		t.Error("the report subcommand prints another table than the one written")
	}
	if b, err := os.ReadFile(filepath.Join(dir, "again.png")); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("report --plot wrote no PNG: %v", err)
	}
	if code := Subcommand("report", []string{filepath.Join(dir, "missing.json")}, &printed, &errs); code != 1 {
		t.Errorf("report of a missing file: exit %d", code)
	}
	png := filepath.Join(dir, "plot.png")
	if err := WritePlot(res, png); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(png); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("plot is not a PNG: %v", err)
	}
	// An empty run still plots.
	if err := WritePlot(&Result{Settings: Settings{Filters: FilterNames}}, png); err != nil {
		t.Errorf("empty plot: %v", err)
	}
}

func TestPredict(t *testing.T) {
	r := &runner{history: map[string][]caseCost{}}
	if r.predict(FilterIptables, 1000) != nil {
		t.Error("a prediction without history")
	}
	r.history[FilterIptables] = []caseCost{{n: 1000, setup: 0.01, measure: 20, remove: 0.01, user: 1 << 20, kernel: 500 << 20}}
	p := r.predict(FilterIptables, 10_000)
	// One point: set-up and user memory linear, measuring and removal constant; the kernel
	// growth of a small count is noise and not extrapolated.
	if math.Abs(p.SetupSeconds-0.1) > 1e-9 || p.MeasureSeconds != 20 || p.MemoryBytes != 10<<20 {
		t.Errorf("from one count: %+v", p)
	}
	// Two points: measuring grew tenfold over a tenfold count, so it is linear; set-up grew
	// a hundredfold, so quadratic.
	r.history[FilterIptables] = append(r.history[FilterIptables], caseCost{n: 10_000, setup: 1, measure: 200, remove: 0.01, user: 10 << 20, kernel: 10_000 * 100})
	p = r.predict(FilterIptables, 100_000)
	if math.Abs(p.SetupSeconds-100) > 1e-6 || math.Abs(p.MeasureSeconds-2000) > 1e-6 || math.Abs(p.TotalSeconds-2100.01) > 1e-6 {
		t.Errorf("from two counts: %+v", p)
	}
	// 100 kernel bytes per prefix at 10k; user memory linear.
	if p.MemoryBytes != 100<<20+100_000*100 {
		t.Errorf("memory from two counts: %d", p.MemoryBytes)
	}
	// A noisy larger count does not raise the per-prefix estimate: the smaller one counts.
	r.history[FilterIptables] = append(r.history[FilterIptables], caseCost{n: 100_000, setup: 100, measure: 200, user: 100 << 20, kernel: 1 << 30})
	if p := r.predict(FilterIptables, 1_000_000); p.MemoryBytes != 1000<<20+1_000_000*100 {
		t.Errorf("memory with a noisy count: %d", p.MemoryBytes)
	}
	if len(p.FromCounts) != 2 || p.FromCounts[1] != 10_000 {
		t.Errorf("from counts %v", p.FromCounts)
	}
	// No prediction over more than two decades: 10 to 10M would extrapolate fixed costs.
	r.history[FilterRampart] = []caseCost{{n: 10, setup: 0.04, measure: 120, user: 18 << 20}}
	if p := r.predict(FilterRampart, 10_000_000); p != nil {
		t.Errorf("predicted 10M from 10: %+v", p)
	}
	if p := r.predict(FilterRampart, 1000); p == nil {
		t.Error("no prediction for 1000 from 10")
	}
	// Set-up never shrinks below linear, even if small counts were dominated by start-up.
	r.history[FilterIpset] = []caseCost{{n: 10, setup: 0.01}, {n: 100, setup: 0.01}}
	if p := r.predict(FilterIpset, 1000); math.Abs(p.SetupSeconds-0.1) > 1e-9 {
		t.Errorf("sublinear set-up extrapolated as %v", p.SetupSeconds)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := QuickConfig()
	ok.Self, ok.Rampartd, ok.Rampart = "x", "y", "z"
	if err := ok.validate(); err != nil {
		t.Fatalf("quick config: %v", err)
	}
	for name, mod := range map[string]func(c *Config){
		"descending counts":  func(c *Config) { c.Counts = []int{100, 10} },
		"unknown filter":     func(c *Config) { c.Filters = []string{"pf"} },
		"iptables backend":   func(c *Config) { c.Iptables = "ebtables" },
		"no rampart binary":  func(c *Config) { c.Rampart = "" },
		"CPU rate":           func(c *Config) { c.CPURate = "fast" },
		"no repeats":         func(c *Config) { c.Repeats = 0 },
		"CPU list":           func(c *Config) { c.ClientCPUs = "999" },
		"IPv6 over the trie": func(c *Config) { c.IPv6, c.Counts = true, []int{10, MaxCount6 + 1} },
	} {
		c := ok
		mod(&c)
		if c.validate() == nil {
			t.Errorf("%s accepted", name)
		}
	}
	c := ok
	c.Filters, c.Rampart = []string{FilterIpset}, ""
	if err := c.validate(); err != nil {
		t.Errorf("a run without rampart needs no rampart binary: %v", err)
	}
	// Over IPv6 only Rampart's trie has a capacity: the peers may go further.
	c = ok
	c.IPv6, c.Counts, c.Filters = true, []int{MaxCount6 + 1}, []string{FilterNft}
	if err := c.validate(); err != nil {
		t.Errorf("an IPv6 run without rampart above %d: %v", MaxCount6, err)
	}
	c.IPv6, c.Counts = true, DefaultCounts6
	if err := c.validate(); err != nil {
		t.Errorf("the default IPv6 counts: %v", err)
	}
}

func TestParseCIDRSetGet(t *testing.T) {
	out := []byte(`{"name": "egress-blocklist", "index": 0, "identity": 2147483392, "prefixes": 1000000, "ipv4": 1000000, "ipv6": 0,
		"agentBytes": 8000000, "memoryBytes": 200000000, "lastLoad": {"totalPrefixes": 1000000, "totalMs": 400}}`)
	if n, b := parseCIDRSetGet(out); n != 1_000_000 || b != 200_000_000 {
		t.Errorf("got %d prefixes, %d bytes", n, b)
	}
	if n, b := parseCIDRSetGet([]byte(`Error: not found`)); n != -1 || b != 0 {
		t.Errorf("an error parsed as %d prefixes, %d bytes", n, b)
	}
}
