// Command clusterbench measures Rampart between two nodes (package cluster): pod
// scalability over each tunnel mode, the overlay's cost against native routing and the
// bare fabric, and policy scalability across nodes. It prints a table, and writes a JSON
// report, a markdown table and a PNG plot. Run it as root from the repository:
//
//	bench/run-cluster.sh            # full run, about 45 minutes
//	bench/run-cluster.sh --quick    # smoke run (CI)
//
// See docs/benchmarks.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/cluster"
	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

const cmd benchkit.Cmd = "clusterbench"

func main() {
	// Helpers started inside pods: `clusterbench rr-server|rr-client|probe ...`.
	benchkit.Main(run, benchkit.HelperSubcommands)
}

// ints parses a comma-separated list of numbers, sorted and without repeats.
func ints(s string) ([]int, error) {
	out, err := benchkit.Ints(s)
	slices.Sort(out)
	return slices.Compact(out), err
}

func run() int {
	var (
		quick       = flag.Bool("quick", false, "smoke run for CI: 1 and 2 pairs, tcp and udp-8000, 1 s samples, one round, 1 and 1,000 policies")
		experiments = flag.String("experiments", "", "comma-separated experiments: pods,overlay,policies (default all)")
		modes       = flag.String("modes", "", "tunnel modes (default native,vxlan,ipip; a mode the agent refuses is reported as not available)")
		pairs       = flag.String("pairs", "", "pod scalability: pair counts, the smallest is the reference (default 1,2,5,10,20,40)")
		traffic     = flag.String("traffic", "", "pod scalability: tcp and udp-N, N the datagram payload in bytes (default tcp,udp-1400,udp-8000)")
		udpMbps     = flag.Float64("udp-mbps", 0, "pod scalability: UDP load all pairs together offer, Mbit/s, shared equally (0: every sender as fast as it can)")
		noNoPolicy  = flag.Bool("policy-only", false, "pod scalability: measure with the pairs' allow policy only, not also without policy")
		podRepeats  = flag.Int("pod-repeats", 0, "pod scalability: rounds (default 1)")
		podDuration = flag.Duration("pod-duration", 0, "pod scalability: iperf3 duration, whole seconds (default 5s, quick 1s)")
		repeats     = flag.Int("repeats", 0, "overlay and policies: rounds (default 5, quick 1)")
		duration    = flag.Duration("duration", 0, "overlay and policies: iperf3 duration per sample, whole seconds (default 3s, quick 1s)")
		rrDuration  = flag.Duration("rr-duration", 0, "overlay and policies: request/response duration per sample (default 1s, quick 200ms)")
		policies    = flag.String("policies", "", "policies: policy counts (default 1,10,100,1000,10000)")
		policyMode  = flag.String("policy-tunnel", "", "policies: the cluster's tunnel mode (default vxlan)")
		cpu         = flag.Int("cpu", -2, "overlay and policies: pin the measured processes to this CPU, -1 for none (default: the last CPU)")
		binDir      = flag.String("bin-dir", "", "directory with rampartd, rampart, rampart-cni and rampart-podrunner (default: build them from this checkout into a temporary directory)")
		control     = flag.String("control-plane", cluster.ControlNodes, "the clusters' control plane: nodes (real nodes: kubelet, containerd, kube-proxy, scripts/build-node.sh; up to four clusters live at once), k8s (kube-apiserver, etcd, a pod runner per node) or agent (nodes, pods and policies through each agent's API)")
		k8sBinDir   = flag.String("k8s-bin-dir", "", "directory with etcd and kube-apiserver (default: scripts/build-k8s.sh --dir of this checkout)")
		outDir      = flag.String("out", "bench/results", "directory for the JSON report, markdown table and PNG plot")
		iperf3      = flag.String("iperf3", "iperf3", "iperf3 binary")
		noPlot      = flag.Bool("no-plot", false, "do not write the PNG plot")
		replot      = flag.String("replot", "", "only write the PNG plot and markdown table of this JSON report again (next to it)")
		failOnMiss  = flag.Bool("fail-on-miss", false, "exit 3 if a target is missed")
	)
	flag.Parse()
	if cmd.ExtraArgs() {
		return 2
	}
	if *replot != "" {
		if err := benchkit.ReplotReport(*replot, cluster.Table, cluster.Plot); err != nil {
			return cmd.Fail(err)
		}
		return 0
	}
	cfg := cluster.DefaultConfig()
	if *quick {
		cfg = cluster.QuickConfig()
	}
	if err := apply(&cfg, *experiments, *modes, *pairs, *traffic, *policies, *policyMode); err != nil {
		return cmd.Errorf(2, "%v", err)
	}
	cfg.NoPolicy = !*noNoPolicy
	cfg.UDPRate = *udpMbps * 1e6
	if *podRepeats != 0 {
		cfg.PodRepeats = *podRepeats
	}
	if *repeats != 0 {
		cfg.Repeats = *repeats
	}
	if err := errors.Join(benchkit.WholeSeconds("--pod-duration", *podDuration, &cfg.PodSeconds),
		benchkit.WholeSeconds("--duration", *duration, &cfg.Seconds)); err != nil {
		return cmd.Errorf(2, "%v", err)
	}
	if *rrDuration != 0 {
		cfg.RRDuration = *rrDuration
	}
	if *cpu != -2 {
		cfg.CPU = *cpu
	}
	cfg.OutDir, cfg.Iperf3, cfg.NoPlot, cfg.Log = *outDir, *iperf3, *noPlot, stampWriter{os.Stderr}
	var err error
	if cfg.Self, err = cmd.Self(); err != nil {
		return cmd.Fail(err)
	}

	// Interrupts cancel the run, which then removes what it made.
	ctx, stop := benchkit.InterruptContext()
	defer stop()
	cfg.Control = *control
	dir, cleanup, err := benchkit.AgentBinDir(ctx, *binDir, "./cmd/rampart-cni", "./test/rampart-podrunner")
	if err != nil {
		return cmd.Fail(err)
	}
	defer cleanup()
	cfg.Bin.Rampartd, cfg.Bin.Rampart = benchkit.AgentBins(dir)
	cfg.K8s = cluster.K8sBinaries{BinDir: dir, K8sBinDir: *k8sBinDir}
	if cfg.Control == cluster.ControlK8s && cfg.K8s.K8sBinDir == "" {
		if cfg.K8s.K8sBinDir, err = benchkit.K8sBinDir(ctx); err != nil {
			return cmd.Fail(err)
		}
	}

	// The agents' binaries the real nodes' labs build (clustertest.Bins).
	defer clustertest.Bins.Remove()
	rep, runErr := cluster.Run(ctx, cfg)
	if rep == nil {
		return cmd.Fail(runErr)
	}
	plot := func(path string) error { return cluster.Plot(rep, path) }
	if cfg.NoPlot {
		plot = func(string) error { return nil }
	}
	if err := benchkit.PublishReport(cfg.OutDir, "cluster", rep.Started, rep, cluster.Table(rep), plot, "\nresults: %s.{json,md,png}\n"); err != nil {
		return cmd.Errorf(1, "writing the report: %v", err)
	}
	if runErr != nil || len(rep.Errors) > 0 {
		return cmd.Fail(errors.Join(runErr, errors.New(strings.Join(rep.Errors, "; "))))
	}
	if *failOnMiss && missed(rep) {
		return 3
	}
	return 0
}

func apply(cfg *cluster.Config, experiments, modes, pairs, traffic, policies, policyMode string) error {
	if experiments != "" {
		cfg.Experiments = benchkit.SplitList(experiments)
	}
	if modes != "" {
		cfg.Modes = benchkit.SplitList(modes)
	}
	if pairs != "" {
		p, err := ints(pairs)
		if err != nil {
			return fmt.Errorf("--pairs: %w", err)
		}
		cfg.Pairs = p
	}
	if traffic != "" {
		cfg.Traffic = nil
		for _, s := range benchkit.SplitList(traffic) {
			t, err := cluster.ParseTraffic(s)
			if err != nil {
				return fmt.Errorf("--traffic: %w", err)
			}
			cfg.Traffic = append(cfg.Traffic, t)
		}
	}
	if policies != "" {
		p, err := ints(policies)
		if err != nil {
			return fmt.Errorf("--policies: %w", err)
		}
		cfg.PolicyCounts = p
	}
	if policyMode != "" {
		cfg.PolicyTunnel = policyMode
	}
	return nil
}

// missed says whether any verdict is a MISS or INVALID.
func missed(rep *cluster.Report) bool {
	if rep.Pods != nil {
		for _, s := range rep.Pods.Summary {
			if s.Verdict == cluster.VerdictMiss {
				return true
			}
		}
	}
	if rep.Policies != nil {
		for _, c := range rep.Policies.Cases {
			if c.Summary.Verdict == cluster.VerdictMiss || c.Summary.Verdict == cluster.VerdictInvalid {
				return true
			}
		}
	}
	return false
}

// stampWriter prefixes each progress line with the time of day.
type stampWriter struct{ w io.Writer }

func (s stampWriter) Write(p []byte) (int, error) {
	if _, err := fmt.Fprintf(s.w, "%s %s", time.Now().UTC().Format("15:04:05"), p); err != nil {
		return 0, err
	}
	return len(p), nil
}
