package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/rampartnet/rampart/internal/hubble"
)

// startHubble serves Hubble's observer API over src's flows on addr (--hubble-address)
// until the returned stop is called. The address is opened here, so a bad or busy one
// stops the agent at start rather than later in a log line.
func startHubble(ctx context.Context, src hubble.Source, addr, node string, log *slog.Logger) (stop func(), err error) {
	if node == "" {
		if node, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("--hubble-address: the node name: %w", err)
		}
	}
	l, err := hubble.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("--hubble-address: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hubble.Serve(ctx, l, hubble.NewServer(src, node)); err != nil {
			log.Error("hubble API stopped", "error", err)
		}
	}()
	log.Info("serving the hubble API", "address", addr, "node", node)
	return func() { cancel(); <-done }, nil
}
