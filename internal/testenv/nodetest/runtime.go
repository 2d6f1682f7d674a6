package nodetest

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// kubeletRuntime is clustertest's Runtime on real nodes: the kubelet runs a test's pods
// (pause containers) and the test finds their network namespaces through CRI, so that the
// tests written against clustertest's pods run unchanged on a real node stack.
type kubeletRuntime struct{ c *Cluster }

// Image is the pause image every node imported.
func (r kubeletRuntime) Image() string { return r.c.Bins.PauseImage }

// node is the real node of clustertest node n.
func (r kubeletRuntime) node(n *clustertest.Node) (*Node, error) {
	for _, rn := range r.c.Nodes {
		if rn.Node == n {
			return rn, nil
		}
	}
	return nil, fmt.Errorf("node %s is not one of the cluster's real nodes", n.Name)
}

func (r kubeletRuntime) crictl() string { return filepath.Join(r.c.Bins.CRI, "crictl") }

// Started waits until the pod runs with an address and returns it with the path of the
// network namespace of its ready sandbox.
func (r kubeletRuntime) Started(ctx context.Context, n *clustertest.Node, obj *corev1.Pod) (netip.Addr, string, error) {
	rn, err := r.node(n)
	if err != nil {
		return netip.Addr{}, "", err
	}
	pods := r.c.Client.CoreV1().Pods(obj.Namespace)
	var ip netip.Addr
	var netns, last string
	for ctx.Err() == nil {
		if p, err := pods.Get(ctx, obj.Name, metav1.GetOptions{}); err != nil {
			last = err.Error()
		} else if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			last = fmt.Sprintf("phase %s, address %q", p.Status.Phase, p.Status.PodIP)
		} else if ip, err = netip.ParseAddr(p.Status.PodIP); err != nil {
			return netip.Addr{}, "", fmt.Errorf("status.podIP %q: %w", p.Status.PodIP, err)
		} else if netns, err = rn.PodNetns(r.crictl(), obj.Namespace, obj.Name); err != nil {
			last = err.Error()
		} else {
			return ip, netns, nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	return netip.Addr{}, "", fmt.Errorf("not running on %s: %s (%w)", n.Name, last, ctx.Err())
}

// Delete deletes the Pod object and waits until the object is gone and the node holds no
// ready sandbox of it: the kubelet stopped the sandbox, so its CNI DEL was made.
func (r kubeletRuntime) Delete(ctx context.Context, p *clustertest.Pod) error {
	rn, err := r.node(p.Node)
	if err != nil {
		return err
	}
	pods := r.c.Client.CoreV1().Pods(p.Namespace)
	if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	deadline, _ := ctx.Deadline()
	if !testenv.Eventually(time.Until(deadline), func() bool {
		_, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false
		}
		_, err = rn.PodNetns(r.crictl(), p.Namespace, p.Name)
		return err != nil
	}) {
		return fmt.Errorf("pod %s still on %s after %v", p.Key(), p.Node.Name, ctx.Err())
	}
	return nil
}
