// Command tapbench is Rampart's flow tap benchmark: throughput and web request rate with a
// mirror tap to a Suricata monitor against no tap (the FlowTap paper's Tables II and III;
// Table II's four placements of the endpoints and the monitor on up to three nodes),
// redirect through Suricata inline, and the copies lost when the monitor falls behind.
// It writes a JSON report, a markdown table and a PNG plot. Run it as root from the
// repository:
//
//	bench/run-taps.sh            # full run, about eight minutes
//	bench/run-taps.sh --quick    # smoke run, about a minute and a half
//
// See docs/benchmarks.md.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/bench/taps"
)

const cmd benchkit.Cmd = "tapbench"

func main() {
	// Helpers started inside endpoints: `tapbench http-server|probe ...`.
	benchkit.Main(run, benchkit.Subcommands{Names: taps.Subcommands, Run: taps.Subcommand})
}

func run() int {
	var (
		quick      = flag.Bool("quick", false, "smoke run for CI: one round, short runs")
		repeats    = flag.Int("repeats", 0, "rounds (default 5, quick 1); medians over the pairs are reported")
		duration   = flag.Duration("duration", 0, "iperf3 duration per sample, whole seconds (default 2s, quick 1s)")
		webDur     = flag.Duration("web-duration", 0, "fortio duration per sample (default 3s, quick 1s)")
		conns      = flag.Int("connections", 0, "fortio connections of the maximum-rate runs (default 8)")
		qps        = flag.Float64("latency-qps", 0, "fortio rate of the latency runs (default 1000)")
		slowRules  = flag.Int("slow-rules", 0, "rules of the slowed monitor (default 30)")
		binDir     = flag.String("bin-dir", "", "directory with rampartd and rampart (default: build them into a temporary directory)")
		outDir     = flag.String("out", "bench/results", "directory for the JSON report, markdown table and PNG plot")
		iperf3     = flag.String("iperf3", "iperf3", "iperf3 binary")
		fortio     = flag.String("fortio", "fortio", "fortio binary")
		suricata   = flag.String("suricata", "", "suricata binary (default: on PATH)")
		cpu        = flag.Int("cpu", -2, "pin iperf3, fortio and the web server to this CPU, -1 for no pinning (default: the last CPU); Suricata runs on the others")
		noPlot     = flag.Bool("no-plot", false, "do not write the PNG plot")
		failOnMiss = flag.Bool("fail-on-miss", false, "exit 3 if a case misses its target")
		replot     = flag.String("replot", "", "draw the plot of a saved JSON report next to it, and exit")
	)
	flag.Parse()
	if cmd.ExtraArgs() {
		return 2
	}
	if *replot != "" {
		var res taps.Result
		if err := benchkit.Replot(*replot, &res, func(path string) error { return taps.WritePlot(&res, path) }); err != nil {
			return cmd.Fail(err)
		}
		return 0
	}
	cfg := taps.DefaultConfig()
	if *quick {
		cfg = taps.QuickConfig()
	}
	if *repeats != 0 {
		cfg.Repeats = *repeats
	}
	if err := benchkit.WholeSeconds("--duration", *duration, &cfg.IperfSeconds); err != nil {
		return cmd.Errorf(2, "%v", err)
	}
	if *webDur != 0 {
		cfg.WebDuration = *webDur
	}
	if *conns != 0 {
		cfg.WebConnections = *conns
	}
	if *qps != 0 {
		cfg.LatencyQPS = *qps
	}
	if *slowRules != 0 {
		cfg.SlowRules = *slowRules
	}
	if *cpu != -2 {
		cfg.CPU = *cpu
	}
	cfg.OutDir, cfg.NoPlot, cfg.Iperf3, cfg.Fortio, cfg.Suricata = *outDir, *noPlot, *iperf3, *fortio, *suricata
	cfg.Log = os.Stderr
	var err error
	if cfg.Self, err = cmd.Self(); err != nil {
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

	res, err := taps.Run(ctx, cfg)
	if res != nil {
		fmt.Println()
		fmt.Print(res.Table())
		benchkit.PrintOutputs(res.JSONPath, "", res.PlotPath)
	}
	if err != nil {
		return cmd.Fail(err)
	}
	return taps.ExitCode(res, *failOnMiss)
}
