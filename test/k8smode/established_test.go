package k8smode

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// echoes sends msg on c, an established connection to a pod's echo server, and reports
// whether it comes back within timeout.
func echoes(c net.Conn, msg string, timeout time.Duration) bool {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(msg)); err != nil {
		return false
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return err == nil && string(buf) == msg
}

// dialEcho opens a TCP connection from pod p to to:80 and checks that it echoes.
func dialEcho(t *testing.T, p *clustertest.Pod, to *clustertest.Pod) net.Conn {
	t.Helper()
	c, err := testenv.Dial(p.Netns, "tcp", netip.AddrPortFrom(to.IP, 80), allowWait)
	if err != nil {
		t.Fatalf("%s -> %s:80: %v", p.Key(), to.Key(), err)
	}
	t.Cleanup(func() { c.Close() })
	if !echoes(c, "open\n", allowWait) {
		t.Fatalf("%s -> %s:80: no echo on a new connection", p.Key(), to.Key())
	}
	return c
}

// A pod relabelled while it has an established connection to a pod of another node loses
// that connection when its new identity is not allowed, although the receiving node's
// policy did not change: another pod keeps the old identity, and with it the policy's
// entries, alive. The receiving node checks the connection's packets again on the peer's
// new identity (from the VNI with VXLAN, from the ipcache with native routing) and drops
// them as peer-identity-changed; the pod that kept the old identity keeps its connection.
func TestRelabelCutsEstablishedConnection(t *testing.T) {
	for _, mode := range []overlay.Mode{overlay.VXLAN, overlay.Native} {
		t.Run(string(mode), func(t *testing.T) { relabelCutsEstablished(t, mode) })
	}
}

func relabelCutsEstablished(t *testing.T, mode overlay.Mode) {
	c := startCluster(t, clustertest.Options{Nodes: 2, Tunnel: mode})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	// x/a and x/c share one label set, so one identity, until x/c is relabelled.
	a := c.AddPod(n1, "x", "a", map[string]string{"pod": "a"})
	cc := c.AddPod(n1, "x", "c", map[string]string{"pod": "a"})
	b := c.AddPod(n2, "x", "b", map[string]string{"pod": "b"})
	waitRemote(t, c, a, cc, b)
	c.KubectlApply(allowAToB80)
	waitFor(t, "NetworkPolicy applied", probe{a, b, 81, "tcp", false})

	fromA, fromC := dialEcho(t, a, b), dialEcho(t, cc, b)
	before, _ := n2.Remote("x", "c")
	c.Label(cc, "pod=c")
	if !testenv.Eventually(propagate, func() bool {
		r, ok := n2.Remote("x", "c")
		return ok && r.Identity != before.Identity
	}) {
		t.Fatalf("node %s: x/c's identity did not change (was %d)", n2.Name, before.Identity)
	}
	i := 0
	if !testenv.Eventually(propagate, func() bool {
		i++
		return !echoes(fromC, fmt.Sprintf("c-%04d\n", i), time.Second)
	}) {
		t.Fatalf("%s's established connection to %s still echoes %v after its relabel", cc.Key(), b.Key(), propagate)
	}
	// Cut, not delayed: nothing of what it sent comes back (its retransmissions are
	// dropped too).
	fromC.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := fromC.Read(make([]byte, 64)); err == nil {
		t.Errorf("%s's connection after the cut: read %d bytes", cc.Key(), n)
	}
	if !echoes(fromA, "a-still\n", allowWait) {
		t.Errorf("%s's established connection (identity unchanged) no longer echoes", a.Key())
	}
	check(t, "after relabel", []probe{{a, b, 80, "tcp", true}, {cc, b, 80, "tcp", false}})

	// The receiving node says why.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	found := false
	err := n2.Client.Observe(ctx, api.ObserveRequest{SinceStart: true}, func(f api.Flow) error {
		if f.Reason == "peer-identity-changed" && f.Source.IP == cc.IP.String() && f.Dest.Port == 80 {
			found = true
		}
		return nil
	})
	if err != nil {
		t.Fatalf("observe on %s: %v", n2.Name, err)
	}
	if !found {
		t.Errorf("node %s: no peer-identity-changed drop of %s's connection among its flows", n2.Name, cc.Key())
	}
}
