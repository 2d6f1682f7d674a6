package nodetest

import (
	"path/filepath"
	"strconv"
)

// startControllers starts kube-scheduler and kube-controller-manager on the host, against
// the admin kubeconfig, without serving ports of their own (--secure-port=0) and without
// leader election (one of each). The controller manager gives each node a pod CIDR of the
// slot's ClusterCIDR (spec.podCIDR, which the node's rampartd takes as its --pod-cidr).
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
		"--allocate-node-cidrs", "--cluster-cidr", c.Slot.ClusterCIDR.String(),
		"--node-cidr-mask-size", strconv.Itoa(c.Slot.NodeCIDRBits),
		"--service-cluster-ip-range", c.Slot.ServiceCIDR.String(),
		"--service-account-private-key-file", c.ServiceAccountKey(),
		"--root-ca-file", c.CAFile,
		"--use-service-account-credentials=false")
	return err
}
