package policyoverhead

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
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Config controls a run.
type Config struct {
	Quick bool
	// Repeats is the number of rounds. A round measures every agent case once, each paired
	// with a baseline sample taken right next to it.
	Repeats         int
	IperfSeconds    int           // iperf3 -t (whole seconds)
	RRDuration      time.Duration // request/response run per sample
	RRRequestBytes  int
	RRResponseBytes int
	RuleCounts      []int    // sizes of the "N rules, last one matches" cases
	Cases           []string // case names to run (empty: all); the baseline always runs
	Rampartd        string   // agent binary
	Rampart         string   // CLI binary
	// Self is a binary that runs the rr-server, rr-client and probe subcommands (see
	// Subcommand), started inside the endpoints.
	Self   string
	Iperf3 string
	// Hubble is the hubble CLI, which reads the observed agent's flows over Hubble's API
	// in CaseObserved ("": that reader is left out).
	Hubble string
	// CPU pins the measured processes (iperf3 and the RR client and server, on both sides)
	// to this one CPU; -1 leaves them unpinned. On a small VM, traffic between two CPUs
	// pays for cross-CPU wake-ups (slow and bimodal under virtualisation), which hides the
	// per-packet cost being measured; on one CPU the whole path is CPU-bound there.
	CPU int
	// IPv6 runs every case over IPv6: the topologies are dual-stack (the agent with an
	// IPv6 pod range) and the client sends to the server's IPv6 address.
	IPv6   bool
	OutDir string // JSON and PNG go here
	NoPlot bool
	Log    io.Writer // progress; nil: discarded
}

// DefaultConfig is the full run: about three minutes on a 2-core VM.
func DefaultConfig() Config {
	return Config{
		// Many short pairs rather than a few long ones: a burst of other work spoils a
		// sample or two, which the medians drop, instead of part of every sample.
		Repeats:         7,
		IperfSeconds:    1,
		RRDuration:      500 * time.Millisecond,
		RRRequestBytes:  1,
		RRResponseBytes: 1,
		RuleCounts:      []int{1000, 10000},
		Iperf3:          "iperf3",
		CPU:             runtime.NumCPU() - 1,
		OutDir:          "bench/results",
	}
}

// QuickConfig is the smoke run for CI: every case once.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Quick = true
	c.Repeats = 1
	return c
}

// Server ports inside the server endpoint.
var benchPorts = Ports{Iperf: 5201, RR: 5202, Closed: 5203}

const (
	connectTimeout = 10 * time.Second       // servers starting, policy settling
	probeTimeout   = 500 * time.Millisecond // a dropped SYN is retransmitted after 1 s
	enforceTimeout = 2 * time.Minute        // apply until the map holds the entries
)

type runner struct {
	cfg     Config
	log     io.Writer
	daemons benchkit.Daemons
	base    *topology
	agentT  *topology
	control *topology
	agent   *benchkit.Agent
	// obs and obsT are the observed agent and its topology (CaseObserved).
	obs   *benchkit.Agent
	obsT  *topology
	files map[string]string // case name -> manifest path
}

// Run builds the topologies, measures every case once per round and returns the report
// (also written to cfg.OutDir). Everything it creates is removed before it returns, also
// on error or when ctx is cancelled; a cancelled run returns what was measured so far.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the benchmark needs root (network namespaces, BPF)")
	}
	cases, err := buildCases(benchPorts, cfg.RuleCounts, cfg.Cases)
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, log: cfg.Log, files: map[string]string{}}
	if r.log == nil {
		r.log = io.Discard
	}
	sfx := benchkit.Suffix()
	cidrs := benchkit.PodCIDRs(3) // one per topology (the control shares the baseline's)
	baseCIDR, agentCIDR, obsCIDR := cidrs[0], cidrs[1], cidrs[2]
	var baseCIDR6 netip.Prefix
	if cfg.IPv6 {
		baseCIDR6 = benchkit.PodCIDR6Of(baseCIDR)
	}
	res = &Result{
		Schema:  Schema,
		Started: time.Now(),
		Host:    hostInfo(cfg.Iperf3),
		Target:  TargetThroughputRatio,
		Settings: Settings{
			Quick: cfg.Quick, Repeats: cfg.Repeats, IperfSeconds: cfg.IperfSeconds,
			RRSeconds: cfg.RRDuration.Seconds(), RRRequestBytes: cfg.RRRequestBytes,
			RRResponseBytes: cfg.RRResponseBytes, PodCIDRBaseline: baseCIDR.String(),
			InterleavedCases: true, CPU: cfg.CPU, BaselineInstance: "nb" + sfx, IPv6: cfg.IPv6,
		},
	}
	for _, c := range cases {
		res.Cases = append(res.Cases, CaseResult{Name: c.Name, Description: c.Description, Agent: c.Agent, Control: c.Control, Rules: c.Rules})
	}

	var cleanups benchkit.Cleanups
	defer func() {
		// Servers and clients first: nothing may still run in a namespace being removed.
		if cerr := r.daemons.StopAll(); cerr != nil {
			res.Errors = append(res.Errors, "clean-up: "+cerr.Error())
		}
		res.Errors = append(res.Errors, benchkit.CleanupErrors(cleanups.Run())...)
		res.Finished = time.Now()
		res.Host.LoadEnd = benchkit.LoadAverage()
		summarize(res.Cases)
		if werr := r.write(res); werr != nil && err == nil {
			err = werr
		}
	}()
	fail := benchkit.FailFunc(res, &res.Errors)
	if res.Host.BPFStats, err = cleanups.BPFStatsOff(); err != nil {
		return fail(err)
	}

	workDir, err := os.MkdirTemp("", "rp-bench-")
	if err != nil {
		return fail(fmt.Errorf("creating work directory: %w", err))
	}
	cleanups.Add(func() error { return os.RemoveAll(workDir) })

	fmt.Fprintf(r.log, "building the no-agent topology (%s)\n", baseCIDR)
	base, cleanBase, err := buildBaseline(res.Settings.BaselineInstance, baseCIDR, baseCIDR6)
	cleanups.Add(cleanBase)
	if err != nil {
		return fail(err)
	}
	base.IPv6 = cfg.IPv6
	r.base = base
	if err := r.startServers(base); err != nil {
		return fail(err)
	}

	if slices.ContainsFunc(cases, func(c caseDef) bool { return c.Control }) {
		res.Settings.ControlInstance = "nc" + sfx
		fmt.Fprintf(r.log, "building the control topology (%s)\n", baseCIDR)
		// Same addresses as the baseline: it lives in namespaces of its own.
		ctl, cleanCtl, err := buildBaseline(res.Settings.ControlInstance, baseCIDR, baseCIDR6)
		cleanups.Add(cleanCtl)
		if err != nil {
			return fail(err)
		}
		ctl.Name = CaseControl
		ctl.IPv6 = cfg.IPv6
		r.control = ctl
		if err := r.startServers(ctl); err != nil {
			return fail(err)
		}
	}

	if slices.ContainsFunc(cases, func(c caseDef) bool { return c.Agent && !c.Observed }) {
		res.Settings.PodCIDRAgent = agentCIDR.String()
		res.Settings.AgentInstance = "ab" + sfx
		r.agent, r.agentT, err = r.startAgent(ctx, &cleanups, "agent", res.Settings.AgentInstance, filepath.Join(workDir, "agent"), agentCIDR, nil)
		if err != nil {
			return fail(err)
		}
		if cfg.IPv6 {
			res.Settings.PodCIDRAgent += "," + benchkit.PodCIDR6Of(agentCIDR).String()
		}
	}
	if slices.ContainsFunc(cases, func(c caseDef) bool { return c.Observed }) {
		res.Settings.ObservedInstance = "ao" + sfx
		o, err := newObserved(filepath.Join(workDir, "observed"), cfg.Hubble)
		if err != nil {
			return fail(err)
		}
		r.obs, r.obsT, err = r.startAgent(ctx, &cleanups, "observed", res.Settings.ObservedInstance, filepath.Join(workDir, "observed"), obsCIDR, o.flags())
		if err != nil {
			return fail(err)
		}
		stop := o.read(ctx, r.obs, &r.daemons)
		defer func() {
			reads := stop()
			res.Settings.ObservedReads = reads
			if rerr := reads.checkRead(cfg.Hubble != ""); rerr != nil {
				res.Errors = append(res.Errors, rerr.Error())
				err = errors.Join(err, rerr)
			}
		}()
	}
	for _, c := range cases {
		if c.Manifest == nil {
			continue
		}
		p, err := writeFile(workDir, c.Name+".yaml", c.Manifest)
		if err != nil {
			return fail(err)
		}
		r.files[c.Name] = p
	}

	// Every case but the baseline is measured in pairs with it.
	var agentCases []int
	for i := range cases[1:] {
		agentCases = append(agentCases, i+1)
	}
	pairID := 0
	for round := range cfg.Repeats {
		if ctx.Err() != nil {
			res.Incomplete = true
			return fail(fmt.Errorf("interrupted in round %d: %w", round+1, ctx.Err()))
		}
		if len(agentCases) == 0 {
			s, err := r.single(ctx, round, pairID)
			pairID++
			if err != nil {
				res.Cases[0].Errors = append(res.Cases[0].Errors, fmt.Sprintf("round %d: %v", round+1, err))
				continue
			}
			res.Cases[0].Samples = append(res.Cases[0].Samples, s)
			fmt.Fprintf(r.log, "round %d/%d %-12s %6.2f Gbit/s  %7.0f tps  p50 %6.1f us  p99 %6.1f us\n",
				round+1, cfg.Repeats, CaseNoAgent, s.Iperf.BitsPerSecond/1e9, s.RR.TPS, s.RR.P50Us, s.RR.P99Us)
			continue
		}
		// Rotate the order each round so no case always follows the same other one.
		for k := range agentCases {
			i := agentCases[(k+round)%len(agentCases)]
			if ctx.Err() != nil {
				res.Incomplete = true
				return fail(fmt.Errorf("interrupted in round %d: %w", round+1, ctx.Err()))
			}
			// Alternate which side of a pair goes first, so neither gains from a trend.
			cs, bs, err := r.pair(ctx, cases[i], round, pairID, pairID%2 == 0)
			pairID++
			if err != nil {
				res.Cases[i].Errors = append(res.Cases[i].Errors, fmt.Sprintf("round %d: %v", round+1, err))
				fmt.Fprintf(r.log, "round %d/%d %-12s error: %v\n", round+1, cfg.Repeats, cases[i].Name, err)
				continue
			}
			res.Cases[i].Samples = append(res.Cases[i].Samples, cs)
			res.Cases[0].Samples = append(res.Cases[0].Samples, bs)
			fmt.Fprintf(r.log, "round %d/%d %-12s %6.2f vs %6.2f Gbit/s (%.3f)  %6.0f vs %6.0f tps  p50 %5.1f vs %5.1f us  p99 %6.1f vs %6.1f us%s\n",
				round+1, cfg.Repeats, cases[i].Name,
				cs.Iperf.BitsPerSecond/1e9, bs.Iperf.BitsPerSecond/1e9, cs.Iperf.BitsPerSecond/bs.Iperf.BitsPerSecond,
				cs.RR.TPS, bs.RR.TPS, cs.RR.P50Us, bs.RR.P50Us, cs.RR.P99Us, bs.RR.P99Us, setupNote(cs))
		}
	}
	return res, nil
}

func setupNote(s Sample) string {
	if s.EnforcedSeconds == 0 {
		return ""
	}
	return fmt.Sprintf("  enforced in %.3f s (%d entries)", s.EnforcedSeconds, s.MapEntries)
}

func (c *Config) validate() error {
	switch {
	case c.Repeats < 1:
		return errors.New("repeats must be at least 1")
	case c.IperfSeconds < 1:
		return errors.New("iperf3 duration must be at least 1 s (iperf3 -t takes whole seconds; 0 means forever)")
	case c.RRDuration <= 0:
		return errors.New("request/response duration must be positive")
	case c.RRRequestBytes < 1 || c.RRResponseBytes < 1:
		return errors.New("request and response sizes must be at least 1 byte")
	case c.CPU >= runtime.NumCPU():
		return fmt.Errorf("CPU %d: this machine has %d", c.CPU, runtime.NumCPU())
	case c.Self == "":
		return errors.New("no helper binary (Self) for the request/response server, client and probe")
	}
	needAgent := len(c.Cases) == 0
	for _, n := range c.Cases {
		needAgent = needAgent || n != CaseNoAgent
	}
	if needAgent && (c.Rampartd == "" || c.Rampart == "") {
		return errors.New("agent cases need the rampartd and rampart binaries")
	}
	return nil
}

// pin prefixes argv with taskset when the measured processes are pinned to a CPU.
func (r *runner) pin(argv ...string) []string {
	if r.cfg.CPU < 0 {
		return argv
	}
	return append([]string{"taskset", "-c", strconv.Itoa(r.cfg.CPU)}, argv...)
}

// startAgent starts an agent (instance, state in dir, endpoints in cidr, rampartd flags
// extra) with the client, server and bystander endpoints, their servers running, and no
// policy; the caller's clean-ups stop it.
func (r *runner) startAgent(ctx context.Context, cleanups *benchkit.Cleanups, name, instance, dir string, cidr netip.Prefix, extra []string) (*benchkit.Agent, *topology, error) {
	if err := benchkit.EnsureBPFFS(); err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	fmt.Fprintf(r.log, "starting the %s agent (instance %s, %s)\n", name, instance, cidr)
	a := benchkit.NewAgent(r.cfg.Rampartd, r.cfg.Rampart, instance, dir, cidr)
	a.Flags = extra
	if r.cfg.IPv6 {
		a.DualStack(benchkit.PodCIDR6Of(cidr))
	}
	// Registered before start, so a half-started agent is uninstalled too.
	cleanups.Add(a.Stop)
	if err := a.Start(ctx, &r.daemons); err != nil {
		return nil, nil, err
	}
	t := &topology{Name: name, IPv6: r.cfg.IPv6}
	for _, e := range []struct {
		name, app string
		n         uint32
		dst       **benchkit.Endpoint
	}{{"client", clientApp, 10, &t.Client}, {"server", serverApp, 11, &t.Server}, {"bystander", bystanderApp, 12, &t.Bystander}} {
		ep, err := a.AddEndpoint(ctx, benchNamespace, e.name, []string{"app=" + e.app}, benchkit.HostAddr(cidr, e.n))
		if err != nil {
			return nil, nil, err
		}
		*e.dst = ep
	}
	if err := r.startServers(t); err != nil {
		return nil, nil, err
	}
	if n, err := a.PolicyEntries(benchNamespace + "/server"); err != nil {
		return nil, nil, err
	} else if n != 0 {
		return nil, nil, fmt.Errorf("the %s agent's server endpoint has %d policy entries before any policy was applied", name, n)
	}
	return a, t, nil
}

// startServers starts iperf3 and the RR server in the topology's server endpoint. They
// run for the whole benchmark; clients retry until they answer.
func (r *runner) startServers(t *topology) error {
	if _, err := r.daemons.Start(t.Name+" iperf3 server",
		t.Server.Command(context.Background(), r.pin(r.cfg.Iperf3, "-s", "-p", strconv.Itoa(benchPorts.Iperf))...)); err != nil {
		return err
	}
	_, err := r.daemons.Start(t.Name+" rr server",
		t.Server.Command(context.Background(), r.pin(r.cfg.Self, "rr-server",
			"--listen", fmt.Sprintf(":%d", benchPorts.RR),
			"--request", strconv.Itoa(r.cfg.RRRequestBytes), "--response", strconv.Itoa(r.cfg.RRResponseBytes))...))
	return err
}

// single measures the baseline alone (when no agent case runs).
func (r *runner) single(ctx context.Context, round, pairID int) (s Sample, err error) {
	s.Round, s.Pair = round, pairID
	if s.Iperf, err = r.iperf(ctx, r.base); err != nil {
		return s, err
	}
	s.RR, err = r.rr(ctx, r.base)
	return s, err
}

// pair measures agent case c and the no-agent baseline back to back: it applies the
// case's policy (timed until the map holds it), checks enforcement with probes, runs
// iperf3 on both topologies one right after the other, then the request/response test
// on both, and deletes the policy again so every case starts from the same state. The
// two samples of a pair are seconds apart, so they share the machine's conditions; each
// case's ratio is taken against its own pair's baseline.
func (r *runner) pair(ctx context.Context, c caseDef, round, pairID int, baseFirst bool) (cs, bs Sample, err error) {
	cs.Round, cs.Pair = round, pairID
	bs.Round, bs.Pair = round, pairID
	a, t := r.agent, r.agentT
	switch {
	case c.Control:
		t = r.control
	case c.Observed:
		a, t = r.obs, r.obsT
	}
	if c.Manifest != nil {
		if err := r.applyPolicy(ctx, a, c, &cs); err != nil {
			return cs, bs, err
		}
		defer func() {
			if derr := r.deletePolicy(ctx, a, c, &cs); derr != nil {
				err = errors.Join(err, derr)
			}
		}()
	}
	if len(c.Probes) > 0 {
		cs.Probes = map[string]string{}
	}
	// Probes run in parallel: the expected drops each wait out the probe timeout.
	got := make([]string, len(c.Probes))
	errs := make([]error, len(c.Probes))
	var wg sync.WaitGroup
	for i, p := range c.Probes {
		from := t.Client
		if p.From == "bystander" {
			from = t.Bystander
		}
		wg.Go(func() {
			got[i], errs[i] = r.probe(ctx, from, netip.AddrPortFrom(t.serverAddr(), uint16(p.Port)))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return cs, bs, err
	}
	for i, p := range c.Probes {
		cs.Probes[p.Name] = got[i]
		if got[i] != p.Want {
			return cs, bs, fmt.Errorf("enforcement check %s (port %d): got %s, want %s", p.Name, p.Port, got[i], p.Want)
		}
	}
	type side struct {
		t *topology
		s *Sample
	}
	order := []side{{r.base, &bs}, {t, &cs}}
	if !baseFirst {
		order[0], order[1] = order[1], order[0]
	}
	for _, o := range order {
		if o.s.Iperf, err = r.iperf(ctx, o.t); err != nil {
			return cs, bs, err
		}
	}
	for _, o := range order {
		if o.s.RR, err = r.rr(ctx, o.t); err != nil {
			return cs, bs, err
		}
	}
	return cs, bs, nil
}

func (r *runner) applyPolicy(ctx context.Context, a *benchkit.Agent, c caseDef, s *Sample) error {
	t0 := time.Now()
	if _, err := a.CLI(ctx, 10*time.Minute, "apply", "-f", r.files[c.Name]); err != nil {
		return fmt.Errorf("applying policy: %w", err)
	}
	s.ApplySeconds = time.Since(t0).Seconds()
	n, err := waitEntries(ctx, a, func(n int) bool { return n >= c.MinEntries })
	if err != nil {
		return fmt.Errorf("waiting for %d policy entries of the server: %w", c.MinEntries, err)
	}
	s.EnforcedSeconds = time.Since(t0).Seconds()
	s.MapEntries = n
	if s.AgentPolicies, err = a.Policies(ctx); err != nil {
		return err
	}
	if s.AgentPolicies != c.Policies {
		return fmt.Errorf("agent stores %d policies after apply, want %d", s.AgentPolicies, c.Policies)
	}
	return nil
}

func (r *runner) deletePolicy(ctx context.Context, a *benchkit.Agent, c caseDef, s *Sample) error {
	// Clean-up must happen even when the run is being cancelled.
	ctx = context.WithoutCancel(ctx)
	t0 := time.Now()
	if _, err := a.CLI(ctx, 10*time.Minute, "delete", "-f", r.files[c.Name]); err != nil {
		return fmt.Errorf("deleting policy: %w", err)
	}
	if _, err := waitEntries(ctx, a, func(n int) bool { return n == 0 }); err != nil {
		return fmt.Errorf("waiting for the server's policy entries to go: %w", err)
	}
	s.DeleteSeconds = time.Since(t0).Seconds()
	return nil
}

// waitEntries polls the server's policy map entry count until ok accepts it.
func waitEntries(ctx context.Context, a *benchkit.Agent, ok func(int) bool) (int, error) {
	deadline := time.Now().Add(enforceTimeout)
	for {
		n, err := a.PolicyEntries(benchNamespace + "/server")
		if err != nil {
			return n, err
		}
		if ok(n) {
			return n, nil
		}
		if time.Now().After(deadline) {
			return n, fmt.Errorf("still %d entries after %v", n, enforceTimeout)
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (r *runner) probe(ctx context.Context, from *benchkit.Endpoint, to netip.AddrPort) (string, error) {
	out, err := benchkit.RunOutput(ctx, 30*time.Second, func(ctx context.Context) *exec.Cmd {
		return from.Command(ctx, r.cfg.Self, "probe", "--addr", to.String(), "--timeout", probeTimeout.String())
	})
	if err != nil {
		return "", fmt.Errorf("probe from %s: %w", from.Name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// iperf runs one iperf3 client from the client endpoint, retrying while the server is not
// reachable yet.
func (r *runner) iperf(ctx context.Context, t *topology) (IperfResult, error) {
	deadline := time.Now().Add(connectTimeout)
	for {
		out, runErr := benchkit.RunOutput(ctx, time.Duration(r.cfg.IperfSeconds)*time.Second+30*time.Second, func(ctx context.Context) *exec.Cmd {
			return t.Client.Command(ctx, r.pin(r.cfg.Iperf3, "-c", t.serverAddr().String(), "-p", strconv.Itoa(benchPorts.Iperf),
				"-t", strconv.Itoa(r.cfg.IperfSeconds), "-J")...)
		})
		res, err := parseIperf(out)
		if err == nil {
			return res, nil
		}
		if runErr != nil && len(out) == 0 {
			err = runErr
		}
		if !iperfRetryable(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return IperfResult{}, fmt.Errorf("iperf3 %s: %w", t.Name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rr runs the request/response client in the client endpoint.
func (r *runner) rr(ctx context.Context, t *topology) (benchkit.RRResult, error) {
	out, err := benchkit.RunOutput(ctx, r.cfg.RRDuration+connectTimeout+30*time.Second, func(ctx context.Context) *exec.Cmd {
		return t.Client.Command(ctx, r.pin(r.cfg.Self, "rr-client",
			"--addr", netip.AddrPortFrom(t.serverAddr(), uint16(benchPorts.RR)).String(),
			"--duration", r.cfg.RRDuration.String(), "--connect-timeout", connectTimeout.String(),
			"--request", strconv.Itoa(r.cfg.RRRequestBytes), "--response", strconv.Itoa(r.cfg.RRResponseBytes))...)
	})
	if err != nil {
		return benchkit.RRResult{}, fmt.Errorf("request/response %s: %w", t.Name, err)
	}
	var res benchkit.RRResult
	if err := json.Unmarshal(out, &res); err != nil {
		return benchkit.RRResult{}, fmt.Errorf("reading request/response result: %w", err)
	}
	if res.Transactions == 0 {
		return benchkit.RRResult{}, fmt.Errorf("request/response %s: no transactions", t.Name)
	}
	return res, nil
}

// write stores the JSON report and the plot.
func (r *runner) write(res *Result) error {
	if _, err := res.WriteJSON(r.cfg.OutDir); err != nil {
		return err
	}
	var err error
	res.PlotPath, err = benchkit.PlotNextTo(res.JSONPath, r.cfg.NoPlot, func(p string) error { return WritePlot(res, p) })
	return err
}

func hostInfo(iperf3 string) HostInfo {
	h := HostInfo{Machine: benchkit.ThisMachine(), LoadStart: benchkit.LoadAverage()}
	if out, err := exec.Command(iperf3, "--version").Output(); err == nil {
		h.Iperf3, _, _ = strings.Cut(string(out), "\n")
	}
	return h
}
