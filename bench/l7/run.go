package l7

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/policy"
)

// Config controls a run.
type Config struct {
	Quick   bool
	Repeats int // rounds; every configuration is measured once per round
	// RateQPS is the fixed rate of the latency runs: well under what every configuration
	// sustains on this machine, so that the distribution shows the cost per request rather
	// than queueing.
	RateQPS            float64
	LatencyDuration    time.Duration // the fixed-rate run
	SaturationDuration time.Duration // the closed-loop run that bounds the search
	StepDuration       time.Duration // each rate the search tries
	SearchSteps        int
	Connections        int // fortio -c: concurrent keep-alive connections
	Criterion          Criterion
	L7Rules            int      // HTTP rules of the many-rules configuration
	Cases              []string // configurations to run (empty: all)
	Rampartd           string   // agent binary
	Rampart            string   // CLI binary
	// Self is a binary that runs the http-server and http-probe subcommands (see
	// Subcommand), started inside the endpoints.
	Self   string
	Fortio string
	// CPU lists ("0", "1", "0-1"; "" = not pinned) for the load generator (in the client
	// endpoint), the HTTP server, and the agent with the proxy it runs as its child.
	ClientCPUs, ServerCPUs, ProxyCPUs string
	// EnvoyOnly runs the agent with --l7-envoy-only: Envoy checks every request, without
	// the agent's HTTP/1.1 fast path (to measure what the fast path buys).
	EnvoyOnly bool
	// SendSide runs the agent with --l7-send-side: the L7 rules the kernel can match are
	// checked on the client's socket, with no proxy hop (docs/internals/l7-send-side.md).
	SendSide bool
	OutDir   string // JSON, markdown and PNG go here
	NoPlot   bool
	Log      io.Writer // progress; nil: discarded
}

// DefaultConfig is the full run: about five minutes on a 2-core VM.
func DefaultConfig() Config {
	c := Config{
		Repeats:            3,
		RateQPS:            1000,
		LatencyDuration:    5 * time.Second,
		SaturationDuration: 2 * time.Second,
		StepDuration:       2 * time.Second,
		SearchSteps:        4,
		Connections:        16,
		Criterion:          Criterion{MinAchieved: 0.98, P99Bound: 10 * time.Millisecond},
		L7Rules:            40,
		Fortio:             "fortio",
		OutDir:             "bench/results",
	}
	// Two CPUs or more: the load generator on the first, everything on the server's side
	// of the measured path (server, agent, proxy) on the last, as a node would run them
	// while clients come from elsewhere. One CPU: nothing to pin.
	if n := runtime.NumCPU(); n >= 2 {
		c.ClientCPUs = "0"
		c.ServerCPUs = strconv.Itoa(n - 1)
		c.ProxyCPUs = c.ServerCPUs
	}
	return c
}

// QuickConfig is the smoke run for CI: every configuration once, short runs.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Quick = true
	c.Repeats = 1
	c.LatencyDuration = time.Second
	c.SaturationDuration = time.Second
	c.StepDuration = time.Second
	c.SearchSteps = 2
	return c
}

const (
	probeTimeout   = 500 * time.Millisecond // a dropped SYN is retransmitted after 1 s
	enforceTimeout = time.Minute            // apply until the checks pass, or the server's entries are gone
	readyTimeout   = 30 * time.Second       // the HTTP server answering
	// proxyWait is how long an L7 configuration may go without any proxy process before
	// the benchmark calls it not available.
	proxyWait = 10 * time.Second
)

type runner struct {
	cfg     Config
	log     io.Writer
	daemons benchkit.Daemons
	agent   *benchkit.Agent
	client  *benchkit.Endpoint
	server  *benchkit.Endpoint
	bystand *benchkit.Endpoint
	files   map[string]string // case name -> manifest path
	proxy   string            // the proxy's binary and version, once seen
}

// Run starts an agent with a client, a server and a bystander endpoint, measures every
// configuration once per round and returns the report (also written to cfg.OutDir).
// Everything it creates is removed before it returns, also on error or when ctx is
// cancelled; a cancelled run returns what was measured so far.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the benchmark needs root (network namespaces, BPF)")
	}
	cases, err := buildCases(cfg.Cases, cfg.L7Rules)
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, log: cfg.Log, files: map[string]string{}}
	if r.log == nil {
		r.log = io.Discard
	}
	podCIDR := benchkit.PodCIDRs(1)[0]
	crit := cfg.Criterion
	crit.P99BoundUs = float64(crit.P99Bound / time.Microsecond)
	res = &Result{
		Schema:  Schema,
		Started: time.Now(),
		Host:    hostInfo(cfg.Fortio),
		Settings: Settings{
			Quick: cfg.Quick, Repeats: cfg.Repeats, RateQPS: cfg.RateQPS,
			LatencySeconds: cfg.LatencyDuration.Seconds(), SaturationSecs: cfg.SaturationDuration.Seconds(),
			StepSeconds: cfg.StepDuration.Seconds(), SearchSteps: cfg.SearchSteps, Connections: cfg.Connections,
			Criterion: crit, L7Rules: cfg.L7Rules, InterleavedCases: true,
			ClientCPUs: cfg.ClientCPUs, ServerCPUs: cfg.ServerCPUs, ProxyCPUs: cfg.ProxyCPUs,
			EnvoyOnly: cfg.EnvoyOnly, SendSide: cfg.SendSide,
			PodCIDR: podCIDR.String(), Instance: "lb" + benchkit.Suffix(),
		},
	}
	for _, c := range cases {
		cr := CaseResult{Name: c.Name, Description: c.Description, Layer: c.Layer, Rules: c.Rules, Manifest: string(c.Manifest), Samples: []Sample{}}
		if c.L7 {
			// The parser is the one rampartd is built from: if it refuses HTTP rules, the
			// agent cannot enforce them yet.
			if _, perr := policy.ParseDocuments(c.Name+".yaml", c.Manifest); perr != nil {
				cr.NotAvailable = "the policy parser rejects toPorts[].rules.http: " + perr.Error()
			}
		}
		res.Cases = append(res.Cases, cr)
	}

	var cleanups benchkit.Cleanups
	defer func() {
		res.Errors = append(res.Errors, benchkit.CleanupErrors(cleanups.Run())...)
		res.Finished = time.Now()
		res.Host.LoadEnd = benchkit.LoadAverage()
		res.Host.Proxy = r.proxy
		summarize(res)
		if werr := r.write(res); werr != nil && err == nil {
			err = werr
		}
	}()
	fail := benchkit.FailFunc(res, &res.Errors)
	if res.Host.BPFStats, err = cleanups.BPFStatsOff(); err != nil {
		return fail(err)
	}
	cleanups.Add(r.daemons.StopAll)

	workDir, err := os.MkdirTemp("", "rp-bench-l7-")
	if err != nil {
		return fail(fmt.Errorf("creating work directory: %w", err))
	}
	cleanups.Add(func() error { return os.RemoveAll(workDir) })
	if err := benchkit.EnsureBPFFS(); err != nil {
		return fail(err)
	}

	fmt.Fprintf(r.log, "starting the agent (instance %s, %s)\n", res.Settings.Instance, podCIDR)
	r.agent = benchkit.NewAgent(cfg.Rampartd, cfg.Rampart, res.Settings.Instance, workDir, podCIDR)
	// The agent runs on the proxy's CPUs: the proxy it starts inherits them.
	r.agent.Wrap = benchkit.Taskset(cfg.ProxyCPUs)
	if cfg.EnvoyOnly {
		r.agent.Flags = append(r.agent.Flags, "--l7-envoy-only")
	}
	if cfg.SendSide {
		r.agent.Flags = append(r.agent.Flags, "--l7-send-side")
	}
	// Registered before start, so a half-started agent is uninstalled too. The server
	// inside its endpoint (and the agent) are stopped first, newest first.
	cleanups.Add(func() error {
		return errors.Join(r.daemons.StopAll(), r.agent.Stop())
	})
	if err := r.agent.Start(ctx, &r.daemons); err != nil {
		return fail(err)
	}
	for _, e := range []struct {
		name, app string
		n         uint32
		dst       **benchkit.Endpoint
	}{{"client", clientApp, 10, &r.client}, {"server", serverApp, 11, &r.server}, {"bystander", bystanderApp, 12, &r.bystand}} {
		ep, err := r.agent.AddEndpoint(ctx, benchNamespace, e.name, []string{"app=" + e.app}, benchkit.HostAddr(podCIDR, e.n))
		if err != nil {
			return fail(err)
		}
		*e.dst = ep
	}
	if _, err := r.daemons.Start("http server", r.server.Command(context.Background(),
		benchkit.Taskset(cfg.ServerCPUs, cfg.Self, "http-server", "--listen", fmt.Sprintf(":%d", httpPort))...)); err != nil {
		return fail(err)
	}
	if err := r.waitServer(ctx); err != nil {
		return fail(err)
	}
	for _, c := range cases {
		if c.Manifest == nil {
			continue
		}
		p := filepath.Join(workDir, c.Name+".yaml")
		if err := os.WriteFile(p, c.Manifest, 0o600); err != nil {
			return fail(fmt.Errorf("writing policy %s: %w", c.Name, err))
		}
		r.files[c.Name] = p
	}

	for round := range cfg.Repeats {
		// Rotate the order each round so that no configuration always runs right after
		// the same other one.
		for k := range cases {
			i := (k + round) % len(cases)
			c, cr := cases[i], &res.Cases[i]
			if cr.NotAvailable != "" {
				continue
			}
			if ctx.Err() != nil {
				res.Incomplete = true
				return fail(fmt.Errorf("interrupted in round %d: %w", round+1, ctx.Err()))
			}
			if done, aerr := r.agent.Exited(); done {
				return fail(aerr)
			}
			s, err := r.sample(ctx, c, round)
			var na notAvailableError
			switch {
			case errors.As(err, &na) && len(cr.Samples) == 0 && len(cr.Errors) == 0:
				cr.NotAvailable = na.reason
				fmt.Fprintf(r.log, "round %d/%d %-9s not available: %s\n", round+1, cfg.Repeats, c.Name, na.reason)
				continue
			case err != nil:
				cr.Errors = append(cr.Errors, fmt.Sprintf("round %d: %v", round+1, err))
				fmt.Fprintf(r.log, "round %d/%d %-9s error: %v\n", round+1, cfg.Repeats, c.Name, err)
				continue
			}
			cr.Samples = append(cr.Samples, s)
			fmt.Fprintf(r.log, "round %d/%d %-9s at %.0f/s: p50 %s p99 %s p99.9 %s max %s ms; closed loop %.0f/s; sustained %.0f/s%s\n",
				round+1, cfg.Repeats, c.Name, cfg.RateQPS, ms(benchkit.Float(s.Latency.P50Us)), ms(benchkit.Float(s.Latency.P99Us)),
				ms(benchkit.Float(s.Latency.P999Us)), ms(benchkit.Float(s.Latency.MaxUs)), s.Saturation.ActualQPS, s.SustainedQPS, setupNote(s))
		}
	}
	return res, nil
}

func setupNote(s Sample) string {
	if s.EnforcedSeconds == 0 {
		return ""
	}
	return fmt.Sprintf("; enforced in %.2f s", s.EnforcedSeconds)
}

// notAvailableError marks a configuration the agent refuses to set up (an L7 policy before
// the agent supports L7 rules), as opposed to one that fails while measured.
type notAvailableError struct{ reason string }

func (e notAvailableError) Error() string { return "not available: " + e.reason }

func (c *Config) validate() error {
	switch {
	case c.Repeats < 1:
		return errors.New("repeats must be at least 1")
	case c.RateQPS <= 0:
		return errors.New("the fixed rate must be positive")
	case c.LatencyDuration < time.Second || c.SaturationDuration < time.Second || c.StepDuration < time.Second:
		return errors.New("run durations must be at least 1 s")
	case c.SearchSteps < 1:
		return errors.New("the rate search needs at least one step")
	case c.Connections < 1:
		return errors.New("connections must be at least 1")
	case c.Criterion.MinAchieved <= 0 || c.Criterion.MinAchieved > 1 || c.Criterion.P99Bound <= 0:
		return errors.New("criterion: achieved fraction in (0, 1] and a positive p99 bound")
	case c.Self == "":
		return errors.New("no helper binary (Self) for the HTTP server and probes")
	case c.Rampartd == "" || c.Rampart == "":
		return errors.New("need the rampartd and rampart binaries")
	case c.Fortio == "":
		return errors.New("need the fortio binary")
	}
	for _, cpus := range []string{c.ClientCPUs, c.ServerCPUs, c.ProxyCPUs} {
		if _, err := benchkit.ParseCPUList(cpus); err != nil {
			return err
		}
	}
	return nil
}

// waitServer waits until the HTTP server answers the client.
func (r *runner) waitServer(ctx context.Context) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		got, err := r.probe(ctx, r.client, []probeSpec{{Name: "ready", Method: "GET", Path: benchPath, Port: httpPort}})
		if err == nil && got["ready"] == "200" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("HTTP server not answering within %v: %v %v", readyTimeout, got, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sample measures one configuration once: it applies the configuration's policy (timed
// until the enforcement checks pass), measures the latency at the fixed rate, the
// closed-loop rate and the highest sustained rate, and deletes the policy again so that
// every configuration starts from the same state.
func (r *runner) sample(ctx context.Context, c caseDef, round int) (s Sample, err error) {
	s.Round = round
	t0 := time.Now()
	if c.Manifest != nil {
		if _, err := r.agent.CLI(ctx, 5*time.Minute, "apply", "-f", r.files[c.Name]); err != nil {
			if c.L7 {
				return s, notAvailableError{"rampart apply refuses the policy: " + err.Error()}
			}
			return s, fmt.Errorf("applying policy: %w", err)
		}
		s.ApplySeconds = time.Since(t0).Seconds()
		defer func() {
			if derr := r.deletePolicy(ctx, c, &s); derr != nil {
				err = errors.Join(err, derr)
			}
		}()
	}
	var noProxy func() bool
	if c.L7 {
		// Before the agent runs a proxy, L7 traffic is dropped (fail closed): give up on
		// waiting for it after a while rather than after enforceTimeout.
		noProxy = func() bool {
			n, err := r.pinProxies()
			return err == nil && n == 0 && time.Since(t0) > proxyWait
		}
	}
	if s.Probes, err = r.waitProbes(ctx, c.Probes, noProxy); err != nil {
		if c.L7 {
			if n, perr := r.pinProxies(); perr == nil && n == 0 {
				return s, notAvailableError{"rampart apply accepts the policy, but the agent runs no L7 proxy (no envoy process) " +
					"and the enforcement checks fail: " + err.Error()}
			}
		}
		return s, err
	}
	if c.Manifest != nil {
		s.EnforcedSeconds = time.Since(t0).Seconds()
		if s.MapEntries, err = r.agent.PolicyEntries(r.server.Name); err != nil {
			return s, err
		}
		if s.AgentPolicies, err = r.agent.Policies(ctx); err != nil {
			return s, err
		}
		if s.AgentPolicies != 1 {
			return s, fmt.Errorf("agent stores %d policies after apply, want 1", s.AgentPolicies)
		}
	}
	if s.ProxyProcesses, err = r.pinProxies(); err != nil {
		return s, err
	}
	if r.proxy == "" && s.ProxyProcesses > 0 {
		r.proxy = r.proxyVersion(ctx)
	}
	if s.Latency, err = r.loadRetry(ctx, r.cfg.RateQPS, r.cfg.LatencyDuration, &s); err != nil {
		return s, fmt.Errorf("fixed-rate run: %w", err)
	}
	s.LatencySustained, s.LatencyWhy = r.cfg.Criterion.judge(s.Latency)
	if s.Saturation, err = r.loadRetry(ctx, 0, r.cfg.SaturationDuration, &s); err != nil {
		return s, fmt.Errorf("closed-loop run: %w", err)
	}
	if s.Saturation.Errors > 0 {
		return s, fmt.Errorf("closed-loop run: %d of %d responses not 200 (%v)", s.Saturation.Errors, s.Saturation.Requests, s.Saturation.RetCodes)
	}
	s.SustainedQPS, s.Steps, err = searchSustained(ctx, s.Saturation.ActualQPS, r.cfg.SearchSteps, r.cfg.Criterion,
		func(ctx context.Context, rate float64) (LoadRun, error) {
			return r.loadRetry(ctx, rate, r.cfg.StepDuration, &s)
		})
	if err != nil {
		return s, fmt.Errorf("rate search: %w", err)
	}
	return s, nil
}

func (r *runner) deletePolicy(ctx context.Context, c caseDef, s *Sample) error {
	// Clean-up must happen even when the run is being cancelled.
	ctx = context.WithoutCancel(ctx)
	t0 := time.Now()
	if _, err := r.agent.CLI(ctx, 5*time.Minute, "delete", "-f", r.files[c.Name]); err != nil {
		return fmt.Errorf("deleting policy: %w", err)
	}
	deadline := time.Now().Add(enforceTimeout)
	for {
		n, err := r.agent.PolicyEntries(r.server.Name)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("server still has %d policy entries %v after delete", n, enforceTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.DeleteSeconds = time.Since(t0).Seconds()
	return nil
}

// waitProbes runs the configuration's enforcement checks until every outcome is one the
// policy allows, or enforceTimeout passes (the policy may take effect after apply returns:
// the proxy gets its configuration asynchronously).
// giveUp, if not nil, can end the wait early.
func (r *runner) waitProbes(ctx context.Context, probes []probeSpec, giveUp func() bool) (map[string]string, error) {
	start := time.Now()
	deadline := start.Add(enforceTimeout)
	for {
		got := map[string]string{}
		var errs, wrong []string
		for _, from := range []*benchkit.Endpoint{r.client, r.bystand} {
			var ps []probeSpec
			for _, p := range probes {
				if benchNamespace+"/"+p.From == from.Name {
					ps = append(ps, p)
				}
			}
			if len(ps) == 0 {
				continue
			}
			out, err := r.probe(ctx, from, ps)
			if err != nil {
				errs = append(errs, err.Error())
			}
			for k, v := range out {
				got[k] = v
			}
		}
		for _, p := range probes {
			if !slices.Contains(p.Want, got[p.Name]) {
				wrong = append(wrong, fmt.Sprintf("%s: got %q, want %s", p.Name, got[p.Name], strings.Join(p.Want, " or ")))
			}
		}
		if len(errs) == 0 && len(wrong) == 0 {
			return got, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil || (giveUp != nil && giveUp()) {
			sort.Strings(wrong)
			return got, fmt.Errorf("enforcement checks failed after %.1f s: %s", time.Since(start).Seconds(), strings.Join(append(wrong, errs...), "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// probe runs the http-probe helper in endpoint from.
func (r *runner) probe(ctx context.Context, from *benchkit.Endpoint, ps []probeSpec) (map[string]string, error) {
	argv := []string{r.cfg.Self, "http-probe", "--timeout", probeTimeout.String()}
	for _, p := range ps {
		u := fmt.Sprintf("http://%s%s", netip.AddrPortFrom(r.server.IP, uint16(p.Port)), p.Path)
		argv = append(argv, fmt.Sprintf("%s=%s,%s", p.Name, p.Method, u))
	}
	out, err := benchkit.RunOutput(ctx, 30*time.Second, func(ctx context.Context) *exec.Cmd {
		return from.Command(ctx, argv...)
	})
	if err != nil {
		return nil, fmt.Errorf("probes from %s: %w", from.Name, err)
	}
	got := map[string]string{}
	if err := json.Unmarshal(out, &got); err != nil {
		return nil, fmt.Errorf("reading probe results: %w", err)
	}
	return got, nil
}

// pinProxies pins every proxy process the agent runs to the proxy CPUs (they inherit the
// agent's mask at start; this holds even if the agent sets its own), and counts them.
func (r *runner) pinProxies() (int, error) {
	pids, err := benchkit.Descendants(r.agent.Pid(), "envoy")
	if err != nil {
		return 0, err
	}
	cpus, _ := benchkit.ParseCPUList(r.cfg.ProxyCPUs)
	if len(cpus) > 0 {
		for _, p := range pids {
			if err := benchkit.PinProcess(p, cpus); err != nil {
				return 0, fmt.Errorf("pinning the proxy: %w", err)
			}
		}
	}
	return len(pids), nil
}

// proxyVersion returns the binary and version of the proxy the agent runs.
func (r *runner) proxyVersion(ctx context.Context) string {
	pids, err := benchkit.Descendants(r.agent.Pid(), "envoy")
	if err != nil || len(pids) == 0 {
		return ""
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pids[0]))
	if err != nil {
		return ""
	}
	out, err := benchkit.RunOutput(ctx, 30*time.Second, func(ctx context.Context) *exec.Cmd {
		return benchkit.OwnGroup(exec.CommandContext(ctx, exe, "--version"))
	})
	v := strings.TrimSpace(string(out))
	if i := strings.LastIndex(v, "version: "); i >= 0 {
		v = v[i+len("version: "):]
	}
	if err != nil || v == "" {
		return exe
	}
	return exe + " " + v
}

// loadRetry runs load, and once more if fortio could not connect: each such failure is
// recorded in s.Incidents with what the proxy held at the time, so that it shows in the
// report instead of silently lowering a rate (fortio counts nothing for a connection it
// never made) or failing the whole configuration. A second failure is an error.
func (r *runner) loadRetry(ctx context.Context, rate float64, d time.Duration, s *Sample) (LoadRun, error) {
	run, err := r.load(ctx, rate, d)
	if err == nil || !strings.Contains(err.Error(), "Unable to connect") || ctx.Err() != nil {
		return run, err
	}
	what := "closed-loop run"
	if rate > 0 {
		what = fmt.Sprintf("run at %.0f/s", rate)
	}
	s.Incidents = append(s.Incidents, fmt.Sprintf("%s: a connection from the client could not be established (fortio: Unable to connect); %s; retried",
		what, r.proxyUpstreams(ctx)))
	return r.load(ctx, rate, d)
}

// proxyUpstreams describes the proxy's upstream connections that use the client's address
// (original source): a new connection of the client on the same port and to the same
// server collides with one of them.
func (r *runner) proxyUpstreams(ctx context.Context) string {
	out, err := benchkit.RunOutput(ctx, 30*time.Second, func(ctx context.Context) *exec.Cmd {
		return benchkit.OwnGroup(exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+r.agent.NodeNetns(), "--",
			"ss", "-Htn", "state", "established", "src", r.client.IP.String(), "dst", r.server.IP.String()))
	})
	if err != nil {
		return "could not list the node namespace's connections: " + err.Error()
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(l) != "" {
			n++
		}
	}
	return fmt.Sprintf("the node namespace then held %d connections from the client's address to the server (the proxy's upstream connections keep the client's address)", n)
}

// load runs fortio in the client endpoint against the server's GET /v1: at rate requests/s
// (0: closed loop, as fast as the connections go) for d.
func (r *runner) load(ctx context.Context, rate float64, d time.Duration) (LoadRun, error) {
	url := fmt.Sprintf("http://%s%s", netip.AddrPortFrom(r.server.IP, httpPort), benchPath)
	argv := benchkit.Taskset(r.cfg.ClientCPUs, r.cfg.Fortio, "load",
		"-qps", strconv.FormatFloat(rate, 'f', 0, 64), "-c", strconv.Itoa(r.cfg.Connections),
		"-t", d.String(), "-uniform",
		// 10 us resolution of the first buckets (fortio's default is 1 ms).
		"-r", "0.00001", "-p", "50,90,99,99.9",
		"-loglevel", "Error", "-log-errors=false", "-json", "-", url)
	before, err := benchkit.ReadCPUTimes()
	if err != nil {
		return LoadRun{}, err
	}
	out, err := benchkit.RunOutput(ctx, d+time.Minute, func(ctx context.Context) *exec.Cmd {
		return r.client.Command(ctx, argv...)
	})
	if err != nil {
		return LoadRun{}, fmt.Errorf("fortio: %w", err)
	}
	after, err := benchkit.ReadCPUTimes()
	if err != nil {
		return LoadRun{}, err
	}
	run, err := parseFortio(out)
	if err != nil {
		return LoadRun{}, err
	}
	for _, b := range benchkit.BusyPercent(before, after) {
		run.CPUBusy = append(run.CPUBusy, float64(int(b*10))/10)
	}
	return run, nil
}

// write stores the JSON report, the markdown table and the plot.
func (r *runner) write(res *Result) (err error) {
	res.PlotPath, err = benchkit.WriteOutputs(res, r.cfg.OutDir, r.cfg.NoPlot, func(p string) error { return WritePlot(res, p) })
	return err
}

func hostInfo(fortio string) HostInfo {
	h := HostInfo{Machine: benchkit.ThisMachine(), LoadStart: benchkit.LoadAverage()}
	if out, err := exec.Command(fortio, "version").Output(); err == nil {
		h.Fortio = strings.TrimSpace(string(out))
	}
	return h
}
