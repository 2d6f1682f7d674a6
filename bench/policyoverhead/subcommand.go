package policyoverhead

import (
	"fmt"
	"io"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Subcommands are the helpers the benchmark runs inside endpoints (benchkit.Helpers), and
// "report", which prints the table of a saved JSON report.
var Subcommands = []string{"rr-server", "rr-client", "probe", "report"}

// Subcommand runs subcommand name with args, writing results to stdout, and returns the
// process exit code.
func Subcommand(name string, args []string, stdout, stderr io.Writer) int {
	if name != "report" {
		return benchkit.Helper(name, args, stdout, stderr)
	}
	fs := benchkit.SubcommandFlags(name, stderr)
	var err error
	switch name {
	case "report":
		// Not an endpoint helper: prints the table of a saved JSON report.
		md := fs.Bool("markdown", false, "print a Markdown table")
		if fs.Parse(args) != nil {
			return 2
		}
		if fs.NArg() < 1 {
			fmt.Fprintln(stderr, "usage: policyoverhead report [--markdown] FILE.json [FILE.json...] (several: their pairs pooled)")
			return 2
		}
		var runs []*Result
		for _, f := range fs.Args() {
			var r *Result
			if r, err = ReadResult(f); err != nil {
				break
			}
			runs = append(runs, r)
		}
		var r *Result
		if err == nil {
			r, err = Pool(runs)
		}
		if err == nil {
			if *md {
				r.PrintMarkdown(stdout)
			} else {
				r.PrintTable(stdout)
			}
		}
	default:
		return benchkit.UnknownSubcommand(stderr, name)
	}
	return benchkit.SubcommandExit(stderr, name, err)
}
