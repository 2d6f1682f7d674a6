package mapstate

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// A pod on another node is selected by its labels like a local endpoint, and the ipcache
// maps its address to its identity and to its node's address (the tunnel endpoint); the
// node's address gets the remote-node identity.
func TestRemoteEndpoints(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	rl := fullLabels("x", "pod", "b")
	remoteID := w.alloc.ForLabels(rl)
	node := netip.MustParseAddr("198.19.0.2")
	w.in.Remote = []RemoteEndpoint{{Namespace: "x", Name: "b", Labels: rl, Identity: remoteID,
		IP: netip.MustParseAddr("198.18.1.10"), Node: node}}
	w.in.NodeIPs = []netip.Addr{node}
	w.rules(policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, EnableDefaultDeny: true,
		Peers: []policy.Peer{endpointsPeer(matchLabels(t, "pod", "b"))}})
	st := w.compute(t)

	if got := identitiesOf(st.Endpoints[1], policy.Ingress); !sameIDs(got, remoteID) {
		t.Errorf("ingress peers %v, want the remote pod's identity %d", got, remoteID)
	}
	if _, ok := st.Endpoints[0]; ok {
		t.Errorf("a remote pod got policy entries of its own")
	}
	e := st.IPCache[netip.MustParsePrefix("198.18.1.10/32")]
	if e.Identity != remoteID || e.TunnelEndpoint != node || e.EndpointID != 0 {
		t.Errorf("remote pod's ipcache entry %+v, want identity %d via %v", e, remoteID, node)
	}
	if e := st.IPCache[netip.MustParsePrefix("198.18.0.10/32")]; e.TunnelEndpoint.IsValid() {
		t.Errorf("local endpoint has a tunnel endpoint: %+v", e)
	}
	if e := st.IPCache[netip.PrefixFrom(node, 32)]; e.Identity != identity.RemoteNode {
		t.Errorf("node address's ipcache entry %+v, want remote-node", e)
	}

	// A remote pod may not take a local endpoint's address.
	w.in.Remote[0].IP = netip.MustParseAddr("198.18.0.10")
	if err := w.in.Check(); err == nil {
		t.Errorf("Check accepted a remote pod with a local endpoint's address")
	}
}
