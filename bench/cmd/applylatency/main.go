// Command applylatency measures how long a policy of 100, 1,000 and 10,000 rules takes
// from the apply call to enforcement seen in packets on one node, for one or several
// agent builds in turns (see package applylatency). bench/run-apply-latency.sh builds
// the binaries and runs it.
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/applylatency"
	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

const cmd benchkit.Cmd = "applylatency"

func main() {
	var (
		builds     = flag.String("builds", "", "comma-separated name=DIR, each DIR holding rampartd and rampart; measured in turns, the first is the one the target is checked on")
		sizes      = flag.String("sizes", "100,1000,10000", "comma-separated rule counts")
		rounds     = flag.Int("rounds", 10, "samples per series")
		format     = flag.String("format", "yaml", "the policy document's format: yaml (as rampart apply -f sends a manifest) or json (as the Kubernetes watcher and kubectl hand it over)")
		instance   = flag.String("instance", "", "agent instance name prefix (default alN with N from the process id)")
		podCIDR    = flag.String("pod-cidr", "198.19.64.0/20", "endpoint range, one /24 per build")
		interval   = flag.Duration("interval", time.Millisecond, "time between connection attempts of a prober")
		agentFlags = flag.String("agent-flags", "", "extra rampartd flags, space-separated")
		outDir     = flag.String("out", "bench/results", "directory for the JSON report, markdown table and PNG plot")
		workDir    = flag.String("work-dir", "", "directory for the agents' state and sockets (default: a temporary one, removed at the end)")
		replot     = flag.String("replot", "", "only write the PNG plot and markdown table of this JSON report again (next to it)")
		failMiss   = flag.Bool("fail-on-miss", false, "exit 3 when the target is missed")
	)
	flag.Parse()
	if *replot != "" {
		if err := benchkit.ReplotReport(*replot, applylatency.Table, applylatency.Plot); err != nil {
			cmd.Exit(err)
		}
		return
	}
	cfg := applylatency.Config{
		Rounds: *rounds, Instance: *instance, Interval: *interval, AgentFlags: strings.Fields(*agentFlags),
		Log: cmd.Logf,
	}
	switch f := applylatency.Format(*format); f {
	case applylatency.YAML, applylatency.JSON:
		cfg.Format = f
	default:
		cmd.Exit(fmt.Errorf("--format: %q is not yaml or json", *format))
	}
	if *builds == "" {
		cmd.Exit(fmt.Errorf("--builds: needed"))
	}
	for _, b := range benchkit.SplitList(*builds) {
		name, dir, ok := strings.Cut(b, "=")
		if !ok || name == "" || dir == "" {
			cmd.Exit(fmt.Errorf("--builds: %q is not name=DIR", b))
		}
		build := applylatency.Build{Name: name}
		build.Rampartd, build.Rampart = benchkit.AgentBins(dir)
		cfg.Builds = append(cfg.Builds, build)
	}
	if cfg.Instance == "" {
		cfg.Instance = fmt.Sprintf("al%d", os.Getpid()%100000)
	}
	for _, s := range benchkit.SplitList(*sizes) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > applylatency.MaxRules {
			cmd.Exit(fmt.Errorf("--sizes: %q is not a count in 1..%d", s, applylatency.MaxRules))
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	var err error
	if cfg.PodCIDR, err = netip.ParsePrefix(*podCIDR); err != nil {
		cmd.Exit(fmt.Errorf("--pod-cidr: %w", err))
	}
	cfg.WorkDir = *workDir
	if cfg.WorkDir == "" {
		work, err := os.MkdirTemp("", "rp-applylatency-")
		if err != nil {
			cmd.Exit(err)
		}
		defer os.RemoveAll(work)
		cfg.WorkDir = work
	}
	// Interrupts cancel the run, which then removes what it made; signals stay caught
	// until that is done, so a second Ctrl-C does not cut the clean-up short.
	ctx, stop := benchkit.InterruptContext()
	defer stop()
	rep, runErr := applylatency.Run(ctx, cfg)
	if rep == nil {
		cmd.Exit(runErr)
	}
	if err := benchkit.PublishReport(*outDir, "apply-latency", rep.Started, rep, applylatency.Table(rep),
		func(path string) error { return applylatency.Plot(rep, path) }, "results: %s.{json,md,png}\n"); err != nil {
		cmd.Exit(err)
	}
	if runErr != nil {
		cmd.Exit(runErr) // the clean-up
	}
	if *failMiss {
		for _, c := range rep.Checks {
			if !c.Pass {
				os.Exit(3)
			}
		}
	}
}
