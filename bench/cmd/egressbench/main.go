// Command egressbench is Rampart's egress filtering benchmark: a client behind filters of
// 10 to 10M IPv4 prefixes (none, iptables, ipset, nftables, a tc-eBPF LPM trie, Rampart;
// with --ipv6, 10 to 1M IPv6 prefixes, all over IPv6) sends to a server; it prints TCP and UDP throughput, CPU at 1 Gbit/s, ping and TCP
// request/response latency and set-up time of each filter at each size, as ratios to no
// filter, with PASS/MISS against the targets, and writes JSON, markdown and PNG.
// Run it as root from the repository:
//
//	bench/run-egress.sh            # full run, about an hour
//	bench/run-egress.sh --quick    # smoke run, about two minutes
//	bench/run-egress.sh --ipv6     # every filter over IPv6, 10 to 1M prefixes
//	egressbench report [--plot FILE.png] bench/results/egress-TIME.json
//
// See docs/benchmarks.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/egress"
	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

const cmd benchkit.Cmd = "egressbench"

func main() {
	// Helpers started inside the namespaces (`egressbench rr-server|rr-client|probe ...`),
	// and `egressbench report FILE.json`, which prints a saved report's table.
	benchkit.Main(run, benchkit.Subcommands{Names: egress.Subcommands, Run: egress.Subcommand})
}

func run() int {
	def := egress.DefaultConfig()
	var (
		quick      = flag.Bool("quick", false, "smoke run: counts 10 and 1000, one pair, 1 s runs (CI)")
		counts     = flag.String("counts", "", "comma-separated list sizes, ascending; k and M suffixes allowed (default 10,100,1k,10k,100k,1M,10M; with --ipv6 10,1k,100k,1M; quick 10,1k)")
		ipv6       = flag.Bool("ipv6", false, "run every filter over IPv6: dual-stack topologies, lists of IPv6 prefixes, traffic to the IPv6 addresses, against a no-filter baseline over IPv6")
		filters    = flag.String("filters", "", "comma-separated filters besides the baseline (default all): "+strings.Join(egress.FilterNames[1:], ",")+"; also "+egress.FilterEmptyTCX+" (empty programs at Rampart's hooks) and "+egress.FilterAgentEmpty+" (Rampart's agent and topology, its programs swapped for empty ones), not in the default")
		repeats    = flag.Int("repeats", 0, "pairs (filter and baseline back to back) per filter and count (default 3, quick 1)")
		blocks     = flag.Int("blocks", 0, "short runs per side that each metric of a pair is split into, alternating sides (default 3, quick 1)")
		tcpDur     = flag.Duration("tcp-duration", 0, "iperf3 TCP run, whole seconds (default 3s, quick 1s)")
		udpDur     = flag.Duration("udp-duration", 0, "iperf3 UDP run at unlimited rate (default 3s, quick 1s)")
		cpuDur     = flag.Duration("cpu-duration", 0, "iperf3 UDP run at the fixed rate (default 3s, quick 1s)")
		rrDur      = flag.Duration("rr-duration", 0, "request/response run (default 2s, quick 500ms)")
		cpuRate    = flag.String("cpu-rate", def.CPURate, "iperf3 -b of the CPU run")
		pingCount  = flag.Int("ping-count", 0, "pings per side and pair, at the ping interval (default 2000, quick 200)")
		pingBlock  = flag.Int("ping-block", 0, "most pings per block of the latency run, whose blocks alternate sides (default 100, quick 200)")
		pingIntvl  = flag.Duration("ping-interval", def.PingInterval, "ping interval (under 2ms needs root)")
		probeIntvl = flag.Duration("probe-interval", def.ProbeInterval, "spacing of the set-up time probes (its resolution)")
		budget     = flag.Duration("budget", 0, "time one filter may take at one count; predicted longer: skipped (default 10m, quick 3m)")
		memLimit   = flag.String("mem-limit", "", "memory one filter may be predicted to need at one count, e.g. 12G (default 60% of MemAvailable)")
		seed       = flag.Uint64("seed", def.Seed, "seed of the prefix lists")
		iptables   = flag.String("iptables", def.Iptables, "iptables backend of the iptables and ipset peers: legacy or nft")
		clientCPUs = flag.String("client-cpus", benchkit.CPUFlag(def.ClientCPUs), "CPUs of iperf3, ping and the request/response client, or none")
		serverCPUs = flag.String("server-cpus", benchkit.CPUFlag(def.ServerCPUs), "CPUs of the iperf3 and request/response servers, or none")
		agentFlags = flag.String("agent-flags", "", "extra rampartd flags of the rampart filter's agent, space-separated (e.g. --attach=tcx)")
		binDir     = flag.String("bin-dir", "", "directory with rampartd and rampart (default: build them from this module into a temporary directory)")
		outDir     = flag.String("out", def.OutDir, "directory for the JSON report, markdown table and PNG plot")
		noPlot     = flag.Bool("no-plot", false, "do not write the PNG plot")
		failOnMiss = flag.Bool("fail-on-miss", false, "exit 3 if a target is missed")
	)
	flag.Parse()
	if cmd.ExtraArgs() {
		return 2
	}
	cfg := def
	if *quick {
		cfg = egress.QuickConfig()
	} else if *ipv6 {
		cfg.Counts = slices.Clone(egress.DefaultCounts6)
	}
	cfg.IPv6 = *ipv6
	if *counts != "" {
		var err error
		if cfg.Counts, err = parseCounts(*counts); err != nil {
			return cmd.Errorf(2, "%v", err)
		}
	}
	cfg.Filters = benchkit.SplitList(*filters)
	cfg.AgentFlags = strings.Fields(*agentFlags)
	if *blocks != 0 {
		cfg.Blocks = *blocks
	}
	if *repeats != 0 {
		cfg.Repeats = *repeats
	}
	for _, d := range []struct {
		flag time.Duration
		dst  *time.Duration
	}{{*tcpDur, &cfg.TCPDuration}, {*udpDur, &cfg.UDPDuration}, {*cpuDur, &cfg.CPUDuration}, {*rrDur, &cfg.RRDuration}, {*budget, &cfg.Budget}} {
		if d.flag != 0 {
			*d.dst = d.flag
		}
	}
	if *pingBlock != 0 {
		cfg.PingBlock = *pingBlock
	}
	if *pingCount != 0 {
		cfg.PingCount = *pingCount
	}
	if *memLimit != "" {
		v, err := parseSize(*memLimit)
		if err != nil {
			return cmd.Errorf(2, "--mem-limit: %v", err)
		}
		cfg.MemLimit = v
	}
	cfg.CPURate, cfg.PingInterval, cfg.ProbeInterval, cfg.Seed, cfg.Iptables = *cpuRate, *pingIntvl, *probeIntvl, *seed, *iptables
	cfg.ClientCPUs, cfg.ServerCPUs = benchkit.CPUArg(*clientCPUs), benchkit.CPUArg(*serverCPUs)
	cfg.OutDir, cfg.NoPlot = *outDir, *noPlot
	cfg.Log = os.Stderr

	var err error
	if cfg.Self, err = cmd.Self(); err != nil {
		return cmd.Fail(err)
	}

	ctx, stop := benchkit.InterruptContext()
	defer stop()
	if len(cfg.Filters) == 0 || slices.Contains(cfg.Filters, egress.FilterRampart) {
		dir, cleanup, err := benchkit.AgentBinDir(ctx, *binDir)
		if err != nil {
			return cmd.Fail(err)
		}
		defer cleanup()
		cfg.Rampartd, cfg.Rampart = benchkit.AgentBins(dir)
	}

	res, err := egress.Run(ctx, cfg)
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
	for _, c := range res.Counts {
		for _, f := range c.Filters {
			invalid = invalid || f.Status == egress.StatusInvalid
		}
	}
	for _, t := range res.Targets {
		missed = missed || t.Verdict == egress.VerdictMiss
	}
	return benchkit.ExitCode(invalid, res.Errors, missed, *failOnMiss)
}

// parseCounts parses "10,100,1k,1M".
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range benchkit.SplitList(s) {
		f, mult := benchkit.CutUnit(f, map[string]float64{"k": 1000, "M": 1_000_000})
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("count %q: want a positive number with an optional k or M", f)
		}
		out = append(out, n*int(mult))
	}
	if len(out) == 0 {
		return nil, errors.New("no counts")
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// parseSize parses a byte count with an optional K, M or G suffix (powers of 1024).
func parseSize(s string) (int64, error) {
	s, mult := benchkit.CutUnit(s, map[string]float64{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30})
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("size %q: want a positive number with an optional K, M or G", s)
	}
	return int64(v * mult), nil
}
