// Command dnsbench measures DNS-aware egress: DNS query latency and rate through the
// agent's DNS proxy against direct, and the time from a new name's answer to its address
// being open (see package dns and docs/benchmarks.md). bench/run-dns.sh builds the
// binaries and runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/rampartnet/rampart/bench/dns"
	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

const cmd benchkit.Cmd = "dnsbench"

func main() {
	// Helpers started inside the namespaces: `dnsbench serve-dns|serve-world|client|probe ...`.
	benchkit.Main(run, benchkit.Subcommands{Names: dns.Subcommands, Run: dns.Subcommand}, benchkit.HelperSubcommands)
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
		if err := benchkit.ReplotReport(*replot, dns.Table, dns.Plot); err != nil {
			return cmd.Fail(err)
		}
		return 0
	}
	self, err := cmd.Self()
	if err != nil {
		return cmd.Fail(err)
	}
	cfg := dns.Config{
		Rounds: *rounds, Queries: *queries, Warmup: 100, Workers: *workers, Duration: *duration,
		LearnRounds: *learnRounds, NamesPerBlock: *perBlock, ManyLearnt: *many,
		Self: self, ClientCPU: *clientCPU, ServerCPU: *serverCPU, Prefix: *prefix,
		Log: cmd.Logf,
	}
	if *quick {
		cfg.Rounds, cfg.Queries, cfg.Warmup, cfg.Duration = 1, 200, 20, 300*time.Millisecond
		cfg.LearnRounds, cfg.NamesPerBlock, cfg.ManyLearnt = 1, 30, 100
	}
	if cfg.Rounds < 1 || cfg.Queries < 1 || cfg.Workers < 1 || cfg.LearnRounds < 1 || cfg.NamesPerBlock < 1 {
		return cmd.Fail(fmt.Errorf("--rounds, --queries, --workers, --learn-rounds and --names must be positive"))
	}
	ctx, stop := benchkit.InterruptContext()
	defer stop()
	dir, cleanupBin, err := benchkit.AgentBinDir(ctx, *binDir)
	if err != nil {
		return cmd.Fail(err)
	}
	defer cleanupBin()
	cfg.Rampartd, cfg.Rampart = benchkit.AgentBins(dir)
	if cfg.WorkDir, err = os.MkdirTemp("", "rp-dnsbench-"); err != nil {
		return cmd.Fail(err)
	}
	defer os.RemoveAll(cfg.WorkDir)
	rep, err := dns.Run(ctx, cfg)
	if err != nil {
		return cmd.Fail(err)
	}
	if err := benchkit.PublishReport(*outDir, "dns", rep.Started, rep, dns.Table(rep),
		func(path string) error { return dns.Plot(rep, path) }, "\nwrote %s.{json,md,png}\n"); err != nil {
		return cmd.Fail(err)
	}
	return 0
}
