package agenttest

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
)

// BareNode is a node network namespace with endpoint namespaces and veths but no agent and
// no dataplane programs: plain routing between endpoints, for testing pieces (such as the
// L7 proxy) on their own. Everything is removed when the test ends.
type BareNode struct {
	Node endpoint.Node
	Path string // the node namespace
	t    testing.TB
}

// NewBareNode creates a node namespace with pod range 198.18.0.0/24 (router 198.18.0.1).
func NewBareNode(t testing.TB) *BareNode {
	t.Helper()
	testenv.RequireRoot(t)
	inst := "b" + testenv.Suffix(8)
	n := &BareNode{
		Node: endpoint.Node{Instance: inst, Netns: "rp-" + inst + "-node", PodCIDR: netip.MustParsePrefix("198.18.0.0/24")},
		t:    t,
	}
	n.Path = n.Node.NetnsPath()
	t.Cleanup(func() {
		if err := n.Node.Teardown(); err != nil {
			t.Errorf("removing node namespace: %v", err)
		}
	})
	if err := n.Node.Setup(); err != nil {
		t.Fatalf("creating node namespace: %v", err)
	}
	return n
}

// Add creates endpoint namespace/name with address ip (inside 198.18.0.0/24).
func (n *BareNode) Add(name string, ip netip.Addr) endpoint.Endpoint {
	n.t.Helper()
	ep, err := n.Node.Create("t", name, ip)
	if err != nil {
		n.t.Fatalf("creating endpoint %s: %v", name, err)
	}
	n.t.Cleanup(func() {
		if err := n.Node.Delete("t", name); err != nil {
			n.t.Errorf("removing endpoint %s: %v", name, err)
		}
	})
	return ep
}
