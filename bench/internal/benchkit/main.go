package benchkit

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// What the benchmark commands under bench/cmd share in their main: helper subcommands,
// messages prefixed with the command's name and their exit codes, re-drawing a saved
// report, and writing and printing a report.

// Subcommands are helper subcommands a benchmark's binary runs inside its endpoints
// (`egressbench rr-server ...`): their names and what runs one, returning the exit code.
type Subcommands struct {
	Names []string
	Run   func(name string, args []string, stdout, stderr io.Writer) int
}

// HelperSubcommands are Helpers, the request/response server and client and the probe.
var HelperSubcommands = Subcommands{Helpers, Helper}

// Main runs a benchmark command and exits with the code it returns: the subcommand of subs
// that the first argument names, or else run.
func Main(run func() int, subs ...Subcommands) {
	if len(os.Args) > 1 {
		for _, s := range subs {
			if slices.Contains(s.Names, os.Args[1]) {
				os.Exit(s.Run(os.Args[1], os.Args[2:], os.Stdout, os.Stderr))
			}
		}
	}
	os.Exit(run())
}

// Cmd is a benchmark command by its name, which prefixes its messages on stderr.
type Cmd string

// Errorf prints a message and returns code, the command's exit code for it: 1 for a
// failed run, 2 for a wrong call.
func (c Cmd) Errorf(code int, format string, a ...any) int {
	fmt.Fprintf(os.Stderr, "%s: %s\n", c, fmt.Sprintf(format, a...))
	return code
}

// Fail prints err and returns 1, the exit code of a failed run.
func (c Cmd) Fail(err error) int { return c.Errorf(1, "%v", err) }

// Exit prints err and exits 1.
func (c Cmd) Exit(err error) { os.Exit(c.Fail(err)) }

// Logf prints a progress line on stderr, after the time of day and the command's name.
func (c Cmd) Logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s %s: %s\n", time.Now().UTC().Format("15:04:05"), c, fmt.Sprintf(format, a...))
}

// ExtraArgs says whether arguments are left after the flags, printing them if so.
func (c Cmd) ExtraArgs() bool {
	if flag.NArg() > 0 {
		c.Errorf(2, "unexpected arguments %v", flag.Args())
		return true
	}
	return false
}

// Self returns the path of the command's own binary, which it starts its helpers from.
func (c Cmd) Self() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding own binary: %w", err)
	}
	return self, nil
}

// WholeSeconds stores flag d, an iperf3 duration, in *dst as seconds unless it is zero
// (the default stays); a fraction of a second is an error, as iperf3 -t takes none.
func WholeSeconds(name string, d time.Duration, dst *int) error {
	if d == 0 {
		return nil
	}
	if d%time.Second != 0 {
		return fmt.Errorf("%s must be whole seconds (iperf3 -t)", name)
	}
	*dst = int(d / time.Second)
	return nil
}

// ReplotTable is Replot for a report with a markdown table: after reading the report it
// writes the table that table returns next to the plot, as <report>.md.
func ReplotTable(path string, report any, table func() string, plot func(path string) error) error {
	return Replot(path, report, func(png string) error {
		if err := os.WriteFile(strings.TrimSuffix(png, ".png")+".md", []byte(table()), 0o644); err != nil {
			return err
		}
		return plot(png)
	})
}

// ReplotReport is ReplotTable for a report of type R, its table and plot drawn by table
// and plot.
func ReplotReport[R any](path string, table func(*R) string, plot func(*R, string) error) error {
	var rep R
	return ReplotTable(path, &rep, func() string { return table(&rep) }, func(png string) error { return plot(&rep, png) })
}

// AgentBins are the paths of rampartd and rampart in dir.
func AgentBins(dir string) (rampartd, rampart string) {
	return filepath.Join(dir, "rampartd"), filepath.Join(dir, "rampart")
}

// PublishReport writes a run's report as <dir>/<name>-<started>.{json,md,png} (WriteReport),
// then prints its table and the line done, a format given the path without extension.
func PublishReport(dir, name string, started time.Time, report any, table string, plot func(path string) error, done string) error {
	base, err := WriteReport(dir, name+"-"+started.Format("20060102T150405Z"), report, table, plot)
	if err != nil {
		return err
	}
	fmt.Print(table)
	fmt.Printf(done, base)
	return nil
}

// ExitCode is a benchmark command's exit code for a finished run: 1 if a case was invalid
// or the run had errors, else 3 if a target was missed and failOnMiss, else 0.
func ExitCode(invalid bool, errs []string, missed, failOnMiss bool) int {
	switch {
	case invalid || len(errs) > 0:
		return 1
	case missed && failOnMiss:
		return 3
	}
	return 0
}

// PrintOutputs prints the paths of what a run wrote, the report, its markdown table and its
// plot, one line each, leaving out those it did not write ("").
func PrintOutputs(report, table, plot string) {
	for _, p := range []struct{ what, path string }{{"results", report}, {"table", table}, {"plot", plot}} {
		if p.path != "" {
			fmt.Printf("%-8s %s\n", p.what+":", p.path)
		}
	}
}

// InterruptContext is the context of a benchmark command or helper: an interrupt or
// SIGTERM cancels it, and the run then removes what it made. Signals stay caught until
// stop, so a second Ctrl-C does not cut the clean-up short.
func InterruptContext() (ctx context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
