// Command svcbench measures Rampart's socket-level Service translation against kube-proxy
// in nftables mode and against no Service (see package services and docs/benchmarks.md).
// bench/run-services.sh builds the binaries and runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/bench/services"
)

const cmd benchkit.Cmd = "svcbench"

func main() {
	// Helpers started inside the namespaces: `svcbench serve|client ...`.
	benchkit.Main(run, benchkit.Subcommands{Names: services.Subcommands, Run: services.Subcommand})
}

func run() int {
	var (
		quick     = flag.Bool("quick", false, "smoke run for CI: 1 and 20 Services, one round, short samples")
		counts    = flag.String("counts", "1,10000", "comma-separated Service counts")
		rounds    = flag.Int("rounds", 5, "pairs per case and count")
		connects  = flag.Int("connects", 2000, "connects per connect-latency sample")
		duration  = flag.Duration("duration", 2*time.Second, "length of a request-rate sample")
		workers   = flag.Int("workers", 4, "concurrent connections of a request-rate sample")
		spread    = flag.Int("spread", 1000, "how many Services a sample's connections cycle over")
		binDir    = flag.String("bin-dir", "", "directory with rampartd and rampart of this checkout")
		k8sBinDir = flag.String("k8s-bin-dir", "", "directory with etcd and kube-apiserver (scripts/build-k8s.sh --dir)")
		kubeProxy = flag.String("kube-proxy", "", "kube-proxy binary (in scripts/build-node.sh --dir)")
		clientCPU = flag.String("client-cpu", "0", "CPU list for the measuring client (empty: unpinned)")
		serverCPU = flag.String("server-cpu", "1", "CPU list for the backend's server (empty: unpinned)")
		outDir    = flag.String("out", "bench/results", "directory for the JSON report, markdown table and PNG plot")
		prefix    = flag.String("prefix", "", "name of the run's namespaces, cgroups and agent instance (default: svb and a random suffix)")
		replot    = flag.String("replot", "", "write the plot and table of a saved JSON report next to it, and exit")
	)
	flag.Parse()
	if *replot != "" {
		if err := benchkit.ReplotReport(*replot, services.Table, services.Plot); err != nil {
			return cmd.Fail(err)
		}
		return 0
	}
	self, err := cmd.Self()
	if err != nil {
		return cmd.Fail(err)
	}
	cfg := services.Config{
		Rounds: *rounds, Connects: *connects, Duration: *duration, Workers: *workers, Spread: *spread, Checked: 100,
		Self: self, K8sBinDir: *k8sBinDir, KubeProxy: *kubeProxy,
		ClientCPU: *clientCPU, ServerCPU: *serverCPU, Prefix: *prefix,
		Log: cmd.Logf,
	}
	cfg.Rampartd, cfg.Rampart = benchkit.AgentBins(*binDir)
	for _, c := range benchkit.SplitList(*counts) {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return cmd.Fail(fmt.Errorf("--counts: %q is not a positive number", c))
		}
		cfg.Counts = append(cfg.Counts, n)
	}
	if *quick {
		cfg.Counts, cfg.Rounds, cfg.Connects, cfg.Duration, cfg.Checked = []int{1, 20}, 1, 200, 300*time.Millisecond, 20
	}
	if *binDir == "" || *k8sBinDir == "" || *kubeProxy == "" {
		return cmd.Fail(fmt.Errorf("--bin-dir, --k8s-bin-dir and --kube-proxy are needed (bench/run-services.sh finds them)"))
	}
	if cfg.WorkDir, err = os.MkdirTemp("", "rp-svcbench-"); err != nil {
		return cmd.Fail(err)
	}
	defer os.RemoveAll(cfg.WorkDir)
	ctx, stop := benchkit.InterruptContext()
	defer stop()
	rep, err := services.Run(ctx, cfg)
	if err != nil {
		return cmd.Fail(err)
	}
	if err := benchkit.PublishReport(*outDir, "services", rep.Started, rep, services.Table(rep),
		func(path string) error { return services.Plot(rep, path) }, "\nwrote %s.{json,md,png}\n"); err != nil {
		return cmd.Fail(err)
	}
	return 0
}
