// Command l7bench is Rampart's L7 benchmark (the second experiment of the paper on Cilium
// API filtering, at this machine's scale): fortio calls GET /v1 on a small HTTP server in
// another endpoint, with no policy, one L3 rule, one L4 rule, one L7 rule and forty L7
// rules. It prints the latency distribution at a fixed rate, the highest sustained rate of
// each configuration and the ratios L7/L4 and 40 rules/1 rule with PASS/MISS against the
// issue's targets, and writes JSON, markdown and PNG. Run it as root from the repository:
//
//	bench/run-l7.sh            # full run, about five minutes
//	bench/run-l7.sh --quick    # smoke run, under a minute
//
// See docs/benchmarks.md.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/bench/l7"
)

const cmd benchkit.Cmd = "l7bench"

func main() {
	// Helpers started inside endpoints: `l7bench http-server|http-probe ...`.
	benchkit.Main(run, benchkit.Subcommands{Names: l7.Subcommands, Run: l7.Subcommand})
}

func run() int {
	def := l7.DefaultConfig()
	var (
		quick       = flag.Bool("quick", false, "smoke run: one round, 1 s runs, two search steps (CI)")
		repeats     = flag.Int("repeats", 0, "rounds (each configuration once per round, interleaved) (default 3, quick 1)")
		rate        = flag.Float64("rate", def.RateQPS, "fixed rate of the latency runs, requests/s")
		latencyDur  = flag.Duration("latency-duration", 0, "fixed-rate run per round (default 5s, quick 1s)")
		satDur      = flag.Duration("saturation-duration", 0, "closed-loop run per round (default 2s, quick 1s)")
		stepDur     = flag.Duration("step-duration", 0, "each rate of the search (default 2s, quick 1s)")
		steps       = flag.Int("steps", 0, "bisection steps of the rate search (default 4, quick 2)")
		conns       = flag.Int("connections", def.Connections, "concurrent keep-alive connections (fortio -c)")
		minAchieved = flag.Float64("min-achieved", def.Criterion.MinAchieved, "a rate is sustained when at least this fraction of it is achieved (and p99 and status hold)")
		p99Bound    = flag.Duration("p99-bound", def.Criterion.P99Bound, "a rate is sustained when p99 latency stays within this (and rate and status hold)")
		l7Rules     = flag.Int("l7-rules", def.L7Rules, "HTTP rules of the many-rules configuration (the last one matches)")
		cases       = flag.String("cases", "", "comma-separated configurations (default all): "+strings.Join(l7.CaseNames, ","))
		binDir      = flag.String("bin-dir", "", "directory with rampartd and rampart (default: build them from this module into a temporary directory)")
		fortio      = flag.String("fortio", "", "fortio binary (default: fortio on PATH, then $(go env GOPATH)/bin/fortio)")
		outDir      = flag.String("out", def.OutDir, "directory for the JSON report, markdown table and PNG plot")
		clientCPUs  = flag.String("client-cpus", benchkit.CPUFlag(def.ClientCPUs), "CPUs of the load generator, or none")
		serverCPUs  = flag.String("server-cpus", benchkit.CPUFlag(def.ServerCPUs), "CPUs of the HTTP server, or none")
		proxyCPUs   = flag.String("proxy-cpus", benchkit.CPUFlag(def.ProxyCPUs), "CPUs of the agent and the proxy it runs, or none")
		noPlot      = flag.Bool("no-plot", false, "do not write the PNG plot")
		envoyOnly   = flag.Bool("envoy-only", false, "run the agent with --l7-envoy-only: every L7 request through Envoy, no fast path")
		sendSide    = flag.Bool("send-side", false, "run the agent with --l7-send-side: L7 rules the kernel can match checked on the client's socket, no proxy hop")
		failOnMiss  = flag.Bool("fail-on-miss", false, "exit 3 if a ratio misses its target")
	)
	flag.Parse()
	if cmd.ExtraArgs() {
		return 2
	}
	cfg := def
	if *quick {
		cfg = l7.QuickConfig()
	}
	if *repeats != 0 {
		cfg.Repeats = *repeats
	}
	for _, d := range []struct {
		flag time.Duration
		dst  *time.Duration
	}{{*latencyDur, &cfg.LatencyDuration}, {*satDur, &cfg.SaturationDuration}, {*stepDur, &cfg.StepDuration}} {
		if d.flag != 0 {
			*d.dst = d.flag
		}
	}
	if *steps != 0 {
		cfg.SearchSteps = *steps
	}
	cfg.RateQPS, cfg.Connections, cfg.L7Rules = *rate, *conns, *l7Rules
	cfg.Criterion.MinAchieved, cfg.Criterion.P99Bound = *minAchieved, *p99Bound
	cfg.Cases = benchkit.SplitList(*cases)
	cfg.OutDir, cfg.NoPlot = *outDir, *noPlot
	cfg.ClientCPUs, cfg.ServerCPUs, cfg.ProxyCPUs = benchkit.CPUArg(*clientCPUs), benchkit.CPUArg(*serverCPUs), benchkit.CPUArg(*proxyCPUs)
	cfg.EnvoyOnly = *envoyOnly
	cfg.SendSide = *sendSide
	cfg.Log = os.Stderr

	var err error
	if cfg.Self, err = cmd.Self(); err != nil {
		return cmd.Fail(err)
	}
	if cfg.Fortio = *fortio; cfg.Fortio == "" {
		cfg.Fortio, err = benchkit.FindFortio()
	}
	if err != nil {
		return cmd.Fail(err)
	}

	ctx, stop := benchkit.InterruptContext()
	defer stop()
	dir, cleanup, err := benchkit.AgentBinDir(ctx, *binDir)
	if err != nil {
		return cmd.Fail(err)
	}
	defer cleanup()
	cfg.Rampartd, cfg.Rampart = benchkit.AgentBins(dir)

	res, err := l7.Run(ctx, cfg)
	if res != nil {
		fmt.Println()
		res.WriteMarkdown(os.Stdout)
		fmt.Println()
		benchkit.PrintOutputs(res.JSONPath, res.TablePath, res.PlotPath)
	}
	if err != nil {
		return cmd.Fail(err)
	}
	invalid, missed := false, false
	for _, c := range res.Cases {
		invalid = invalid || c.Summary.Verdict == l7.VerdictInvalid
	}
	for _, c := range res.Comparisons {
		missed = missed || c.Verdict == l7.VerdictMiss
	}
	return benchkit.ExitCode(invalid, res.Errors, missed, *failOnMiss)
}
