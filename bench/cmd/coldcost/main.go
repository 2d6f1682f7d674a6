// Command coldcost measures what Rampart's tc programs cost a packet at a ping every
// millisecond, for one or more rampartd builds taking turns on one endpoint (see package
// coldcost). bench/run-cold-cost.sh builds the binaries and runs it.
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/coldcost"
	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

const cmd benchkit.Cmd = "coldcost"

func main() {
	var (
		builds    = flag.String("builds", "", "comma-separated name=path of rampartd binaries to compare")
		rampart   = flag.String("rampart", "", "the rampart CLI")
		rounds    = flag.Int("rounds", 8, "rounds; each build is measured once per round")
		pings     = flag.Int("pings", 2000, "pings per measurement")
		interval  = flag.Duration("interval", time.Millisecond, "ping interval (under 2ms needs root)")
		clientCPU = flag.Int("client-cpu", 0, "CPU the ping runs on")
		outDir    = flag.String("out", "bench/results", "directory for the JSON report, markdown table and PNG plot")
		noPlot    = flag.Bool("no-plot", false, "do not write the PNG plot")
		replot    = flag.String("replot", "", "only draw the PNG plot of this JSON report again (next to it)")
	)
	flag.Parse()
	if *replot != "" {
		var rep coldcost.Report
		if err := benchkit.Replot(*replot, &rep, func(path string) error { return coldcost.Plot(&rep, path) }); err != nil {
			cmd.Exit(err)
		}
		return
	}
	cfg := coldcost.Config{
		Rampart: *rampart, Rounds: *rounds, Pings: *pings, Interval: *interval, ClientCPU: *clientCPU,
		Instance: fmt.Sprintf("cc%d", os.Getpid()%100000), PodCIDR: netip.MustParsePrefix("198.18.230.0/24"),
		Log: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
	}
	for _, b := range strings.Split(*builds, ",") {
		name, path, ok := strings.Cut(b, "=")
		if !ok || name == "" || path == "" {
			cmd.Exit(fmt.Errorf("--builds: %q is not name=path", b))
		}
		cfg.Builds = append(cfg.Builds, coldcost.Build{Name: name, Rampartd: path})
	}
	if cfg.Rampart == "" {
		cmd.Exit(fmt.Errorf("--rampart: the CLI is needed"))
	}
	work, err := os.MkdirTemp("", "rp-coldcost-")
	if err != nil {
		cmd.Exit(err)
	}
	defer os.RemoveAll(work)
	cfg.WorkDir = work

	ctx, stop := benchkit.InterruptContext()
	defer stop()
	rep, err := coldcost.Run(ctx, cfg)
	if err != nil {
		cmd.Exit(err)
	}
	plot := func(path string) error { return coldcost.Plot(rep, path) }
	if *noPlot {
		plot = func(string) error { return nil }
	}
	done := map[bool]string{false: "results: %s.{json,md,png}\n", true: "results: %s.{json,md}\n"}[*noPlot]
	if err := benchkit.PublishReport(*outDir, "cold-cost", rep.Started, rep, coldcost.Table(rep), plot, done); err != nil {
		cmd.Exit(err)
	}
}
