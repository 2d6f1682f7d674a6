// Command clusterctl starts and stops a Kubernetes control plane (etcd and kube-apiserver,
// internal/k8s/controlplane) that outlives it, for people: scripts/cluster.sh runs it.
//
//	clusterctl start -bin DIR -dir DIR   start, install the CRDs, print the kubeconfig path
//	clusterctl stop -dir DIR             stop what start left running
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/rampartnet/rampart/internal/k8s/controlplane"
	"github.com/rampartnet/rampart/internal/k8s/crds"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: clusterctl start|stop [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	bin := fs.String("bin", "", "directory holding etcd and kube-apiserver (scripts/build-k8s.sh --dir)")
	dir := fs.String("dir", "", "state directory")
	fs.Parse(os.Args[2:])
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "clusterctl: -dir is required")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "start":
		err = start(*bin, *dir)
	case "stop":
		err = controlplane.StopDetached(*dir)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "clusterctl:", err)
		os.Exit(1)
	}
}

func start(bin, dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Config{BinDir: bin, Dir: dir, Detach: true})
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err == nil {
		err = crds.Install(ctx, cfg)
	}
	if err != nil {
		controlplane.StopDetached(dir)
		return err
	}
	fmt.Println(cp.Kubeconfig)
	return nil
}
