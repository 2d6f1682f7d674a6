package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// Config is one run of the benchmark.
type Config struct {
	// Counts are the numbers of Services measured, in order (1 and 10,000).
	Counts []int
	// Rounds is how many pairs of samples each case gets per count.
	Rounds int
	// Connects per connect-latency sample; Duration and Workers of a request-rate sample.
	Connects int
	Duration time.Duration
	Workers  int
	// Spread is how many different Services a sample's connections cycle over (at most
	// the count).
	Spread int
	// Checked is how many Services (the first and last among them) must answer through
	// each implementation before a count is measured.
	Checked int
	// Self is the svcbench binary, run for the helpers inside the namespaces.
	Self string
	// K8sBinDir holds etcd and kube-apiserver; KubeProxy is the kube-proxy binary.
	K8sBinDir, KubeProxy string
	// Rampartd and Rampart are the agent and its CLI (of this checkout).
	Rampartd, Rampart string
	// ClientCPU and ServerCPU pin the measuring client and the backend's server (taskset
	// lists; empty: not pinned).
	ClientCPU, ServerCPU string
	// ProgramTimeout bounds the wait for the last Service to answer after a start.
	ProgramTimeout time.Duration
	// Prefix names the run's namespaces, cgroups and agent instance (default: svb and a
	// random suffix); at most 9 characters, as it also names a host link.
	Prefix  string
	WorkDir string
	Log     func(format string, args ...any)
}

// Report is a run's result.
type Report struct {
	benchkit.RunInfo
	Rounds     int     `json:"rounds"`
	Connects   int     `json:"connects_per_sample"`
	DurationS  float64 `json:"request_sample_seconds"`
	Workers    int     `json:"request_workers"`
	Throughput string  `json:"throughput_method"`
	Stages     []Stage `json:"stages"`
}

// Stage is one count of Services.
type Stage struct {
	Services int `json:"services"`
	// Checked is how many of the Services answered a request through each implementation
	// before measuring (every one in the quick run), while the direct client, with no
	// translation, got no answer from a Service address.
	Checked     int           `json:"checked"`
	Programming []Programming `json:"programming"`
	Cases       []Case        `json:"cases"`
}

// Programming is how one implementation took the stage's Services from the API.
type Programming struct {
	Name string `json:"name"`
	// Seconds from the process start until the last Service answered a request.
	Seconds float64 `json:"seconds"`
	// ServingSeconds (rampartd) is from the start until the agent's API answered: its
	// start-up (BPF programs, node namespace, identity allocator, informers) before it
	// reads the Services; the rest of Seconds is reading and programming them.
	ServingSeconds float64 `json:"serving_seconds,omitempty"`
	// RSSBytes is the process's resident memory afterwards; MapBytes the kernel memory of
	// its Service maps (Rampart; kube-proxy's nftables memory is not visible per table).
	RSSBytes int64 `json:"rss_bytes"`
	MapBytes int64 `json:"map_bytes,omitempty"`
}

// Case is one client kind's samples at one count, with its ratios to direct.
type Case struct {
	Name    string   `json:"name"`
	Samples []Sample `json:"samples"`
	// Medians over rounds of the per-round ratio to the direct sample of the same round,
	// with the min-max over rounds.
	ConnectP50Ratio Ratio `json:"connect_p50_ratio"`
	ConnectP99Ratio Ratio `json:"connect_p99_ratio"`
	RPSRatio        Ratio `json:"rps_ratio"`
}

// Sample is one round's measurement of a case.
type Sample struct {
	ConnectP50us float64 `json:"connect_p50_us"`
	ConnectP99us float64 `json:"connect_p99_us"`
	RPS          float64 `json:"rps"`
}

// Ratio is a median ratio and its range over rounds.
type Ratio struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// caseNames in report order.
var caseNames = []string{Direct, Control, Rampart, KubeProxy}

// Run builds the topology, starts the API server, the backend, kube-proxy and rampartd,
// measures every count, and removes everything, also on an error or a cancelled ctx.
func Run(ctx context.Context, cfg Config) (_ *Report, err error) {
	if cfg.ProgramTimeout == 0 {
		cfg.ProgramTimeout = 5 * time.Minute
	}
	rep := &Report{RunInfo: benchkit.StartRun(), Rounds: cfg.Rounds, Connects: cfg.Connects,
		DurationS: cfg.Duration.Seconds(), Workers: cfg.Workers,
		Throughput: "fresh connections: each request on a new TCP connection, closed with a reset after the response"}
	var cleanup benchkit.Cleanups
	defer func() {
		if errs := cleanup.Run(); len(errs) > 0 {
			err = errors.Join(append([]error{err}, errs...)...)
		}
	}()
	nets := benchkit.PodCIDRs(2)
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = "svb" + benchkit.Suffix()[:6]
	}
	if len(prefix) > 9 {
		return nil, fmt.Errorf("prefix %q: at most 9 characters", prefix)
	}
	topo, err := newTopology(ctx, prefix, nets[0])
	if err != nil {
		return nil, fmt.Errorf("building the namespaces: %w", err)
	}
	cleanup.Add(topo.Close)
	var daemons benchkit.Daemons
	cleanup.Add(daemons.StopAll)

	backend := netip.AddrPortFrom(topo.backend, BackendPort).String()
	if _, err := daemons.Start("server", nsCmd(context.Background(), topo.netns("backend"),
		benchkit.Taskset(cfg.ServerCPU, cfg.Self, "serve", "--addr", backend)...)); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, topo: topo, backend: backend, daemons: &daemons}
	if _, err := r.client(ctx, Direct, "wait", []string{backend}, "--timeout", "10s"); err != nil {
		return nil, fmt.Errorf("the backend does not answer: %w", err)
	}
	cfg.Log("starting the API server on %s", topo.apiAddr)
	api, err := startAPI(ctx, cfg.K8sBinDir, topo.apiAddr, nets[1])
	if err != nil {
		return nil, err
	}
	cleanup.Add(api.Close)
	r.api = api

	agent := benchkit.NewAgent(cfg.Rampartd, cfg.Rampart, prefix, filepath.Join(cfg.WorkDir, "agent"), nets[1])
	agent.Flags = []string{"--kubeconfig", api.cp.Kubeconfig, "--node-name", NodeName,
		"--service-cgroup", topo.cgroups[Rampart]}
	r.agent = agent
	cleanup.Add(func() error {
		if r.agent != nil && r.agent.Pid() != 0 {
			return agent.Stop()
		}
		return nil
	})
	cleanup.Add(func() error {
		if r.kubeProxy != nil {
			return r.kubeProxy.Stop(10 * time.Second)
		}
		return nil
	})

	for _, n := range cfg.Counts {
		began := time.Now()
		if err := api.AddServices(ctx, n, topo.backend); err != nil {
			return nil, fmt.Errorf("writing %d Services: %w", n, err)
		}
		cfg.Log("%d Services and EndpointSlices in the API (%.1f s to write)", n, time.Since(began).Seconds())
		st, err := r.stage(ctx, n)
		if err != nil {
			return nil, fmt.Errorf("%d Services: %w", n, err)
		}
		rep.Stages = append(rep.Stages, *st)
	}
	rep.Finish()
	return rep, nil
}

type runner struct {
	cfg       Config
	topo      *topology
	backend   string
	daemons   *benchkit.Daemons
	api       *apiServer
	agent     *benchkit.Agent
	kubeProxy *benchkit.Daemon
	agentUp   bool
}

// client runs the client helper of kind (control: the direct client) with mode against
// targets and decodes what it prints.
func (r *runner) client(ctx context.Context, kind, mode string, targets []string, extra ...string) (ClientResult, error) {
	if kind == Control {
		kind = Direct
	}
	args := append([]string{r.cfg.Self, "client", "--cgroup", r.topo.cgroups[kind], "--mode", mode,
		"--targets", strings.Join(targets, ",")}, extra...)
	out, err := benchkit.RunOutput(ctx, 10*time.Minute, func(ctx context.Context) *exec.Cmd {
		return benchkit.OwnGroup(nsCmd(ctx, r.topo.netns(kind), benchkit.Taskset(r.cfg.ClientCPU, args...)...))
	})
	if err != nil {
		return ClientResult{}, fmt.Errorf("%s client: %w", kind, err)
	}
	var res ClientResult
	if err := json.Unmarshal(out, &res); err != nil {
		return ClientResult{}, fmt.Errorf("%s client printed %q: %w", kind, out, err)
	}
	return res, nil
}

// program (re)starts one implementation on the Services in the API and measures the time
// from its start until the last Service answers through it, and its memory.
func (r *runner) program(ctx context.Context, kind string, n int) (Programming, error) {
	// The probe runs first, so that the clock starts with the implementation.
	probeCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		res ClientResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := r.client(probeCtx, kind, "wait", []string{ServiceAddr(n - 1)}, "--timeout", r.cfg.ProgramTimeout.String())
		done <- answer{res, err}
	}()
	// Let the probe start and fail its first attempts: a probe that took long to
	// start would add its start-up to the time measured.
	time.Sleep(200 * time.Millisecond)
	p := Programming{Name: kind}
	began := time.Now()
	var pid int
	switch kind {
	case KubeProxy:
		conf := filepath.Join(r.cfg.WorkDir, "kube-proxy.yaml")
		if err := os.WriteFile(conf, []byte(nodetest.KubeProxyConfig(r.api.cp.Kubeconfig, NodeName, r.topo.net.String())), 0o644); err != nil {
			return p, err
		}
		d, err := r.daemons.Start("kube-proxy", nsCmd(context.Background(), r.topo.netns(KubeProxy), r.cfg.KubeProxy, "--config", conf))
		if err != nil {
			return p, err
		}
		r.kubeProxy, pid = d, d.Pid()
	case Rampart:
		if err := r.agent.Start(ctx, r.daemons); err != nil {
			return p, fmt.Errorf("starting rampartd: %w", err)
		}
		pid = r.agent.Pid()
		p.ServingSeconds = time.Since(began).Seconds()
	}
	a := <-done
	if a.err != nil {
		return p, fmt.Errorf("the last Service through %s: %w", kind, a.err)
	}
	p.Seconds = time.Unix(0, a.res.AnsweredUnixNano).Sub(began).Seconds()
	var err error
	if p.RSSBytes, err = rssBytes(pid); err != nil {
		return p, fmt.Errorf("%s memory: %w", kind, err)
	}
	if kind == Rampart {
		if p.MapBytes, err = serviceMapBytes(pid); err != nil {
			return p, fmt.Errorf("rampartd's Service maps: %w", err)
		}
	}
	return p, nil
}

// stop stops both implementations, so that the next count is programmed from a start.
func (r *runner) stop() error {
	var errs []error
	if r.kubeProxy != nil {
		errs = append(errs, r.kubeProxy.Stop(10*time.Second))
		r.kubeProxy = nil
	}
	if r.agent.Pid() != 0 {
		errs = append(errs, r.agent.Stop())
	}
	return errors.Join(errs...)
}

// targets are the Service addresses a sample cycles over: up to Spread of the n Services,
// evenly apart, the last one included.
func (r *runner) targets(n int) []string {
	k := max(1, min(r.cfg.Spread, n))
	out := make([]string, 0, k)
	for j := range k {
		out = append(out, ServiceAddr((n-1)-j*(n/k)))
	}
	return out
}

func (r *runner) stage(ctx context.Context, n int) (*Stage, error) {
	if err := r.stop(); err != nil {
		return nil, err
	}
	st := &Stage{Services: n}
	for _, kind := range []string{KubeProxy, Rampart} {
		p, err := r.program(ctx, kind, n)
		if err != nil {
			return nil, err
		}
		r.cfg.Log("%d Services: %s answers on the last after %.3f s (serving after %.3f s; RSS %.1f MB, maps %.1f MB)",
			n, kind, p.Seconds, p.ServingSeconds, float64(p.RSSBytes)/1e6, float64(p.MapBytes)/1e6)
		st.Programming = append(st.Programming, p)
	}
	// Every checked Service answers through both, and the direct client, with no
	// translation, gets no answer from a Service address.
	checked := make([]string, 0, r.cfg.Checked)
	for j := range min(r.cfg.Checked, n) {
		checked = append(checked, ServiceAddr(j*(n/min(r.cfg.Checked, n))))
	}
	if last := ServiceAddr(n - 1); checked[len(checked)-1] != last {
		checked = append(checked, last)
	}
	st.Checked = len(checked)
	for _, kind := range []string{Rampart, KubeProxy} {
		res, err := r.client(ctx, kind, "check", checked)
		if err != nil {
			return nil, err
		}
		if res.Answered != len(checked) {
			return nil, fmt.Errorf("%s: %d of %d Services answered", kind, res.Answered, len(checked))
		}
	}
	if _, err := r.client(ctx, Direct, "silent", []string{ServiceAddr(0)}, "--timeout", "300ms"); err != nil {
		return nil, err
	}
	r.cfg.Log("%d Services: %d checked through both; measuring %d rounds", n, len(checked), r.cfg.Rounds)

	samples := map[string][]Sample{}
	svcTargets := r.targets(n)
	for round := range r.cfg.Rounds {
		order := append(caseNames[round%len(caseNames):], caseNames[:round%len(caseNames)]...)
		got := map[string]*Sample{}
		for _, c := range order {
			got[c] = &Sample{}
		}
		for _, c := range order {
			ts := svcTargets
			if c == Direct || c == Control {
				ts = []string{r.backend}
			}
			res, err := r.client(ctx, c, "connect", ts, "--n", fmt.Sprint(r.cfg.Connects))
			if err != nil {
				return nil, err
			}
			got[c].ConnectP50us, got[c].ConnectP99us = res.ConnectP50us, res.ConnectP99us
		}
		for _, c := range order {
			ts := svcTargets
			if c == Direct || c == Control {
				ts = []string{r.backend}
			}
			res, err := r.client(ctx, c, "rps", ts, "--duration", r.cfg.Duration.String(), "--workers", fmt.Sprint(r.cfg.Workers))
			if err != nil {
				return nil, err
			}
			got[c].RPS = res.RPS
		}
		for _, c := range caseNames {
			samples[c] = append(samples[c], *got[c])
		}
		r.cfg.Log("%d Services, round %d: connect p50 us direct %.1f control %.1f rampart %.1f kube-proxy %.1f; req/s %.0f %.0f %.0f %.0f",
			n, round+1, got[Direct].ConnectP50us, got[Control].ConnectP50us, got[Rampart].ConnectP50us, got[KubeProxy].ConnectP50us,
			got[Direct].RPS, got[Control].RPS, got[Rampart].RPS, got[KubeProxy].RPS)
	}
	for _, c := range caseNames {
		cs := Case{Name: c, Samples: samples[c]}
		cs.ConnectP50Ratio = ratio(samples[c], samples[Direct], func(s Sample) float64 { return s.ConnectP50us })
		cs.ConnectP99Ratio = ratio(samples[c], samples[Direct], func(s Sample) float64 { return s.ConnectP99us })
		cs.RPSRatio = ratio(samples[c], samples[Direct], func(s Sample) float64 { return s.RPS })
		st.Cases = append(st.Cases, cs)
	}
	return st, nil
}

// ratio is the median over rounds of a case's per-round ratio to the baseline's sample
// of the same round, with the range.
func ratio(xs, base []Sample, f func(Sample) float64) Ratio {
	m, lo, hi := benchkit.PairedRatios(xs, base, f)
	return Ratio{Median: m, Min: lo, Max: hi}
}
