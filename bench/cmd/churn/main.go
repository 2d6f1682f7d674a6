// Command churn measures endpoint add and delete through a Rampart agent (API and CLI)
// beside a plain netlink baseline, with 1, 100 and 1,000 endpoints present (see package
// churn). bench/run-churn.sh builds the binaries and runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/bench/churn"
	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

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
		var rep churn.Report
		if err := benchkit.Replot(*replot, &rep, func(path string) error {
			if err := os.WriteFile(strings.TrimSuffix(path, ".png")+".md", []byte(churn.Table(&rep)), 0o644); err != nil {
				return err
			}
			return churn.Plot(&rep, path)
		}); err != nil {
			fail(err)
		}
		return
	}
	cfg := churn.Config{
		Rampartd: filepath.Join(*binDir, "rampartd"), Rampart: filepath.Join(*binDir, "rampart"),
		Rounds: *rounds, Idle: *idle, Instance: *instance,
		Log: func(f string, a ...any) {
			fmt.Fprintf(os.Stderr, "%s churn: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(f, a...))
		},
	}
	if *binDir == "" {
		fail(fmt.Errorf("--bin-dir: needed"))
	}
	if cfg.Instance == "" {
		cfg.Instance = fmt.Sprintf("ch%d", os.Getpid()%100000)
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fail(fmt.Errorf("--sizes: %q is not a count >= 1", s))
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	var err error
	if cfg.PodCIDR, err = netip.ParsePrefix(*podCIDR); err != nil {
		fail(fmt.Errorf("--pod-cidr: %w", err))
	}
	if cfg.BaselineCIDR, err = netip.ParsePrefix(*baseCIDR); err != nil {
		fail(fmt.Errorf("--baseline-cidr: %w", err))
	}
	cfg.AgentFlags = strings.Fields(*agentFlags)
	cfg.WorkDir = *workDir
	if cfg.WorkDir == "" {
		work, err := os.MkdirTemp("", "rp-churn-")
		if err != nil {
			fail(err)
		}
		defer os.RemoveAll(work)
		cfg.WorkDir = work
	} else if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		fail(err)
	}

	// Interrupts cancel the run, which then removes what it made; signals stay caught
	// until that is done, so a second Ctrl-C does not cut the clean-up short.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, runErr := churn.Run(ctx, cfg)
	if rep == nil {
		fail(runErr)
	}
	table := churn.Table(rep)
	base, err := benchkit.WriteReport(*outDir, "churn-"+rep.Started.Format("20060102T150405Z"), rep, table,
		func(path string) error { return churn.Plot(rep, path) })
	if err != nil {
		fail(err)
	}
	fmt.Print(table)
	fmt.Printf("results: %s.{json,md,png}\n", base)
	if runErr != nil {
		fail(runErr) // the clean-up
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "churn: %v\n", err)
	os.Exit(1)
}
