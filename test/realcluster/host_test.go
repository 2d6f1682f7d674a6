package realcluster

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// lockDownNodes is host policy for every node: in, only the kubelet's port from the API
// server's address (kubectl exec and logs); out, nothing. The nodes' connections to the
// API server and the overlay between them are never cut.
const lockDownNodes = `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: lock-down-nodes}
spec:
  nodeSelector: {}
  ingress:
  - fromCIDR: [%s/32]
    toPorts: [{ports: [{port: "10250", protocol: TCP}]}]
  egress: []
`

// hostLockedDown applies lockDownNodes to the real nodes (their agents run with
// --host-firewall) and checks that it holds on the nodes' own traffic (node-2 can no
// longer reach node-1's kubelet) while what must never be cut still works: the kubelets
// renew their Leases through the API server, the pods on different nodes still connect as
// their policy says, kubectl exec reaches the kubelets, and the agents still apply
// changes from the API server. Deleting the policy opens the nodes again.
func hostLockedDown(t *testing.T, c *nodetest.Cluster, ns, client, other, web string) {
	t.Helper()
	n1, n2 := c.Nodes[0], c.Nodes[1]
	kubelet1 := netip.AddrPortFrom(n1.Address, 10250)
	// The kubelet speaks TLS: a completed handshake is the answer.
	fromNode2 := func() bool {
		conn, err := testenv.Dial(endpoint.NetnsPath(n2.Netns), "tcp", kubelet1, time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}
	if !fromNode2() {
		t.Fatalf("node-2 cannot reach node-1's kubelet (%v) before host policy", kubelet1)
	}
	policy := fmt.Sprintf(lockDownNodes, c.Slot.HostAddress)
	c.KubectlApply(policy)
	applied := time.Now()
	if !testenv.Eventually(30*time.Second, func() bool { return !fromNode2() }) {
		t.Fatalf("node-2 still reaches node-1's kubelet 30 s after the nodes were locked down")
	}
	// The kubelets' connections to the API server are never cut: their Leases move on.
	ctx := context.Background()
	if !testenv.Eventually(time.Minute, func() bool {
		for _, n := range c.Nodes {
			lease, err := c.Client.CoordinationV1().Leases("kube-node-lease").Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil || lease.Spec.RenewTime == nil || !lease.Spec.RenewTime.Time.After(applied) {
				return false
			}
		}
		return true
	}) {
		t.Errorf("a kubelet did not renew its Lease within a minute of the lock-down")
	}
	// The pods across nodes: the client still reaches the web pod (through the overlay
	// or the fabric, which host policy leaves alone), and kubectl exec works.
	if !connects(c, ns, client, web) {
		t.Errorf("%s cannot reach %s with the nodes locked down", client, web)
	}
	// The agents still apply what the API server says: without allowClients the other
	// pod reaches the web pod, with it again it does not.
	c.KubectlDelete(fmt.Sprintf(allowClients, ns))
	if !eventuallyConnects(c, ns, other, web, true) {
		t.Errorf("the agents did not apply a policy deleted after the lock-down")
	}
	c.KubectlApply(fmt.Sprintf(allowClients, ns))
	if !eventuallyConnects(c, ns, other, web, false) {
		t.Errorf("the agents did not apply a policy created after the lock-down")
	}
	c.KubectlDelete(policy)
	if !testenv.Eventually(30*time.Second, fromNode2) {
		t.Errorf("node-2 does not reach node-1's kubelet once the host policy is deleted")
	}
}
