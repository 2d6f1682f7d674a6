package dns

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/api"
)

// Config is one run of the benchmark.
type Config struct {
	// Rounds of part one: each measures every case once, in rotating order.
	Rounds int
	// Queries per latency sample (after Warmup), and the rate samples' Workers and
	// Duration.
	Queries, Warmup int
	Workers         int
	Duration        time.Duration
	// LearnRounds of part two per stage: each resolves NamesPerBlock new names with
	// toFQDNs and as many with toCIDR, in alternating order.
	LearnRounds, NamesPerBlock int
	// ManyLearnt is how many learnt addresses the second stage of part two starts from.
	ManyLearnt int
	// Self is the dnsbench binary, run for the helpers inside the namespaces.
	Self string
	// Rampartd and Rampart are the agent and its CLI (of this checkout).
	Rampartd, Rampart string
	// ClientCPU and ServerCPU pin the measuring client and the DNS server (taskset lists;
	// empty: not pinned). The agent, and so its DNS proxy, is not pinned.
	ClientCPU, ServerCPU string
	// Prefix names the run's agent instance and namespaces (default: dnb and a random
	// suffix).
	Prefix  string
	WorkDir string
	Log     func(format string, args ...any)
}

// Case names of part one.
const (
	Direct    = "direct"
	Control   = "direct-AA"
	Proxy     = "proxy"
	DirectTCP = "direct-tcp"
	ProxyTCP  = "proxy-tcp"
)

// caseDef is a case of part one: the protocol, the endpoint it asks from, and the case its
// ratios are to.
type caseDef struct {
	name, proto, endpoint, baseline string
}

var caseDefs = []caseDef{
	{Direct, "udp", "direct", Direct},
	{Control, "udp", "direct", Direct},
	{Proxy, "udp", "proxy", Direct},
	{DirectTCP, "tcp", "direct", DirectTCP},
	{ProxyTCP, "tcp", "proxy", DirectTCP},
}

// Report is a run's result.
type Report struct {
	benchkit.RunInfo
	// Part one.
	Rounds   int     `json:"rounds"`
	Queries  int     `json:"queries_per_latency_sample"`
	Workers  int     `json:"rate_workers"`
	RateSecs float64 `json:"rate_sample_seconds"`
	Cases    []Case  `json:"cases"`
	// Part two.
	Learn Learn `json:"learn"`
	// DNS is the agent's DNS status at the end of the run (rampart status -o json).
	DNS api.DNSStatus `json:"dns"`
}

// Case is one case of part one with its samples and its ratios to its baseline.
type Case struct {
	Name     string   `json:"name"`
	Proto    string   `json:"proto"`
	Baseline string   `json:"baseline"`
	Samples  []Sample `json:"samples"`
	// Medians over rounds of the per-round ratio to the baseline's sample of the same
	// round, with the range; AddedP50us is the median of the per-round differences.
	P50Ratio   Ratio   `json:"p50_ratio"`
	P99Ratio   Ratio   `json:"p99_ratio"`
	QPSRatio   Ratio   `json:"qps_ratio"`
	AddedP50us float64 `json:"added_p50_us"`
}

// Sample is one round's measurement of a case.
type Sample struct {
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
	QPS   float64 `json:"qps"`
	// Failed queries (no answer within a second) of the latency and rate samples.
	LatencyFailed int `json:"latency_failed"`
	RateFailed    int `json:"rate_failed"`
}

// Ratio is a median ratio and its range over rounds.
type Ratio struct {
	Median benchkit.Float `json:"median"`
	Min    benchkit.Float `json:"min"`
	Max    benchkit.Float `json:"max"`
}

// Learn is part two.
type Learn struct {
	NamesPerBlock    int          `json:"names_per_block"`
	Rounds           int          `json:"rounds"`
	ConnectTimeoutMs float64      `json:"connect_timeout_ms"`
	Stages           []LearnStage `json:"stages"`
	// Fill is the toFQDNs names learnt between the stages, to reach ManyLearnt, taken
	// FillSeconds (with the clients' start-up).
	Fill        LearnStats `json:"fill"`
	FillSeconds float64    `json:"fill_seconds"`
	// Curve is the toFQDNs resolve latency over the whole run (blocks and the fill
	// between stages), in groups of consecutive names, against the learnt addresses.
	Curve []CurvePoint `json:"curve"`
}

// LearnStage is part two at one number of learnt addresses.
type LearnStage struct {
	// LearntAtStart and LearntAtEnd are the addresses in the agent's cache (status).
	LearntAtStart int `json:"learnt_at_start"`
	LearntAtEnd   int `json:"learnt_at_end"`
	// Learning (toFQDNs: every answer commits a policy change) and Baseline (toCIDR of
	// the whole range: nothing to commit), pooled over the stage's rounds.
	Learning LearnStats `json:"learning"`
	Baseline LearnStats `json:"baseline"`
	// AddedP50us is the learning p50 less the baseline's: the cost of learning.
	AddedP50us float64 `json:"added_p50_us"`
	Blocks     []Block `json:"blocks"`
}

// LearnStats are the records of one kind of block.
type LearnStats struct {
	Names        int     `json:"names"`
	NoAnswer     int     `json:"no_answer"`
	ResolveP50us float64 `json:"resolve_p50_us"`
	ResolveP99us float64 `json:"resolve_p99_us"`
	ResolveMaxUs float64 `json:"resolve_max_us"`
	ConnectP50us float64 `json:"connect_p50_us"`
	ConnectP99us float64 `json:"connect_p99_us"`
	// FirstPacketDropped counts connections that passed only after a SYN retransmission
	// or not at all; Failed those that did not pass at all.
	FirstPacketDropped int `json:"first_packet_dropped"`
	Failed             int `json:"failed"`
}

// Block is one block of names of part two.
type Block struct {
	Mode          string  `json:"mode"` // learning or baseline
	Round         int     `json:"round"`
	LearntAtStart int     `json:"learnt_at_start"`
	ResolveP50us  float64 `json:"resolve_p50_us"`
	ResolveP99us  float64 `json:"resolve_p99_us"`
	Dropped       int     `json:"first_packet_dropped"`
}

// CurvePoint is a group of consecutive toFQDNs names.
type CurvePoint struct {
	Learnt       int     `json:"learnt"` // addresses learnt before the group's first name
	Names        int     `json:"names"`
	ResolveP50us float64 `json:"resolve_p50_us"`
	ResolveP99us float64 `json:"resolve_p99_us"`
}

// Modes of part two's blocks.
const (
	Learning = "learning"
	Baseline = "baseline"
)

const benchNamespace = "bench"

const connectTimeout = 1500 * time.Millisecond

// Run starts the agent, the endpoints, the world and the DNS server, measures both parts,
// and removes everything, also on an error or a cancelled ctx.
func Run(ctx context.Context, cfg Config) (_ *Report, err error) {
	rep := &Report{RunInfo: benchkit.StartRun(), Rounds: cfg.Rounds, Queries: cfg.Queries, Workers: cfg.Workers,
		RateSecs: cfg.Duration.Seconds(),
		Learn:    Learn{NamesPerBlock: cfg.NamesPerBlock, Rounds: cfg.LearnRounds, ConnectTimeoutMs: float64(connectTimeout.Milliseconds())}}
	var cleanup benchkit.Cleanups
	defer func() {
		if errs := cleanup.Run(); len(errs) > 0 {
			err = errors.Join(append([]error{err}, errs...)...)
		}
	}()
	if err := benchkit.EnsureBPFFS(); err != nil {
		return nil, err
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = "dnb" + benchkit.Suffix()[:6]
	}
	nets := benchkit.PodCIDRs(2)
	agent := benchkit.NewAgent(cfg.Rampartd, cfg.Rampart, prefix, filepath.Join(cfg.WorkDir, "agent"), nets[0])
	// Clean-up runs last added first: the helpers, then the world, then the agent, which
	// uninstalls its endpoints, node namespace and pins.
	cleanup.Add(agent.Stop)
	var w *world
	cleanup.Add(func() error {
		if w != nil {
			return w.Close()
		}
		return nil
	})
	var daemons benchkit.Daemons
	cleanup.Add(daemons.StopAll)

	if err := agent.Start(ctx, &daemons); err != nil {
		return nil, fmt.Errorf("starting rampartd: %w", err)
	}
	r := &runner{cfg: cfg, agent: agent, eps: map[string]*benchkit.Endpoint{}}
	for i, name := range []string{"dns", "direct", "proxy", "learner"} {
		ep, err := agent.AddEndpoint(ctx, benchNamespace, name, []string{"app=" + name}, benchkit.HostAddr(nets[0], uint32(10+i)))
		if err != nil {
			return nil, err
		}
		r.eps[name] = ep
	}
	r.dnsIP = r.eps["dns"].IP
	if w, err = addWorld(agent.NodeNetns(), prefix, nets[1]); err != nil {
		return nil, err
	}
	if _, err := daemons.Start("world server", w.Command(context.Background(), cfg.Self, "serve-world", "--listen", "0.0.0.0:80")); err != nil {
		return nil, err
	}
	if _, err := daemons.Start("DNS server", r.eps["dns"].Command(context.Background(),
		benchkit.Taskset(cfg.ServerCPU, cfg.Self, "serve-dns", "--listen", "0.0.0.0:53")...)); err != nil {
		return nil, err
	}
	if err := r.writePolicies(); err != nil {
		return nil, err
	}
	for _, p := range []string{"direct", "proxy", "learner-cidr"} {
		if err := r.apply(ctx, p); err != nil {
			return nil, err
		}
	}
	if err := r.checkQueries(ctx); err != nil {
		return nil, err
	}
	if rep.Cases, err = r.queries(ctx); err != nil {
		return nil, err
	}
	if err := r.learn(ctx, &rep.Learn); err != nil {
		return nil, err
	}
	st, err := agent.Status(ctx)
	if err != nil {
		return nil, err
	}
	rep.DNS = st.DNS
	rep.Finish()
	return rep, nil
}

type runner struct {
	cfg   Config
	agent *benchkit.Agent
	eps   map[string]*benchkit.Endpoint
	dnsIP netip.Addr
	files map[string]string
}

const dnsRule = `  - toEndpoints: [{matchLabels: {app: dns}}]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
`

const dnsRules = `      rules: {dns: [{matchPattern: "*.bench.example"}]}
`

// policies are the egress policies of the client endpoints: direct (an L4 allow of the
// server, no DNS rules: no proxy), proxy (the same with rules.dns), and the learner's two,
// which part two switches between: rules.dns and toFQDNs, or rules.dns and toCIDR of the
// whole world range.
func policies() map[string]string {
	head := func(name, app string) string {
		return fmt.Sprintf("apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: %s, namespace: %s}\n"+
			"spec:\n  endpointSelector: {matchLabels: {app: %s}}\n  egress:\n", name, benchNamespace, app)
	}
	port80 := "    toPorts:\n    - ports: [{port: \"80\", protocol: TCP}]\n"
	return map[string]string{
		"direct":       head("direct", "direct") + dnsRule,
		"proxy":        head("proxy", "proxy") + dnsRule + dnsRules,
		"learner-fqdn": head("learner", "learner") + dnsRule + dnsRules + "  - toFQDNs: [{matchPattern: \"*.bench.example\"}]\n" + port80,
		"learner-cidr": head("learner", "learner") + dnsRule + dnsRules + "  - toCIDR: [\"" + WorldRange.String() + "\"]\n" + port80,
	}
}

func (r *runner) writePolicies() error {
	r.files = map[string]string{}
	for name, text := range policies() {
		f := filepath.Join(r.cfg.WorkDir, name+".yaml")
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			return err
		}
		r.files[name] = f
	}
	return nil
}

func (r *runner) apply(ctx context.Context, name string) error {
	if _, err := r.agent.CLI(ctx, 2*time.Minute, "apply", "-f", r.files[name]); err != nil {
		return fmt.Errorf("applying policy %s: %w", name, err)
	}
	return nil
}

// client runs `dnsbench client` in endpoint ep, pinned, against the DNS server.
func (r *runner) client(ctx context.Context, ep string, args ...string) (ClientResult, error) {
	argv := benchkit.Taskset(r.cfg.ClientCPU, append([]string{r.cfg.Self, "client", "--server", r.dnsIP.String()}, args...)...)
	out, err := benchkit.RunOutput(ctx, 10*time.Minute, func(ctx context.Context) *exec.Cmd {
		return r.eps[ep].Command(ctx, argv...)
	})
	if err != nil {
		return ClientResult{}, fmt.Errorf("client in %s: %w", ep, err)
	}
	var res ClientResult
	if err := json.Unmarshal(out, &res); err != nil {
		return res, fmt.Errorf("client in %s printed %q: %w", ep, out, err)
	}
	return res, nil
}

func (r *runner) query(ctx context.Context, ep, proto, name string) (ClientResult, error) {
	return r.client(ctx, ep, "--mode", "query", "--proto", proto, "--name", name, "--retry-for", "10s")
}

// probe connects from endpoint ep to addr:80 and returns benchkit's probe outcome.
func (r *runner) probe(ctx context.Context, ep string, addr netip.Addr, timeout time.Duration) (string, error) {
	out, err := benchkit.RunOutput(ctx, time.Minute, func(ctx context.Context) *exec.Cmd {
		return r.eps[ep].Command(ctx, r.cfg.Self, "probe", "--addr", netip.AddrPortFrom(addr, 80).String(), "--timeout", timeout.String())
	})
	if err != nil {
		return "", err
	}
	var s string
	_, err = fmt.Sscan(string(out), &s)
	return s, err
}

func (r *runner) status(ctx context.Context) (api.DNSStatus, error) {
	st, err := r.agent.Status(ctx)
	return st.DNS, err
}

// checkQueries checks, before measuring, that the direct endpoint's queries reach the
// server without the proxy (a name outside bench.example gets the server's NXDOMAIN, and
// the proxy counts none of them) and the proxy endpoint's go through the proxy (the same
// name is REFUSED).
func (r *runner) checkQueries(ctx context.Context) error {
	other := "x.other.example"
	want := func(ep, proto, name, rcode string) error {
		res, err := r.query(ctx, ep, proto, name)
		if err != nil {
			return err
		}
		if res.Rcode != rcode {
			return fmt.Errorf("%s asking %s over %s: %s, want %s", ep, name, proto, res.Rcode, rcode)
		}
		if a, _ := AddrOf(name); rcode == "NOERROR" && !slices.Equal(res.Addrs, []string{a.String()}) {
			return fmt.Errorf("%s asking %s: addresses %v, want %v", ep, name, res.Addrs, a)
		}
		return nil
	}
	before, err := r.status(ctx)
	if err != nil {
		return err
	}
	for _, proto := range []string{"udp", "tcp"} {
		if err := want("direct", proto, CachedName(0), "NOERROR"); err != nil {
			return err
		}
		if err := want("direct", proto, other, "NXDOMAIN"); err != nil {
			return err
		}
	}
	if _, err := r.client(ctx, "direct", "--mode", "latency", "--warmup", "0", "--n", "20"); err != nil {
		return err
	}
	mid, err := r.status(ctx)
	if err != nil {
		return err
	}
	if mid.Queries != before.Queries {
		return fmt.Errorf("the direct endpoint's queries went through the DNS proxy (%d queries counted)", mid.Queries-before.Queries)
	}
	for _, proto := range []string{"udp", "tcp"} {
		if err := want("proxy", proto, CachedName(0), "NOERROR"); err != nil {
			return err
		}
		if err := want("proxy", proto, other, "REFUSED"); err != nil {
			return err
		}
	}
	after, err := r.status(ctx)
	if err != nil {
		return err
	}
	if after.State != "running" || after.Queries < mid.Queries+4 || after.Refused < mid.Refused+2 {
		return fmt.Errorf("DNS proxy: %+v after the proxy endpoint's 4 queries, want them counted, 2 refused", after)
	}
	r.cfg.Log("checked: the direct endpoint's queries reach the server, the proxy endpoint's go through the proxy")
	return nil
}

// queries is part one: rounds of every case's latency and rate samples, in rotating order.
func (r *runner) queries(ctx context.Context) ([]Case, error) {
	samples := map[string][]Sample{}
	for round := range r.cfg.Rounds {
		k := round % len(caseDefs)
		order := append(slices.Clone(caseDefs[k:]), caseDefs[:k]...)
		got := map[string]*Sample{}
		for _, c := range order {
			res, err := r.client(ctx, c.endpoint, "--mode", "latency", "--proto", c.proto,
				"--n", strconv.Itoa(r.cfg.Queries), "--warmup", strconv.Itoa(r.cfg.Warmup))
			if err != nil {
				return nil, fmt.Errorf("%s latency: %w", c.name, err)
			}
			got[c.name] = &Sample{P50us: res.P50us, P99us: res.P99us, LatencyFailed: res.Failed}
		}
		for _, c := range order {
			res, err := r.client(ctx, c.endpoint, "--mode", "rate", "--proto", c.proto,
				"--workers", strconv.Itoa(r.cfg.Workers), "--duration", r.cfg.Duration.String())
			if err != nil {
				return nil, fmt.Errorf("%s rate: %w", c.name, err)
			}
			got[c.name].QPS, got[c.name].RateFailed = res.QPS, res.Failed
		}
		line := fmt.Sprintf("round %d:", round+1)
		for _, c := range caseDefs {
			s := got[c.name]
			samples[c.name] = append(samples[c.name], *s)
			line += fmt.Sprintf(" %s p50 %.0f us p99 %.0f us %.0f q/s;", c.name, s.P50us, s.P99us, s.QPS)
		}
		r.cfg.Log("%s", line)
	}
	var out []Case
	for _, c := range caseDefs {
		xs, base := samples[c.name], samples[c.baseline]
		cs := Case{Name: c.name, Proto: c.proto, Baseline: c.baseline, Samples: xs,
			P50Ratio: ratio(xs, base, func(s Sample) float64 { return s.P50us }),
			P99Ratio: ratio(xs, base, func(s Sample) float64 { return s.P99us }),
			QPSRatio: ratio(xs, base, func(s Sample) float64 { return s.QPS })}
		var diffs []float64
		for i := range xs {
			diffs = append(diffs, xs[i].P50us-base[i].P50us)
		}
		cs.AddedP50us = benchkit.Median(diffs)
		out = append(out, cs)
	}
	return out, nil
}

// ratio is the median over rounds of a case's per-round ratio to the baseline's sample
// of the same round, with the range.
func ratio(xs, base []Sample, f func(Sample) float64) Ratio {
	m, lo, hi := benchkit.PairedRatios(xs, base, f)
	return Ratio{Median: benchkit.Float(m), Min: benchkit.Float(lo), Max: benchkit.Float(hi)}
}

// probe addresses of part two, never answered for a name: one that toCIDR admits and
// toFQDNs does not, to check which of the learner's policies is in force.
var (
	probeCIDR, _ = AddrOf(LearnName(MaxNames - 1))
	probeFQDN, _ = AddrOf(LearnName(MaxNames - 2))
)

// switchLearner applies the learner's policy for mode and waits until it is in force: an
// address no name resolved to is open under toCIDR and closed under toFQDNs.
func (r *runner) switchLearner(ctx context.Context, mode string) error {
	policy, addr, want := "learner-cidr", probeCIDR, benchkit.ProbeConnected
	if mode == Learning {
		policy, addr, want = "learner-fqdn", probeFQDN, benchkit.ProbeTimeout
	}
	if err := r.apply(ctx, policy); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := r.probe(ctx, "learner", addr, 300*time.Millisecond)
		if err != nil {
			return err
		}
		if got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s policy: a connection to %v: %s, want %s", mode, addr, got, want)
		}
	}
}

// block resolves the next n names from the learner and connects to each answer.
func (r *runner) block(ctx context.Context, first, n int) ([]LearnRecord, error) {
	res, err := r.client(ctx, "learner", "--mode", "learn", "--first", strconv.Itoa(first), "--n", strconv.Itoa(n),
		"--connect-timeout", connectTimeout.String())
	if err != nil {
		return nil, err
	}
	if len(res.Learn) != n {
		return nil, fmt.Errorf("learn: %d records, want %d", len(res.Learn), n)
	}
	return res.Learn, nil
}

// learn is part two: per stage (few learnt addresses, then ManyLearnt), rounds of a block
// of new names under toFQDNs and one under toCIDR, in alternating order.
func (r *runner) learn(ctx context.Context, out *Learn) error {
	next := 0
	var curve []float64
	var curveLearnt []int
	addCurve := func(start int, recs []LearnRecord) {
		for i, rec := range recs {
			if rec.Outcome != NoAnswer {
				curve = append(curve, rec.ResolveUs)
				curveLearnt = append(curveLearnt, start+i)
			}
		}
	}
	for si, target := range []int{0, r.cfg.ManyLearnt} {
		if si > 0 {
			if err := r.switchLearner(ctx, Learning); err != nil {
				return err
			}
			st, err := r.status(ctx)
			if err != nil {
				return err
			}
			if need := target - st.Addresses; need > 0 {
				r.cfg.Log("learning %d more names to reach %d learnt addresses", need, target)
				began := time.Now()
				var fill []LearnRecord
				for need > 0 {
					n := min(need, 500)
					recs, err := r.block(ctx, next, n)
					if err != nil {
						return err
					}
					addCurve(st.Addresses, recs)
					fill = append(fill, recs...)
					next, need, st.Addresses = next+n, need-n, st.Addresses+n
				}
				out.Fill, out.FillSeconds = stats(fill), time.Since(began).Seconds()
				r.cfg.Log("learnt %d names in %.1f s: resolve p50 %.0f us p99 %.0f us, first packets dropped %d, no answer %d",
					len(fill), out.FillSeconds, out.Fill.ResolveP50us, out.Fill.ResolveP99us, out.Fill.FirstPacketDropped, out.Fill.NoAnswer)
			}
		}
		st, err := r.status(ctx)
		if err != nil {
			return err
		}
		stage := LearnStage{LearntAtStart: st.Addresses}
		pooled := map[string][]LearnRecord{}
		for round := range r.cfg.LearnRounds {
			order := []string{Baseline, Learning}
			if round%2 == 1 {
				order = []string{Learning, Baseline}
			}
			for _, mode := range order {
				if err := r.switchLearner(ctx, mode); err != nil {
					return err
				}
				st, err := r.status(ctx)
				if err != nil {
					return err
				}
				recs, err := r.block(ctx, next, r.cfg.NamesPerBlock)
				if err != nil {
					return err
				}
				next += r.cfg.NamesPerBlock
				if mode == Learning {
					addCurve(st.Addresses, recs)
				}
				pooled[mode] = append(pooled[mode], recs...)
				s := stats(recs)
				stage.Blocks = append(stage.Blocks, Block{Mode: mode, Round: round + 1, LearntAtStart: st.Addresses,
					ResolveP50us: s.ResolveP50us, ResolveP99us: s.ResolveP99us, Dropped: s.FirstPacketDropped})
				r.cfg.Log("learn stage %d round %d %s (%d learnt): resolve p50 %.0f us p99 %.0f us, connect p50 %.0f us, first packets dropped %d, no answer %d",
					si+1, round+1, mode, st.Addresses, s.ResolveP50us, s.ResolveP99us, s.ConnectP50us, s.FirstPacketDropped, s.NoAnswer)
			}
		}
		if st, err = r.status(ctx); err != nil {
			return err
		}
		stage.LearntAtEnd = st.Addresses
		stage.Learning, stage.Baseline = stats(pooled[Learning]), stats(pooled[Baseline])
		stage.AddedP50us = stage.Learning.ResolveP50us - stage.Baseline.ResolveP50us
		out.Stages = append(out.Stages, stage)
	}
	// The curve: groups of consecutive toFQDNs names, 20 groups over the run at least.
	group := max(10, min(100, len(curve)/20))
	for i := 0; i < len(curve); i += group {
		xs := curve[i:min(i+group, len(curve))]
		out.Curve = append(out.Curve, CurvePoint{Learnt: curveLearnt[i], Names: len(xs),
			ResolveP50us: percentile(xs, 50), ResolveP99us: percentile(xs, 99)})
	}
	return nil
}

// stats summarises learn records.
func stats(recs []LearnRecord) LearnStats {
	s := LearnStats{Names: len(recs)}
	var resolve, connect []float64
	for _, r := range recs {
		if r.Outcome == NoAnswer {
			s.NoAnswer++
			continue
		}
		resolve = append(resolve, r.ResolveUs)
		connect = append(connect, r.ConnectUs)
		if r.FirstPacketDropped() {
			s.FirstPacketDropped++
		}
		if r.Outcome == Failed {
			s.Failed++
		}
	}
	s.ResolveP50us, s.ResolveP99us, s.ResolveMaxUs = percentile(resolve, 50), percentile(resolve, 99), percentile(resolve, 100)
	s.ConnectP50us, s.ConnectP99us = percentile(connect, 50), percentile(connect, 99)
	return s
}

// percentile is the nearest-rank p-th percentile of xs (0 for none).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[max(1, min(rank, len(s)))-1]
}
