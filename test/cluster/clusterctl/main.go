// Command clusterctl starts and stops a simulated Kubernetes cluster that outlives it, for
// people (internal/k8s/simcluster): scripts/cluster.sh runs it.
//
//	clusterctl start -bin DIR -dir DIR [-nodes N -tunnel MODE -rampart-bin DIR -name NAME]
//	    start the control plane, install the CRDs, start N nodes (rampartd and
//	    rampart-podrunner each), print the kubeconfig path
//	clusterctl stop -dir DIR     stop and remove what start left running
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/internal/k8s/simcluster"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: clusterctl start|stop [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	var cfg simcluster.Config
	fs.StringVar(&cfg.K8sBinDir, "bin", "", "directory holding etcd and kube-apiserver (scripts/build-k8s.sh --dir)")
	fs.StringVar(&cfg.Dir, "dir", "", "state directory")
	fs.IntVar(&cfg.Nodes, "nodes", 0, "number of nodes (0: the control plane alone)")
	fs.StringVar(&cfg.Tunnel, "tunnel", "", "the agents' --tunnel (default native routing)")
	fs.StringVar(&cfg.BinDir, "rampart-bin", "", "directory holding rampartd, rampart-cni and rampart-podrunner")
	fs.StringVar(&cfg.Name, "name", "", "prefix of the agents' instance names and the namespaces (default cluster)")
	fs.Parse(os.Args[2:])
	if cfg.Dir == "" {
		fmt.Fprintln(os.Stderr, "clusterctl: -dir is required")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "start":
		cfg.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "clusterctl: "+format+"\n", args...) }
		// Ctrl-C or SIGTERM during start: Start stops what it started and returns.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		var s *simcluster.State
		if s, err = simcluster.Start(ctx, cfg); err == nil {
			fmt.Println(s.Kubeconfig)
		} else if errors.Is(err, context.Canceled) {
			err = errors.New("interrupted; what was started is stopped again")
		}
	case "stop":
		err = simcluster.Stop(cfg.Dir)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "clusterctl:", err)
		os.Exit(1)
	}
}
