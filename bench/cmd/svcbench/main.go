// Command svcbench measures Rampart's socket-level Service translation against kube-proxy
// in nftables mode and against no Service (see package services and docs/benchmarks.md).
// bench/run-services.sh builds the binaries and runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/bench/services"
)

func main() {
	// Helpers started inside the namespaces: `svcbench serve|client ...`.
	if len(os.Args) > 1 && slices.Contains(services.Subcommands, os.Args[1]) {
		os.Exit(services.Subcommand(os.Args[1], os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(run())
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
		var rep services.Report
		if err := benchkit.Replot(*replot, &rep, func(path string) error {
			if err := os.WriteFile(strings.TrimSuffix(path, ".png")+".md", []byte(services.Table(&rep)), 0o644); err != nil {
				return err
			}
			return services.Plot(&rep, path)
		}); err != nil {
			return fail(err)
		}
		return 0
	}
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	cfg := services.Config{
		Rounds: *rounds, Connects: *connects, Duration: *duration, Workers: *workers, Spread: *spread, Checked: 100,
		Self: self, K8sBinDir: *k8sBinDir, KubeProxy: *kubeProxy,
		Rampartd: filepath.Join(*binDir, "rampartd"), Rampart: filepath.Join(*binDir, "rampart"),
		ClientCPU: *clientCPU, ServerCPU: *serverCPU, Prefix: *prefix,
		Log: func(f string, a ...any) {
			fmt.Fprintf(os.Stderr, "%s svcbench: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(f, a...))
		},
	}
	for _, c := range benchkit.SplitList(*counts) {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return fail(fmt.Errorf("--counts: %q is not a positive number", c))
		}
		cfg.Counts = append(cfg.Counts, n)
	}
	if *quick {
		cfg.Counts, cfg.Rounds, cfg.Connects, cfg.Duration, cfg.Checked = []int{1, 20}, 1, 200, 300*time.Millisecond, 20
	}
	if *binDir == "" || *k8sBinDir == "" || *kubeProxy == "" {
		return fail(fmt.Errorf("--bin-dir, --k8s-bin-dir and --kube-proxy are needed (bench/run-services.sh finds them)"))
	}
	if cfg.WorkDir, err = os.MkdirTemp("", "rp-svcbench-"); err != nil {
		return fail(err)
	}
	defer os.RemoveAll(cfg.WorkDir)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := services.Run(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	table := services.Table(rep)
	base, err := benchkit.WriteReport(*outDir, "services-"+rep.Started.Format("20060102T150405Z"), rep, table,
		func(path string) error { return services.Plot(rep, path) })
	if err != nil {
		return fail(err)
	}
	fmt.Print(table)
	fmt.Printf("\nwrote %s.{json,md,png}\n", base)
	return 0
}

func fail(err error) int {
	fmt.Fprintf(os.Stderr, "svcbench: %v\n", err)
	return 1
}
