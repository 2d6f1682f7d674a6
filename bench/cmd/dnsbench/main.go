// Command dnsbench measures DNS-aware egress: DNS query latency and rate through the
// agent's DNS proxy against direct, and the time from a new name's answer to its address
// being open (see package dns and docs/benchmarks.md). bench/run-dns.sh builds the
// binaries and runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/bench/dns"
	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

func main() {
	// Helpers started inside the namespaces: `dnsbench serve-dns|serve-world|client|probe ...`.
	if len(os.Args) > 1 && slices.Contains(dns.Subcommands, os.Args[1]) {
		os.Exit(dns.Subcommand(os.Args[1], os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && slices.Contains(benchkit.Helpers, os.Args[1]) {
		os.Exit(benchkit.Helper(os.Args[1], os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(run())
}

func run() int {
	var (
		quick       = flag.Bool("quick", false, "smoke run for CI: one round, short samples, few names")
		rounds      = flag.Int("rounds", 7, "rounds of the query latency and rate cases")
		queries     = flag.Int("queries", 2000, "sequential queries per latency sample")
		workers     = flag.Int("workers", 8, "concurrent clients of a rate sample")
		duration    = flag.Duration("duration", 3*time.Second, "length of a rate sample")
		learnRounds = flag.Int("learn-rounds", 5, "rounds of new names per stage (toFQDNs and toCIDR each)")
		perBlock    = flag.Int("names", 100, "new names per policy and round")
		many        = flag.Int("many", 2000, "learnt addresses the second stage of new names starts from")
		binDir      = flag.String("bin-dir", "", "directory with rampartd and rampart of this checkout (default: build them)")
		clientCPU   = flag.String("client-cpu", "0", "CPU list for the measuring client (empty: unpinned)")
		serverCPU   = flag.String("server-cpu", "1", "CPU list for the DNS server (empty: unpinned)")
		outDir      = flag.String("out", "bench/results", "directory for the JSON report, markdown table and PNG plot")
		prefix      = flag.String("prefix", "", "name of the run's agent instance and namespaces (default: dnb and a random suffix)")
		replot      = flag.String("replot", "", "write the plot and table of a saved JSON report next to it, and exit")
	)
	flag.Parse()
	if *replot != "" {
		var rep dns.Report
		if err := benchkit.Replot(*replot, &rep, func(path string) error {
			if err := os.WriteFile(strings.TrimSuffix(path, ".png")+".md", []byte(dns.Table(&rep)), 0o644); err != nil {
				return err
			}
			return dns.Plot(&rep, path)
		}); err != nil {
			return fail(err)
		}
		return 0
	}
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	cfg := dns.Config{
		Rounds: *rounds, Queries: *queries, Warmup: 100, Workers: *workers, Duration: *duration,
		LearnRounds: *learnRounds, NamesPerBlock: *perBlock, ManyLearnt: *many,
		Self: self, ClientCPU: *clientCPU, ServerCPU: *serverCPU, Prefix: *prefix,
		Log: func(f string, a ...any) {
			fmt.Fprintf(os.Stderr, "%s dnsbench: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(f, a...))
		},
	}
	if *quick {
		cfg.Rounds, cfg.Queries, cfg.Warmup, cfg.Duration = 1, 200, 20, 300*time.Millisecond
		cfg.LearnRounds, cfg.NamesPerBlock, cfg.ManyLearnt = 1, 30, 100
	}
	if cfg.Rounds < 1 || cfg.Queries < 1 || cfg.Workers < 1 || cfg.LearnRounds < 1 || cfg.NamesPerBlock < 1 {
		return fail(fmt.Errorf("--rounds, --queries, --workers, --learn-rounds and --names must be positive"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, cleanupBin, err := benchkit.AgentBinDir(ctx, *binDir)
	if err != nil {
		return fail(err)
	}
	defer cleanupBin()
	cfg.Rampartd, cfg.Rampart = filepath.Join(dir, "rampartd"), filepath.Join(dir, "rampart")
	if cfg.WorkDir, err = os.MkdirTemp("", "rp-dnsbench-"); err != nil {
		return fail(err)
	}
	defer os.RemoveAll(cfg.WorkDir)
	rep, err := dns.Run(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	table := dns.Table(rep)
	base, err := benchkit.WriteReport(*outDir, "dns-"+rep.Started.Format("20060102T150405Z"), rep, table,
		func(path string) error { return dns.Plot(rep, path) })
	if err != nil {
		return fail(err)
	}
	fmt.Print(table)
	fmt.Printf("\nwrote %s.{json,md,png}\n", base)
	return 0
}

func fail(err error) int {
	fmt.Fprintf(os.Stderr, "dnsbench: %v\n", err)
	return 1
}
