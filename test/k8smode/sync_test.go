package k8smode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/k8s/watcher"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// nsWithPods is a labelled Namespace and its pods as one manifest: a server on the first
// node, two clients on the second, whose containers run image.
func nsWithPods(ns, nsLabels, image string) string {
	pod := func(name, node string) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {pod: %s}}
spec:
  nodeName: %s
  containers: [{name: main, image: %s}]
`, name, ns, name, node, image)
	}
	return fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s, labels: {%s}}\n", ns, nsLabels) +
		pod("client-good", "node-2") + pod("client-bad", "node-2") + pod("server", "node-1")
}

// serverFromGood admits client-good of a namespace labelled team=t, and nothing else, to
// the server: it holds only where the pods' identities carry their namespace's labels.
func serverFromGood(ns string) string {
	return fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server, namespace: %s}
spec:
  podSelector: {matchLabels: {pod: server}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: t}}
      podSelector: {matchLabels: {pod: client-good}}
    ports: [{port: 80, protocol: TCP}]
`, ns)
}

// nodeCondition is node's RampartPolicySynced condition (nil: none).
func nodeCondition(t *testing.T, c *clustertest.Cluster, node string) *corev1.NodeCondition {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == watcher.ConditionPolicySynced {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// waitClean waits until every node says, in status and on its Node, that it applied the
// whole view.
func waitClean(t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	for _, n := range c.Nodes {
		if !testenv.Eventually(propagate, func() bool {
			k := n.Status().Kubernetes
			cond := nodeCondition(t, c, n.Name)
			return k != nil && k.Synced && k.Clean && len(k.Unresolved) == 0 &&
				cond != nil && cond.Status == corev1.ConditionTrue && cond.Reason == watcher.ReasonViewApplied
		}) {
			t.Fatalf("node %s did not apply the whole view: status %+v, condition %+v\n%s",
				n.Name, n.Status().Kubernetes, nodeCondition(t, c, n.Name), n.CLI("status"))
		}
		out := n.CLI("status")
		i := strings.Index(out, "Sync:")
		if i < 0 {
			t.Fatalf("node %s: no Sync line in rampart status:\n%s", n.Name, out)
		}
		line, _, _ := strings.Cut(out[i:], "\n")
		if f := strings.Fields(line); len(f) < 2 || f[1] != "synced," {
			t.Errorf("node %s: rampart status says %q, want synced", n.Name, line)
		}
	}
}

// A labelled Namespace applied together with its pods (one kubectl apply, the CNI ADDs
// right after), and the same pods whose namespace gets its labels afterwards: on every
// node the pods' identities carry the namespace's labels, the whole view applies, the
// policy that selects by namespace label is enforced with real traffic across nodes,
// and status and the Node's condition say so.
func TestNamespaceAppliedWithItsPods(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2, Tunnel: overlay.VXLAN})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	for _, order := range []string{"together", "labelled-after"} {
		ns := "nc-" + order
		labelsNow := "team: t"
		if order == "labelled-after" {
			labelsNow = "other: o"
		}
		c.KubectlApply(nsWithPods(ns, labelsNow, c.PodImage()))
		// The runtime's part at once, the clients first: their node sees the pods and
		// the Namespace in the same moment as the view that brings them.
		good := c.RunPod(n2, ns, "client-good")
		bad := c.RunPod(n2, ns, "client-bad")
		server := c.RunPod(n1, ns, "server")
		waitRemote(t, c, good, bad, server)
		if order == "labelled-after" {
			c.MustKubectl("label", "namespace", ns, "team=t")
		}
		c.KubectlApply(serverFromGood(ns))
		waitFor(t, order+": policy applied", probe{bad, server, 80, "tcp", false})
		check(t, order+": policy by namespace label", []probe{
			{good, server, 80, "tcp", true},
			{bad, server, 80, "tcp", false},
			{good, server, 81, "tcp", false},
			{server, good, 80, "tcp", true}, // the clients are selected by no policy
		})
		waitClean(t, c)
	}
	// Something not applied shows on the Node too, and goes when it is fixed.
	const refused = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: services, namespace: nc-together}
spec:
  endpointSelector: {matchLabels: {pod: server}}
  egress:
  - toServices: [{k8sService: {serviceName: web, namespace: nc-together}}]
`
	c.KubectlApply(refused)
	for _, n := range c.Nodes {
		if !testenv.Eventually(propagate, func() bool {
			cond := nodeCondition(t, c, n.Name)
			k := n.Status().Kubernetes
			return cond != nil && cond.Status == corev1.ConditionFalse && cond.Reason == watcher.ReasonObjectsNotApplied &&
				k.Synced && !k.Clean
		}) {
			t.Errorf("node %s: a refused policy is not in its condition (%+v) or status (%+v)", n.Name, nodeCondition(t, c, n.Name), n.Status().Kubernetes)
		}
	}
	c.KubectlDelete(refused)
	waitClean(t, c)
}
