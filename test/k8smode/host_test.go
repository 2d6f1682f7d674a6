package k8smode

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// lockedNodes closes the nodes labelled role=locked to every new connection from outside.
const lockedNodes = `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: locked-nodes}
spec:
  nodeSelector: {matchLabels: {role: locked}}
  ingress: []
`

// Host policy from the API server: a CiliumClusterwideNetworkPolicy whose nodeSelector
// matches a Node's labels is enforced on that node's own traffic and not on the other's;
// labelling the other Node brings it under the policy too (the agents follow their Node
// objects' labels), and deleting the policy opens both.
func TestHostPolicyByNodeLabels(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2, AgentFlags: []string{"--host-firewall"}})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	for _, n := range c.Nodes {
		s, err := testenv.Serve(endpoint.NetnsPath(n.Netns), []uint16{2222}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
	}
	reach := func(from, to *clustertest.Node) func() bool {
		return func() bool {
			return testenv.Probe(endpoint.NetnsPath(from.Netns), netip.AddrPortFrom(to.Address, 2222), "tcp", denyWait)
		}
	}
	wait := func(what string, cond func() bool, want bool) {
		t.Helper()
		if !testenv.Eventually(propagate, func() bool { return cond() == want }) {
			t.Fatalf("%s: still connected=%v after %v", what, !want, propagate)
		}
	}
	wait("node-2 to node-1 before any host policy", reach(n2, n1), true)

	c.MustKubectl("label", "node", n1.Name, "role=locked")
	c.KubectlApply(lockedNodes)
	wait("node-2 to node-1 once node-1 is locked", reach(n2, n1), false)
	if !testenv.Probe(endpoint.NetnsPath(n1.Netns), netip.AddrPortFrom(n2.Address, 2222), "tcp", allowWait) {
		t.Errorf("node-1 cannot reach node-2, whose labels the policy does not select")
	}

	c.MustKubectl("label", "node", n2.Name, "role=locked")
	wait("node-1 to node-2 once node-2 is labelled", reach(n1, n2), false)

	c.KubectlDelete(lockedNodes)
	wait("node-2 to node-1 once the policy is deleted", reach(n2, n1), true)
	wait("node-1 to node-2 once the policy is deleted", reach(n1, n2), true)
}
