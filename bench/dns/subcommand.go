package dns

import (
	"fmt"
	"io"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Subcommands are the helpers dnsbench runs inside the benchmark's namespaces.
var Subcommands = []string{"serve-dns", "serve-world", "client"}

// Subcommand runs helper name with args and returns the process exit code.
func Subcommand(name string, args []string, stdout, stderr io.Writer) int {
	ctx, stop := benchkit.InterruptContext()
	defer stop()
	var err error
	switch name {
	case "serve-dns", "serve-world":
		fs := benchkit.SubcommandFlags(name, stderr)
		addr := fs.String("listen", "", "address:port to serve on")
		if err = fs.Parse(args); err != nil {
			break
		}
		if name == "serve-dns" {
			err = ServeDNS(ctx, *addr, nil)
		} else {
			err = ServeWorld(ctx, *addr)
		}
	case "client":
		err = ClientMain(args, stdout)
	default:
		err = fmt.Errorf("unknown subcommand")
	}
	return benchkit.SubcommandExit(stderr, name, err)
}
