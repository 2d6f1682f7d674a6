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

// An egress rule naming a port resolves it against a remote peer's declared ports as
// against a local peer's: for that peer's identity, and for peers that may be any pod.
// Ingress resolves against the subject's own ports, whoever the (remote) peer is.
func TestRemoteNamedPorts(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.ep("x", "a").NamedPorts = map[string]NamedPort{"serve-80-tcp": {Port: 80, Protocol: policy.ProtoTCP}}
	rl := fullLabels("x", "pod", "b")
	remoteID := w.alloc.ForLabels(rl)
	node := netip.MustParseAddr("198.19.0.2")
	w.in.Remote = []RemoteEndpoint{{Namespace: "x", Name: "b", Labels: rl, Identity: remoteID,
		IP: netip.MustParseAddr("198.18.1.10"), Node: node,
		NamedPorts: map[string]NamedPort{"serve-81-tcp": {Port: 81, Protocol: policy.ProtoTCP}, "serve-81-udp": {Port: 81, Protocol: policy.ProtoUDP}}}}
	w.in.NodeIPs = []netip.Addr{node}
	named := func(name string, proto policy.Protocol) []policy.PortRule {
		return []policy.PortRule{{Name: name, Protocol: proto}}
	}
	w.rules(
		policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress, EnableDefaultDeny: true,
			Peers: []policy.Peer{endpointsPeer(matchLabels(t, "pod", "b"))}, Ports: named("serve-81-tcp", policy.ProtoTCP)},
		policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress, AllPeers: true, Ports: named("serve-81-udp", policy.ProtoUDP)},
		policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, EnableDefaultDeny: true,
			Peers: []policy.Peer{endpointsPeer(matchLabels(t, "pod", "b"))}, Ports: named("serve-80-tcp", policy.ProtoTCP)},
	)
	st := w.compute(t)
	a := netip.MustParseAddr("198.18.1.10")
	for _, c := range []struct {
		dir   policy.Direction
		proto policy.Protocol
		port  uint16
		want  Verdict
	}{
		{policy.Egress, policy.ProtoTCP, 81, Allowed},
		{policy.Egress, policy.ProtoTCP, 80, Denied},
		{policy.Egress, policy.ProtoUDP, 81, Allowed}, // to any peer, resolved against every pod's
		{policy.Ingress, policy.ProtoTCP, 80, Allowed},
		{policy.Ingress, policy.ProtoTCP, 81, Denied},
	} {
		if d := Lookup(st, 1, c.dir, a, c.proto, c.port); d.Verdict != c.want {
			t.Errorf("%v %v/%d with remote x/b: %v (%s), want %v", c.dir, c.proto, c.port, d.Verdict, d.Reason, c.want)
		}
	}
}

// Trace judges a pod on another node as its node does: its policy from the same rules
// and its named ports, this node's host seen as a remote node from there and its own
// node as its host.
func TestTraceRemoteEndpoint(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	rl := fullLabels("x", "pod", "b")
	node := netip.MustParseAddr("198.19.0.2")
	host := netip.MustParseAddr("198.18.0.1")
	w.in.HostIPs = []netip.Addr{host}
	w.in.NodeIPs = []netip.Addr{node}
	w.in.Remote = []RemoteEndpoint{{Namespace: "x", Name: "b", Labels: rl, Identity: w.alloc.ForLabels(rl),
		IP: netip.MustParseAddr("198.18.1.10"), Node: node,
		NamedPorts: map[string]NamedPort{"web": {Port: 8080, Protocol: policy.ProtoTCP}}}}
	w.rules(
		policy.Rule{Subject: matchLabels(t, "pod", "b"), Direction: policy.Egress, EnableDefaultDeny: true,
			Peers: []policy.Peer{entityPeer(policy.EntityRemoteNode)}},
		policy.Rule{Subject: matchLabels(t, "pod", "b"), Direction: policy.Ingress, EnableDefaultDeny: true,
			Peers: []policy.Peer{endpointsPeer(matchLabels(t, "pod", "a"))}, Ports: []policy.PortRule{{Name: "web", Protocol: policy.ProtoTCP}}},
	)
	st := w.compute(t)
	b := TraceRef{Namespace: "x", Name: "b"}
	for _, c := range []struct {
		from, to TraceRef
		port     uint16
		want     Verdict
	}{
		{b, TraceRef{Addr: host}, 22, Allowed},                  // this node is a remote node to b's
		{b, TraceRef{Addr: node}, 22, Denied},                   // b's own node is its host
		{b, TraceRef{Namespace: "x", Name: "a"}, 80, Denied},    // b's egress allows nodes only
		{TraceRef{Namespace: "x", Name: "a"}, b, 8080, Allowed}, // b's ingress: its "web"
		{TraceRef{Addr: netip.MustParseAddr("198.18.0.10")}, TraceRef{Addr: netip.MustParseAddr("198.18.1.10")}, 8081, Denied},
	} {
		res, err := Trace(w.in, st, Query{From: c.from, To: c.to, Protocol: policy.ProtoTCP, Port: c.port})
		if err != nil {
			t.Fatalf("%v -> %v: %v", c.from, c.to, err)
		}
		if res.Verdict != c.want {
			t.Errorf("%v -> %v TCP %d: %v, want %v (egress %+v, ingress %+v)", c.from, c.to, c.port, res.Verdict, c.want, res.Egress, res.Ingress)
		}
		for _, ch := range []*TraceCheck{res.Egress, res.Ingress} {
			if ch != nil && ch.Endpoint == "x/b" && ch.Node != node {
				t.Errorf("%v -> %v: x/b's check has node %v, want %v", c.from, c.to, ch.Node, node)
			}
		}
	}
	// The state the dataplane has is not touched by a trace.
	if _, ok := st.Endpoints[0]; ok {
		t.Error("a trace gave the remote pod an entry in this node's state")
	}
}
