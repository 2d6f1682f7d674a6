package taps

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/bench/l7"
)

// Subcommands are the helpers the benchmark runs inside its endpoints: the web server
// and benchkit's connection probe.
var Subcommands = append([]string{"http-server"}, benchkit.Helpers...)

// Subcommand runs helper name with args and returns the process exit code.
func Subcommand(name string, args []string, stdout, stderr io.Writer) int {
	if name != "http-server" {
		if !slices.Contains(benchkit.Helpers, name) {
			fmt.Fprintf(stderr, "unknown subcommand %q\n", name)
			return 2
		}
		return benchkit.Helper(name, args, stdout, stderr)
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", fmt.Sprintf(":%d", webPort), "listen address")
	if fs.Parse(args) != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *listen)
	if err == nil {
		err = l7.ServeHTTP(ctx, ln)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}
