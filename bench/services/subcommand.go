package services

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Subcommands are the helpers svcbench runs inside the benchmark's namespaces.
var Subcommands = []string{"serve", "client"}

// Subcommand runs helper name with args and returns the process exit code.
func Subcommand(name string, args []string, stdout, stderr io.Writer) int {
	var err error
	switch name {
	case "serve":
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(stderr)
		addr := fs.String("addr", "", "address:port to serve HTTP on")
		if err = fs.Parse(args); err == nil {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			err = Serve(ctx, *addr)
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
