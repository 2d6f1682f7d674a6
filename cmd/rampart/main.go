// Command rampart is the command line client of the rampart agent.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/rampartnet/rampart/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}
