package e2e

import (
	"context"
	"encoding/binary"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// twoNodes is two agents, each in its own node namespace, joined by a fabric veth, with
// each other declared as nodes.
type twoNodes struct {
	a, b         *agenttest.Env
	addrA, addrB netip.Addr // fabric addresses
}

func startTwoNodes(t *testing.T, mode overlay.Mode) *twoNodes {
	t.Helper()
	n := &twoNodes{addrA: netip.MustParseAddr("198.19.255.1"), addrB: netip.MustParseAddr("198.19.255.2")}
	cidrA, cidrB := netip.MustParsePrefix("198.18.16.0/20"), netip.MustParsePrefix("198.18.32.0/20")
	n.a = agenttest.StartAgent(t, agenttest.Options{PodCIDR: cidrA, Tunnel: mode})
	n.b = agenttest.StartAgent(t, agenttest.Options{PodCIDR: cidrB, Tunnel: mode})
	agenttest.LinkFabric(t, n.a, n.b, n.addrA, n.addrB)
	n.a.MustCLI("node", "add", "node-b", "--address", n.addrB.String(), "--pod-cidr", cidrB.String())
	n.b.MustCLI("node", "add", "node-a", "--address", n.addrA.String(), "--pod-cidr", cidrA.String())
	return n
}

// declare declares endpoint key of from as a remote endpoint on to, with its labels and
// the identity its node gave it.
func declare(t *testing.T, from, to *agenttest.Env, node, key string, labels string) {
	t.Helper()
	ep := from.Endpoint(key)
	to.MustCLI("remote", "add", key, "--node", node, "--ip", ep.IP, "--labels", labels,
		"--identity", strconv.FormatUint(uint64(ep.Identity), 10))
}

// pods creates x/a and x/c on node A and x/b on node B, declares each on the other node,
// and applies allowAToB80 on node B.
func (n *twoNodes) pods(t *testing.T) (a, c, b api.Endpoint) {
	t.Helper()
	a = n.a.AddEndpoint("x", "a", map[string]string{"pod": "a"})
	c = n.a.AddEndpoint("x", "c", map[string]string{"pod": "c"})
	// Remote pods are declared before node B allocates for its own, so that both nodes
	// can use the numbers node A gave (until identities are allocated cluster-wide).
	declare(t, n.a, n.b, "node-a", "x/a", "pod=a")
	declare(t, n.a, n.b, "node-a", "x/c", "pod=c")
	b = n.b.AddEndpoint("x", "b", map[string]string{"pod": "b"})
	declare(t, n.b, n.a, "node-b", "x/b", "pod=b")
	if _, errs, code := n.b.CLIStdin(allowAToB80, "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply: %s", errs)
	}
	return a, c, b
}

const allowAToB80 = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-a, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress:
  - from:
    - podSelector: {matchLabels: {pod: a}}
    ports: [{port: 80, protocol: TCP}, {port: 80, protocol: UDP}]
`

// flowsOf returns the flows agent e has seen since it started.
func flowsOf(t *testing.T, e *agenttest.Env) []api.Flow {
	t.Helper()
	var out []api.Flow
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := e.Client.Observe(ctx, api.ObserveRequest{SinceStart: true}, func(f api.Flow) error {
		out = append(out, f)
		return nil
	})
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	return out
}

// Pods on two nodes talk through the VXLAN overlay: the receiving node's ingress policy
// selects the remote pod by labels and is judged on the identity the VNI carried (flows
// flagged tunnel); denied pairs are dropped; a pod that sends its own VXLAN packets with
// an identity of its choice is dropped (not from a node address); UDP datagrams larger
// than the pod MTU (fragments) pass when policy allows them.
func TestOverlayVXLAN(t *testing.T) {
	n := startTwoNodes(t, overlay.VXLAN)
	a, c, b := n.pods(t)
	bIP := netip.MustParseAddr(b.IP)

	// The overlay's MTU on the pods.
	for _, ep := range []api.Endpoint{a, c} {
		h := testenv.NetlinkHandle(t, ep.Netns)
		l, err := h.LinkByName(endpoint.PodIfName)
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs().MTU != overlay.FabricMTU-overlay.VXLANOverhead {
			t.Errorf("%s: pod MTU %d, want %d", ep.Name, l.Attrs().MTU, overlay.FabricMTU-overlay.VXLANOverhead)
		}
	}

	probes := []struct {
		from  string
		port  uint16
		proto string
		want  bool
	}{
		{"x/a", 80, "tcp", true},
		{"x/a", 80, "udp", true},
		{"x/a", 81, "tcp", false},
		{"x/a", 81, "udp", false},
		{"x/c", 80, "tcp", false},
		{"x/c", 80, "udp", false},
	}
	for _, p := range probes {
		timeout := 3 * time.Second
		if !p.want {
			timeout = 700 * time.Millisecond
		}
		if got := n.a.Probe(p.from, bIP, p.port, p.proto, timeout); got != p.want {
			t.Errorf("%s -> node B x/b %d/%s: connected %v, want %v", p.from, p.port, p.proto, got, p.want)
		}
	}

	// A restarted agent keeps the overlay: device, programs, routes and remote pods.
	n.b.Restart()
	n.a.Restart()
	if !n.a.Probe("x/a", bIP, 80, "tcp", 3*time.Second) {
		t.Error("x/a -> node B x/b 80/tcp after both agents restarted: not connected")
	}
	if n.a.Probe("x/c", bIP, 80, "tcp", 700*time.Millisecond) {
		t.Error("x/c -> node B x/b 80/tcp after both agents restarted: connected, want denied")
	}

	// Node B judged x/a on the identity that arrived in the VNI.
	var tunnelled, denied bool
	for _, f := range flowsOf(t, n.b) {
		if f.Endpoint != "x/b" || f.Direction != "ingress" || !slices.Contains(f.Flags, "tunnel") {
			continue
		}
		if f.Type == "new" && f.Source.IP == a.IP && f.Source.Identity == uint32(a.Identity) &&
			f.Source.Name == "a" && f.Source.Node == "node-a" {
			tunnelled = true
		}
		if f.Type == "drop" && f.Source.IP == c.IP && f.Source.Identity == uint32(c.Identity) {
			denied = true
		}
	}
	if !tunnelled || !denied {
		t.Errorf("node B's flows: allowed flow from x/a with its tunnel identity %v, denied flow from x/c %v", tunnelled, denied)
	}

	// Fragments: a UDP datagram larger than the pod MTU passes both ways.
	big := make([]byte, 4000)
	for i := range big {
		big[i] = byte(i)
	}
	conn, err := testenv.Dial(a.Netns, "udp", netip.AddrPortFrom(bIP, 80), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echoed := false
	buf := make([]byte, 8000)
	for try := 0; try < 5 && !echoed; try++ {
		if _, err := conn.Write(big); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(time.Second))
		if k, err := conn.Read(buf); err == nil && k == len(big) && string(buf[:k]) == string(big) {
			echoed = true
		}
	}
	if !echoed {
		t.Error("a 4000-byte UDP datagram (fragments) from x/a to x/b was not echoed")
	}

	// x/c sends its own VXLAN packet to node B claiming x/a's identity in the VNI, with an
	// inner UDP datagram from x/a's address to x/b port 80 (which x/a may reach).
	vc, err := testenv.Dial(c.Netns, "udp", netip.AddrPortFrom(n.addrB, overlay.Port), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	forged := vxlanPacket(uint32(a.Identity), netip.MustParseAddr(a.IP), bIP, 40999, 80, []byte("forged"))
	sawForged := func() bool {
		for _, f := range flowsOf(t, n.b) {
			if f.Type == "drop" && f.Reason == "tunnel-untrusted-source" && f.Source.Identity == uint32(a.Identity) && f.Source.Name == "" {
				return true
			}
		}
		return false
	}
	if !testenv.Eventually(5*time.Second, func() bool {
		if _, err := vc.Write(forged); err != nil {
			t.Fatal(err)
		}
		return sawForged()
	}) {
		t.Error("node B did not drop the pod's own VXLAN packet as tunnel-untrusted-source")
	}
	for _, f := range flowsOf(t, n.b) {
		if f.Endpoint == "x/b" && f.Source.Port == 40999 {
			t.Errorf("the pod's own VXLAN packet reached x/b's veth: %+v", f)
		}
	}
}

// With native routing the receiving node takes the source's identity from its address
// (the remote pod declared in its ipcache): the same policy allows and denies the same
// pairs, with no overlay device.
func TestOverlayNative(t *testing.T) {
	n := startTwoNodes(t, overlay.Native)
	_, _, b := n.pods(t)
	bIP := netip.MustParseAddr(b.IP)
	if !n.a.Probe("x/a", bIP, 80, "tcp", 3*time.Second) {
		t.Error("x/a -> node B x/b 80/tcp: not connected")
	}
	if !n.a.Probe("x/a", bIP, 80, "udp", 3*time.Second) {
		t.Error("x/a -> node B x/b 80/udp: not connected")
	}
	if n.a.Probe("x/c", bIP, 80, "tcp", 700*time.Millisecond) {
		t.Error("x/c -> node B x/b 80/tcp: connected, want denied")
	}
	h := testenv.NetlinkHandle(t, endpoint.NetnsPath(n.a.Config.NodeNetns))
	if _, err := h.LinkByName(overlay.DeviceName); err == nil {
		t.Errorf("native routing: %s exists", overlay.DeviceName)
	} else if _, ok := err.(netlink.LinkNotFoundError); !ok {
		t.Fatal(err)
	}
}

// vxlanPacket builds a VXLAN payload (RFC 7348: flags with the VNI bit, VNI) carrying an
// Ethernet frame with an IPv4/UDP datagram from src:sport to dst:dport.
func vxlanPacket(vni uint32, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+14+20+8+len(payload))
	b[0] = 0x08
	binary.BigEndian.PutUint32(b[4:], vni<<8)
	eth := make([]byte, 14)
	copy(eth[0:6], []byte{0x02, 0, 0, 0, 0, 1})
	copy(eth[6:12], []byte{0x02, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(eth[12:], 0x0800)
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	ip[8] = 64
	ip[9] = 17
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	b = append(b, eth...)
	b = append(b, ip...)
	b = append(b, udp...)
	return append(b, payload...)
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
