package services

import (
	"fmt"
	"io"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Subcommands are the helpers svcbench runs inside the benchmark's namespaces.
var Subcommands = []string{"serve", "client"}

// Subcommand runs helper name with args and returns the process exit code.
func Subcommand(name string, args []string, stdout, stderr io.Writer) int {
	var err error
	switch name {
	case "serve":
		fs := benchkit.SubcommandFlags(name, stderr)
		addr := fs.String("addr", "", "address:port to serve HTTP on")
		if err = fs.Parse(args); err == nil {
			ctx, stop := benchkit.InterruptContext()
			defer stop()
			err = Serve(ctx, *addr)
		}
	case "client":
		err = ClientMain(args, stdout)
	default:
		err = fmt.Errorf("unknown subcommand")
	}
	return benchkit.SubcommandExit(stderr, name, err)
}
