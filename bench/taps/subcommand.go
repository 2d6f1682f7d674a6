package taps

import (
	"fmt"
	"io"
	"net"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/bench/l7"
)

// Subcommands are the helpers the benchmark runs inside its endpoints: the web server
// and benchkit's connection probe.
var Subcommands = append([]string{"http-server"}, benchkit.Helpers...)

// Subcommand runs helper name with args and returns the process exit code.
func Subcommand(name string, args []string, stdout, stderr io.Writer) int {
	if name != "http-server" {
		return benchkit.Helper(name, args, stdout, stderr) // which refuses an unknown name
	}
	fs := benchkit.SubcommandFlags(name, stderr)
	listen := fs.String("listen", fmt.Sprintf(":%d", webPort), "listen address")
	if fs.Parse(args) != nil {
		return 2
	}
	ctx, stop := benchkit.InterruptContext()
	defer stop()
	ln, err := net.Listen("tcp", *listen)
	if err == nil {
		err = l7.ServeHTTP(ctx, ln)
	}
	return benchkit.SubcommandExit(stderr, name, err)
}
