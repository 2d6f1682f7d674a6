package dns

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Subcommands are the helpers dnsbench runs inside the benchmark's namespaces.
var Subcommands = []string{"serve-dns", "serve-world", "client"}

// Subcommand runs helper name with args and returns the process exit code.
func Subcommand(name string, args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch name {
	case "serve-dns", "serve-world":
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(stderr)
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
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}
