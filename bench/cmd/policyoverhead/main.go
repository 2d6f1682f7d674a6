package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/bench/policyoverhead"
)

const cmd benchkit.Cmd = "policyoverhead"

func main() {
	// Helpers started inside endpoints: `policyoverhead rr-server|rr-client|probe ...`.
	benchkit.Main(run, benchkit.Subcommands{Names: policyoverhead.Subcommands, Run: policyoverhead.Subcommand})
}

func run() int {
	var (
		quick      = flag.Bool("quick", false, "smoke run for CI: one round")
		repeats    = flag.Int("repeats", 0, "rounds: each case once per round, paired with a baseline sample; medians are reported (default 7, quick 1)")
		duration   = flag.Duration("duration", 0, "iperf3 duration per sample, whole seconds (default 1s)")
		rrDuration = flag.Duration("rr-duration", 0, "request/response duration per sample (default 500ms)")
		rules      = flag.String("rules", "1000,10000", "rule counts of the \"last rule matches\" cases")
		cases      = flag.String("cases", "", "comma-separated cases to run (default all; no-agent always runs): no-agent,control,no-policy,allow-all,l3,l4,observed-l4,rules-N")
		reqSize    = flag.Int("request", 1, "request/response: request size in bytes")
		respSize   = flag.Int("response", 1, "request/response: response size in bytes")
		binDir     = flag.String("bin-dir", "", "directory with rampartd and rampart (default: build them from this module into a temporary directory)")
		outDir     = flag.String("out", "bench/results", "directory for the JSON report and PNG plot")
		iperf3     = flag.String("iperf3", "iperf3", "iperf3 binary")
		cpu        = flag.Int("cpu", -2, "pin iperf3 and the request/response client and server to this CPU, -1 for no pinning (default: the last CPU)")
		noPlot     = flag.Bool("no-plot", false, "do not write the PNG plot")
		failOnMiss = flag.Bool("fail-on-miss", false, "exit 3 if a case misses the throughput target")
		ipv6       = flag.Bool("ipv6", false, "run every case over IPv6: dual-stack topologies, traffic to the server's IPv6 address")
		hubble     = flag.String("hubble", "", "the hubble CLI, which then reads the observed-l4 case's agent over Hubble's flow API too (bench/run-policy-overhead.sh passes the one scripts/build-hubble.sh built)")
	)
	flag.Parse()
	if cmd.ExtraArgs() {
		return 2
	}
	cfg := policyoverhead.DefaultConfig()
	if *quick {
		cfg = policyoverhead.QuickConfig()
	}
	if *repeats != 0 {
		cfg.Repeats = *repeats
	}
	if err := benchkit.WholeSeconds("--duration", *duration, &cfg.IperfSeconds); err != nil {
		return cmd.Errorf(2, "%v", err)
	}
	if *rrDuration != 0 {
		cfg.RRDuration = *rrDuration
	}
	var err error
	if cfg.RuleCounts, err = benchkit.Ints(*rules); err != nil {
		return cmd.Errorf(2, "--rules: %v", err)
	}
	cfg.Cases = benchkit.SplitList(*cases)
	cfg.RRRequestBytes, cfg.RRResponseBytes = *reqSize, *respSize
	cfg.OutDir, cfg.Iperf3, cfg.NoPlot, cfg.IPv6, cfg.Hubble = *outDir, *iperf3, *noPlot, *ipv6, *hubble
	if *cpu != -2 {
		cfg.CPU = *cpu
	}
	cfg.Log = os.Stderr

	if cfg.Self, err = cmd.Self(); err != nil {
		return cmd.Fail(err)
	}

	ctx, stop := benchkit.InterruptContext()
	defer stop()
	if *binDir == "" && !(len(cfg.Cases) == 1 && cfg.Cases[0] == policyoverhead.CaseNoAgent) {
		dir, cleanup, err := benchkit.AgentBinDir(ctx, *binDir)
		if err != nil {
			return cmd.Fail(err)
		}
		defer cleanup()
		*binDir = dir
	}
	if *binDir != "" {
		cfg.Rampartd, cfg.Rampart = benchkit.AgentBins(*binDir)
	}

	res, err := policyoverhead.Run(ctx, cfg)
	if res != nil {
		fmt.Println()
		res.PrintTable(os.Stdout)
		benchkit.PrintOutputs(res.JSONPath, "", res.PlotPath)
	}
	if err != nil {
		return cmd.Fail(err)
	}
	invalid, missed := false, false
	for _, c := range res.Cases {
		invalid = invalid || c.Summary.Verdict == policyoverhead.VerdictInvalid
		missed = missed || c.Summary.Verdict == policyoverhead.VerdictMiss
	}
	return benchkit.ExitCode(invalid, res.Errors, missed, *failOnMiss)
}
