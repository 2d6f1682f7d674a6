// Command churn measures endpoint add and delete through a Rampart agent (API and CLI)
// beside a plain netlink baseline, with 1, 100 and 1,000 endpoints present (see package
// churn). bench/run-churn.sh builds the binaries and runs it.
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/churn"
	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

const cmd benchkit.Cmd = "churn"

func main() {
	var (
		binDir     = flag.String("bin-dir", "", "directory holding rampartd and rampart")
		sizes      = flag.String("sizes", "1,100,1000", "comma-separated endpoint counts present while changes are measured")
		rounds     = flag.Int("rounds", 40, "changes of each method and operation per size")
		idle       = flag.Duration("idle", 10*time.Second, "idle interval for the agent's CPU time at the largest size (0: skip)")
		instance   = flag.String("instance", "", "agent instance name (default chN with N from the process id)")
		podCIDR    = flag.String("pod-cidr", "198.19.0.0/17", "the agent's endpoint range")
		baseCIDR   = flag.String("baseline-cidr", "198.19.128.0/24", "the baseline's endpoint range (in a node namespace of its own)")
		agentFlags = flag.String("agent-flags", "", "extra rampartd flags, space-separated")
		outDir     = flag.String("out", "bench/results", "directory for the JSON report, markdown table and PNG plot")
		workDir    = flag.String("work-dir", "", "directory for the agent's state and socket (default: a temporary one, removed at the end)")
		replot     = flag.String("replot", "", "only write the PNG plot and markdown table of this JSON report again (next to it)")
	)
	flag.Parse()
	if *replot != "" {
		if err := benchkit.ReplotReport(*replot, churn.Table, churn.Plot); err != nil {
			cmd.Exit(err)
		}
		return
	}
	cfg := churn.Config{
		Rounds: *rounds, Idle: *idle, Instance: *instance,
		Log: cmd.Logf,
	}
	if *binDir == "" {
		cmd.Exit(fmt.Errorf("--bin-dir: needed"))
	}
	cfg.Rampartd, cfg.Rampart = benchkit.AgentBins(*binDir)
	if cfg.Instance == "" {
		cfg.Instance = fmt.Sprintf("ch%d", os.Getpid()%100000)
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			cmd.Exit(fmt.Errorf("--sizes: %q is not a count >= 1", s))
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	var err error
	if cfg.PodCIDR, err = netip.ParsePrefix(*podCIDR); err != nil {
		cmd.Exit(fmt.Errorf("--pod-cidr: %w", err))
	}
	if cfg.BaselineCIDR, err = netip.ParsePrefix(*baseCIDR); err != nil {
		cmd.Exit(fmt.Errorf("--baseline-cidr: %w", err))
	}
	cfg.AgentFlags = strings.Fields(*agentFlags)
	cfg.WorkDir = *workDir
	if cfg.WorkDir == "" {
		work, err := os.MkdirTemp("", "rp-churn-")
		if err != nil {
			cmd.Exit(err)
		}
		defer os.RemoveAll(work)
		cfg.WorkDir = work
	} else if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		cmd.Exit(err)
	}

	// Interrupts cancel the run, which then removes what it made; signals stay caught
	// until that is done, so a second Ctrl-C does not cut the clean-up short.
	ctx, stop := benchkit.InterruptContext()
	defer stop()
	rep, runErr := churn.Run(ctx, cfg)
	if rep == nil {
		cmd.Exit(runErr)
	}
	if err := benchkit.PublishReport(*outDir, "churn", rep.Started, rep, churn.Table(rep),
		func(path string) error { return churn.Plot(rep, path) }, "results: %s.{json,md,png}\n"); err != nil {
		cmd.Exit(err)
	}
	if runErr != nil {
		cmd.Exit(runErr) // the clean-up
	}
}
