package nodetest

import (
	"path/filepath"

	"github.com/rampartnet/rampart/internal/k8s/controlplane"
)

// ClusterCIDR is the range kube-controller-manager gives each node a /20 of (the Node's
// spec.podCIDR, which the node's rampartd takes as its --pod-cidr): the first half of the
// project's test range, below the fabric and the service range in 198.19.0.0/16.
const ClusterCIDR = "198.18.0.0/16"

// startControllers starts kube-scheduler and kube-controller-manager on the host, against
// the admin kubeconfig, without serving ports of their own (--secure-port=0) and without
// leader election (one of each).
func (c *Cluster) startControllers() error {
	var err error
	c.scheduler, err = startProc("kube-scheduler", filepath.Join(c.dir, "kube-scheduler.log"), 0,
		filepath.Join(c.Bins.Node, "kube-scheduler"), "--kubeconfig", c.Kubeconfig,
		"--leader-elect=false", "--secure-port=0")
	if err != nil {
		return err
	}
	c.controllerManager, err = startProc("kube-controller-manager", filepath.Join(c.dir, "kube-controller-manager.log"), 0,
		filepath.Join(c.Bins.Node, "kube-controller-manager"), "--kubeconfig", c.Kubeconfig,
		"--leader-elect=false", "--secure-port=0",
		"--allocate-node-cidrs", "--cluster-cidr", ClusterCIDR, "--node-cidr-mask-size", "20",
		"--service-cluster-ip-range", controlplane.ServiceCIDR,
		"--service-account-private-key-file", c.ServiceAccountKey(),
		"--root-ca-file", c.CAFile,
		"--use-service-account-credentials=false")
	return err
}
