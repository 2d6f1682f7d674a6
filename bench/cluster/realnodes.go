package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// NewNodesCluster starts two real nodes with --tunnel=mode (internal/testenv/nodetest, as
// the real-node tests and scripts/cluster.sh start them): kube-apiserver and etcd,
// kube-scheduler and kube-controller-manager, and per node containerd, kubelet and
// kube-proxy, Rampart's agent in Kubernetes mode as its CNI. Pods are ordinary Pod objects
// running the agnhost image, made by the kubelet through containerd and rampart-cni; the
// benchmark enters their network namespaces as with the other clusters. The lab logs to
// log. Each cluster takes a lab slot of the host (its own fabric, host address, pod and
// service ranges), so a run keeps up to nodetest.MaxSlots of them live at once; one more
// waits for a slot to be freed.
func NewNodesCluster(ctx context.Context, mode string, log io.Writer) (_ Cluster, err error) {
	s := testenv.NewSession("clusterbench", log)
	var lab *nodetest.Cluster
	if err := s.Run(func(t testing.TB) {
		lab = nodetest.Start(t, nodetest.Options{Nodes: 2, Tunnel: overlay.Mode(mode)})
	}); err != nil {
		return nil, errors.Join(fmt.Errorf("starting two real nodes (--tunnel=%s): %w", mode, err), s.Close())
	}
	c := &k8sCluster{mode: mode, epIDs: map[string]uint32{},
		container: corev1.Container{Name: "main", Image: lab.Bins.AgnhostImage, ImagePullPolicy: corev1.PullNever, Args: []string{"pause"}},
		close:     s.Close}
	for _, n := range lab.Nodes {
		c.nodes = append(c.nodes, k8sNode{Name: n.Name, Socket: n.Node.Socket(), Pins: n.Node.BPFDir()})
	}
	if err := c.connect(lab.Kubeconfig); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}
