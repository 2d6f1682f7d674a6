package churn

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/api"
)

// Methods: how a change is made.
const (
	MethodAPI        = "api"         // the Go client of internal/api
	MethodCLI        = "cli"         // the rampart binary, one process per change
	MethodBaseline   = "baseline"    // netlink from Go, no agent
	MethodBaselineAA = "baseline-aa" // the same again: the A/A control
	// MethodBaselineTCX is the baseline with two programs attached by TCX, as Rampart
	// attaches its own: what the kernel costs for everything the agent makes.
	MethodBaselineTCX = "baseline-tcx"
	// MethodBaselineClsBPF is the baseline with the two programs as tc cls_bpf filters on
	// its clsact qdisc instead: the kernel's cost of the attach Rampart used before TCX.
	MethodBaselineClsBPF = "baseline-clsbpf"
)

// Methods lists every method in report order.
var Methods = []string{MethodAPI, MethodCLI, MethodBaseline, MethodBaselineAA, MethodBaselineTCX, MethodBaselineClsBPF}

// Operations.
const (
	OpAdd    = "add"
	OpDelete = "delete"
)

// Targets (issue 15): an add through the agent within 20 ms, a delete within 1.5 times
// the baseline's, at every size.
const (
	TargetAddMs       = 20.0
	TargetDeleteRatio = 1.5
)

// benchNamespace is the Rampart namespace of every endpoint the benchmark makes.
const benchNamespace = "churn"

// policies: the population's ingress admits the population and the clients on TCP 8080;
// the clients' egress reaches only the population on TCP 8080. So every endpoint has
// policy, and a client's policy refers to other endpoints' identities.
var policies = []string{`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: pop-ingress
  namespace: churn
spec:
  podSelector:
    matchLabels:
      app: pop
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector:
        matchLabels:
          app: pop
    - podSelector:
        matchLabels:
          app: client
    ports:
    - protocol: TCP
      port: 8080
`, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: client-egress
  namespace: churn
spec:
  podSelector:
    matchLabels:
      app: client
  policyTypes: [Egress]
  egress:
  - to:
    - podSelector:
        matchLabels:
          app: pop
    ports:
    - protocol: TCP
      port: 8080
`}

// popGroups is how many label groups (so identities) the population spreads over.
const popGroups = 10

// Config is one run.
type Config struct {
	Rampartd, Rampart string
	Sizes             []int // endpoints present while changes are measured
	Rounds            int   // changes of each method and operation per size
	Idle              time.Duration
	Instance          string
	WorkDir           string
	PodCIDR           netip.Prefix // the agent's
	BaselineCIDR      netip.Prefix // the baseline's (in its own node namespace)
	AgentFlags        []string     // extra rampartd flags
	Log               func(format string, args ...any)
}

// Series is one method and operation at one size.
type Series struct {
	Size    int       `json:"size"`
	Method  string    `json:"method"`
	Op      string    `json:"op"`
	Samples []float64 `json:"samples_ms"`
	P50     float64   `json:"p50_ms"`
	P99     float64   `json:"p99_ms"`
}

// Idle is the agent at rest with the largest population.
type Idle struct {
	Endpoints   int     `json:"endpoints"`
	RssAnon     int64   `json:"rss_anon_bytes"`
	MapMemlock  int64   `json:"map_memlock_bytes"`
	Maps        int     `json:"maps"`
	Interval    float64 `json:"interval_s"`
	CPUMs       float64 `json:"cpu_ms"`      // utime+stime over the interval
	CPUPercent  float64 `json:"cpu_percent"` // of one core
	AgentCPUOps float64 `json:"agent_cpu_ms_per_change"`
}

// Check is one target, evaluated.
type Check struct {
	Size   int     `json:"size"`
	Method string  `json:"method"`
	What   string  `json:"what"`
	Value  float64 `json:"value"`
	Limit  float64 `json:"limit"`
	Pass   bool    `json:"pass"`
}

// Report is a whole run.
type Report struct {
	Started time.Time `json:"started"`
	Kernel  string    `json:"kernel"`
	CPUs    int       `json:"cpus"`
	Load    float64   `json:"load_average_at_start"`
	Rounds  int       `json:"rounds"`
	Sizes   []int     `json:"sizes"`
	Series  []Series  `json:"series"`
	// FillMs is the time the API took to add each population endpoint, in order.
	FillMs []float64 `json:"fill_ms"`
	// AgentCPUPerChange is the agent's CPU time per change through it, by size.
	AgentCPUPerChange map[int]float64 `json:"agent_cpu_ms_per_change"`
	Idle              *Idle           `json:"idle,omitempty"`
	Checks            []Check         `json:"checks"`
	// AgentFlags are the agent's extra rampartd flags; AttachBaseline is the baseline that
	// attaches as the agent does (its --attach), against which the agent's own share of a
	// change is read ("": baseline-tcx, reports from before the field).
	AgentFlags     []string `json:"agent_flags,omitempty"`
	AttachBaseline string   `json:"attach_baseline,omitempty"`
}

// attachBaseline returns the baseline method that attaches as an agent with flags does.
func attachBaseline(flags []string) string {
	mode := "tc" // rampartd's default
	for i, f := range flags {
		f = strings.TrimLeft(f, "-")
		if v, ok := strings.CutPrefix(f, "attach="); ok {
			mode = v
		} else if f == "attach" && i+1 < len(flags) {
			mode = flags[i+1]
		}
	}
	if mode == "tcx" {
		return MethodBaselineTCX
	}
	return MethodBaselineClsBPF
}

// Find returns the series of size, method and op, or nil.
func (r *Report) Find(size int, method, op string) *Series {
	for i := range r.Series {
		s := &r.Series[i]
		if s.Size == size && s.Method == method && s.Op == op {
			return s
		}
	}
	return nil
}

// Run measures every size in turn (growing the population between them) and returns the
// report. It needs root. Whatever it made is removed when it returns, also on error or
// when ctx is cancelled; if only that clean-up fails, the report comes with the error.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if cfg.Rounds < 1 || len(cfg.Sizes) == 0 {
		return nil, errors.New("churn: need rounds >= 1 and a size")
	}
	sizes := slices.Clone(cfg.Sizes)
	slices.Sort(sizes)
	if sizes[0] < 1 {
		return nil, errors.New("churn: sizes start at 1 (the population's client)")
	}
	if err := benchkit.EnsureBPFFS(); err != nil {
		return nil, err
	}
	rep = &Report{
		Started: time.Now().UTC(), Kernel: benchkit.Kernel(), CPUs: runtime.NumCPU(), Load: benchkit.LoadAverage(),
		Rounds: cfg.Rounds, Sizes: sizes, AgentCPUPerChange: map[int]float64{},
		AgentFlags: cfg.AgentFlags, AttachBaseline: attachBaseline(cfg.AgentFlags),
	}
	logf := cfg.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}

	complete := false
	daemons := &benchkit.Daemons{}
	agent := benchkit.NewAgent(cfg.Rampartd, cfg.Rampart, cfg.Instance, cfg.WorkDir, cfg.PodCIDR)
	agent.Flags = cfg.AgentFlags
	// Uninstalling deletes every endpoint: tens of milliseconds each.
	agent.UninstallTimeout = 10 * time.Minute
	var base *baseline
	defer func() {
		logf("cleaning up (agent --uninstall, baseline namespaces)")
		cerr := agent.Stop()
		if base != nil {
			cerr = errors.Join(cerr, base.close())
		}
		cerr = errors.Join(cerr, daemons.StopAll())
		if cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up: %w", cerr))
		}
		if !complete {
			rep = nil
		}
	}()
	if err := agent.Start(ctx, daemons); err != nil {
		return nil, err
	}
	client := api.NewClient(agent.Socket)
	defer client.Close()
	docs := make([]api.Document, len(policies))
	for i, p := range policies {
		docs[i] = api.Document{Source: fmt.Sprintf("churn-policy-%d.yaml", i), Data: p}
	}
	if _, err := client.Apply(ctx, api.ApplyRequest{Documents: docs}); err != nil {
		return nil, fmt.Errorf("applying the policies: %w", err)
	}
	if base, err = newBaseline("rpb-"+cfg.Instance+"-", cfg.BaselineCIDR); err != nil {
		return nil, err
	}

	present := 0
	for _, size := range sizes {
		for present < size {
			lbl := map[string]string{"app": "pop", "group": fmt.Sprintf("g%d", present%popGroups)}
			if present == 0 {
				lbl = map[string]string{"app": "client"} // keeps the clients' identity alive
			}
			t0 := time.Now()
			if _, err := addAPI(ctx, client, fmt.Sprintf("p%d", present), lbl); err != nil {
				return nil, fmt.Errorf("adding population endpoint %d: %w", present, err)
			}
			rep.FillMs = append(rep.FillMs, ms(time.Since(t0)))
			present++
			if present%100 == 0 {
				logf("population: %d endpoints", present)
			}
		}
		if err := base.populate(size); err != nil {
			return nil, err
		}
		logf("size %d: measuring %d rounds", size, cfg.Rounds)
		if err := measure(ctx, cfg, rep, size, agent, client, base); err != nil {
			return nil, err
		}
	}
	if cfg.Idle > 0 {
		logf("idle: %v with %d endpoints", cfg.Idle, present)
		idle, err := measureIdle(ctx, agent.Pid(), cfg.Idle)
		if err != nil {
			return nil, err
		}
		idle.Endpoints = present
		idle.AgentCPUOps = rep.AgentCPUPerChange[sizes[len(sizes)-1]]
		rep.Idle = idle
	}
	rep.Checks = Evaluate(rep)
	complete = true
	return rep, nil
}

type opFunc func(ctx context.Context, name string) error

// measure runs cfg.Rounds rounds at one size. Each round adds and deletes one endpoint with
// every method, the methods taking turns in a rotating order so that each meets the same
// noise.
func measure(ctx context.Context, cfg Config, rep *Report, size int, agent *benchkit.Agent, client *api.Client, base *baseline) error {
	clientLabels := map[string]string{"app": "client"}
	baseEps := map[string]ep{}
	type method struct {
		name     string
		add, del opFunc
	}
	baseAdd := func(_ context.Context, name string) error {
		e, err := base.add()
		baseEps[name] = e
		return err
	}
	baseDel := func(_ context.Context, name string) error { return base.delete(baseEps[name]) }
	baseAddTCX := func(_ context.Context, name string) error {
		e, err := base.addTCX()
		baseEps[name] = e
		return err
	}
	baseAddClsBPF := func(_ context.Context, name string) error {
		e, err := base.addClsBPF()
		baseEps[name] = e
		return err
	}
	methods := []method{
		{MethodAPI, func(ctx context.Context, name string) error {
			_, err := addAPI(ctx, client, name, clientLabels)
			return err
		}, func(ctx context.Context, name string) error {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			return client.DeleteEndpoint(ctx, benchNamespace, name)
		}},
		{MethodCLI, func(ctx context.Context, name string) error {
			_, err := agent.CLI(ctx, time.Minute, "endpoint", "add", benchNamespace+"/"+name, "--labels", "app=client")
			return err
		}, func(ctx context.Context, name string) error {
			_, err := agent.CLI(ctx, time.Minute, "endpoint", "delete", benchNamespace+"/"+name)
			return err
		}},
		{MethodBaseline, baseAdd, baseDel},
		{MethodBaselineAA, baseAdd, baseDel},
		{MethodBaselineTCX, baseAddTCX, baseDel},
		{MethodBaselineClsBPF, baseAddClsBPF, baseDel},
	}
	samples := map[string]map[string][]float64{}
	for _, m := range methods {
		samples[m.name] = map[string][]float64{}
	}
	var agentTicks int64
	for round := range cfg.Rounds {
		for i := range methods {
			m := methods[(round+i)%len(methods)]
			name := fmt.Sprintf("c%d-%s-%d", size, m.name, round)
			agentOp := m.name == MethodAPI || m.name == MethodCLI
			var t0 int64
			if agentOp {
				t0, _ = cpuTicks(agent.Pid())
			}
			for _, op := range []struct {
				name string
				fn   opFunc
			}{{OpAdd, m.add}, {OpDelete, m.del}} {
				if err := ctx.Err(); err != nil {
					return err
				}
				start := time.Now()
				if err := op.fn(ctx, name); err != nil {
					return fmt.Errorf("size %d, %s %s %s: %w", size, m.name, op.name, name, err)
				}
				samples[m.name][op.name] = append(samples[m.name][op.name], ms(time.Since(start)))
			}
			if agentOp {
				t1, _ := cpuTicks(agent.Pid())
				agentTicks += t1 - t0
			}
		}
	}
	for _, m := range methods {
		for _, op := range []string{OpAdd, OpDelete} {
			xs := samples[m.name][op]
			rep.Series = append(rep.Series, Series{Size: size, Method: m.name, Op: op, Samples: xs, P50: percentile(xs, 50), P99: percentile(xs, 99)})
		}
	}
	// Two changes (add and delete) per round by each of the two agent methods.
	rep.AgentCPUPerChange[size] = float64(agentTicks) * 1000 / clockTicks / float64(4*cfg.Rounds)
	return nil
}

func addAPI(ctx context.Context, c *api.Client, name string, lbl map[string]string) (api.Endpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return c.AddEndpoint(ctx, api.EndpointSpec{Namespace: benchNamespace, Name: name, Labels: lbl})
}

// measureIdle reads the agent's memory and its CPU time over an idle interval.
func measureIdle(ctx context.Context, pid int, interval time.Duration) (*Idle, error) {
	idle := &Idle{Interval: interval.Seconds()}
	t0, err := cpuTicks(pid)
	if err != nil {
		return nil, fmt.Errorf("agent CPU time: %w", err)
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(interval):
	}
	t1, err := cpuTicks(pid)
	if err != nil {
		return nil, fmt.Errorf("agent CPU time: %w", err)
	}
	idle.CPUMs = float64(t1-t0) * 1000 / clockTicks
	idle.CPUPercent = idle.CPUMs / 10 / interval.Seconds()
	if idle.RssAnon, err = rssAnon(pid); err != nil {
		return nil, fmt.Errorf("agent memory: %w", err)
	}
	if idle.MapMemlock, idle.Maps, err = mapMemory(pid); err != nil {
		return nil, fmt.Errorf("agent map memory: %w", err)
	}
	return idle, nil
}

// Evaluate checks the targets at every size, for both agent methods.
func Evaluate(rep *Report) []Check {
	var out []Check
	for _, size := range rep.Sizes {
		base := rep.Find(size, MethodBaseline, OpDelete)
		for _, m := range []string{MethodAPI, MethodCLI} {
			if add := rep.Find(size, m, OpAdd); add != nil {
				out = append(out, Check{Size: size, Method: m, What: "add p50 ms", Value: add.P50, Limit: TargetAddMs, Pass: add.P50 <= TargetAddMs})
			}
			if del := rep.Find(size, m, OpDelete); del != nil && base != nil && base.P50 > 0 {
				r := del.P50 / base.P50
				out = append(out, Check{Size: size, Method: m, What: "delete p50 / baseline delete p50", Value: r, Limit: TargetDeleteRatio, Pass: r <= TargetDeleteRatio})
			}
		}
	}
	return out
}

// percentile is the p-th percentile of xs by the nearest-rank method (an observed value).
func percentile(xs []float64, p float64) float64 {
	d := make([]time.Duration, len(xs))
	for i, x := range xs {
		d[i] = time.Duration(x * float64(time.Millisecond))
	}
	slices.Sort(d)
	return ms(benchkit.Percentile(d, p))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
