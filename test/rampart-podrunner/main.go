// Command rampart-podrunner plays the network part of a kubelet for one node
// (internal/testenv/podrunner): it registers the Node, and runs the Pods bound to it as host
// processes in sandbox network namespaces attached through the node's CNI plugin. It is
// for tests, demos and benchmarks on simulated nodes, not a kubelet: no images, volumes or
// scheduler. `rampart-podrunner --help` says more.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/rampartnet/rampart/internal/testenv/podrunner"
)

const usage = `rampart-podrunner runs the pods of one node, as the network part of a kubelet does.

It registers the Node object --node-name (InternalIP --address, spec.podCIDR --pod-cidr, a
Ready condition refreshed every 10 s) and watches the Pods whose spec.nodeName is that node
(no scheduler runs: set spec.nodeName). For each it makes a network namespace
/run/netns/rp-pod-<id>, attaches it with the first network configuration of
--cni-conf-dir and the plugins of --cni-bin-dir (ADD, and DEL when the pod goes), runs the
first container's command and args as a host process inside that namespace (there are no
images; stdout and stderr to <state-dir>/logs/), and reports the pod's status: phase, pod
IP, conditions, Ready once the process runs and its tcpSocket readiness probe, if any,
answers. Deleted pods are stopped (SIGTERM, SIGKILL after the grace period), detached and
deleted. Stopping the runner (SIGTERM) leaves the pods running; started again with the same
--state-dir it adopts them and cleans up those of pods deleted meanwhile.
rampart-podrunner --cleanup, with the same directories, stops and detaches every pod of
--state-dir without the API server.

Usage: rampart-podrunner [flags]

Flags:
`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	var (
		kubeconfig, address, podCIDR, binDirs string
		cfg                                   podrunner.Config
		cleanup, debug                        bool
	)
	fs := flag.NewFlagSet("rampart-podrunner", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	fs.StringVar(&cfg.NodeName, "node-name", "", "the node's name (its Node object)")
	fs.StringVar(&address, "address", "", "the node's InternalIP")
	fs.StringVar(&podCIDR, "pod-cidr", "", "the node's pod CIDR (spec.podCIDR)")
	fs.StringVar(&cfg.CNIConfDir, "cni-conf-dir", "/etc/cni/net.d", "CNI network configuration directory")
	fs.StringVar(&binDirs, "cni-bin-dir", "/opt/cni/bin", "CNI plugin directories, separated by ':'")
	fs.StringVar(&cfg.StateDir, "state-dir", "/var/lib/rampart-podrunner", "state directory (sandboxes, CNI result cache, logs)")
	fs.StringVar(&cfg.NodeNetns, "node-netns", "", "the node's network namespace, where plugins run (default: the runner's own)")
	fs.BoolVar(&cleanup, "cleanup", false, "stop and detach every pod of --state-dir, then exit")
	fs.BoolVar(&debug, "debug", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fmt.Print(usage)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(os.Stderr, "rampart-podrunner: %v (see --help)\n", err)
		return 2
	}
	cfg.CNIBinDirs = filepath.SplitList(binDirs)
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if cleanup {
		if err := podrunner.Cleanup(cfg); err != nil {
			fmt.Fprintf(os.Stderr, "rampart-podrunner: cleanup: %v\n", err)
			return 1
		}
		return 0
	}
	var bad []string
	if kubeconfig == "" {
		bad = append(bad, "--kubeconfig")
	}
	var err error
	if cfg.Address, err = netip.ParseAddr(address); err != nil {
		bad = append(bad, "--address")
	}
	if cfg.PodCIDR, err = netip.ParsePrefix(podCIDR); err != nil {
		bad = append(bad, "--pod-cidr")
	}
	if cfg.NodeName == "" {
		bad = append(bad, "--node-name")
	}
	if len(bad) > 0 {
		fmt.Fprintf(os.Stderr, "rampart-podrunner: missing or invalid %s (see --help)\n", strings.Join(bad, ", "))
		return 2
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rampart-podrunner: kubeconfig: %v\n", err)
		return 1
	}
	// A kubelet's default rate limits: pods starting together each write their status.
	rc.QPS, rc.Burst = 50, 100
	if cfg.Client, err = kubernetes.NewForConfig(rc); err != nil {
		fmt.Fprintf(os.Stderr, "rampart-podrunner: API client: %v\n", err)
		return 1
	}
	r, err := podrunner.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rampart-podrunner: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := r.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "rampart-podrunner: %v\n", err)
		return 1
	}
	return 0
}
