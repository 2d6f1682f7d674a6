// Command coldcost measures what Rampart's tc programs cost a packet at a ping every
// millisecond, for one or more rampartd builds taking turns on one endpoint (see package
// coldcost). bench/run-cold-cost.sh builds the binaries and runs it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/bench/coldcost"
)

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
		if err := redraw(*replot); err != nil {
			fail(err)
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
			fail(fmt.Errorf("--builds: %q is not name=path", b))
		}
		cfg.Builds = append(cfg.Builds, coldcost.Build{Name: name, Rampartd: path})
	}
	if cfg.Rampart == "" {
		fail(fmt.Errorf("--rampart: the CLI is needed"))
	}
	work, err := os.MkdirTemp("", "rp-coldcost-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(work)
	cfg.WorkDir = work

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := coldcost.Run(ctx, cfg)
	if err != nil {
		fail(err)
	}
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		fail(err)
	}
	base := filepath.Join(*outDir, "cold-cost-"+rep.Started.Format("20060102T150405Z"))
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		fail(err)
	}
	table := coldcost.Table(rep)
	if err := os.WriteFile(base+".json", append(js, '\n'), 0o644); err != nil {
		fail(err)
	}
	if err := os.WriteFile(base+".md", []byte(table), 0o644); err != nil {
		fail(err)
	}
	if !*noPlot {
		if err := coldcost.Plot(rep, base+".png"); err != nil {
			fail(err)
		}
	}
	fmt.Print(table)
	fmt.Printf("results: %s.{json,md%s}\n", base, map[bool]string{false: ",png", true: ""}[*noPlot])
}

// redraw writes the plot of the JSON report at path next to it.
func redraw(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep coldcost.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	return coldcost.Plot(&rep, strings.TrimSuffix(path, ".json")+".png")
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "coldcost: %v\n", err)
	os.Exit(1)
}
