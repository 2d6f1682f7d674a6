package k8smode

import (
	"testing"

	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// The address of a deleted pod is not handed to a new pod while a node whose agent is
// down still maps it to the old pod's identity (there, the new pod would pass for the old
// one); once that agent is back and has applied a view without the old pod, the address
// is reused. With native routing and IP-in-IP the receiver takes the source's identity
// from its address.
func TestAddressNotReusedWhileNodeDown(t *testing.T) {
	for _, mode := range []overlay.Mode{overlay.IPIP, overlay.Native} {
		t.Run(string(mode), func(t *testing.T) { addressNotReusedWhileNodeDown(t, mode) })
	}
}

func addressNotReusedWhileNodeDown(t *testing.T, mode overlay.Mode) {
	c := startCluster(t, clustertest.Options{Nodes: 2, Tunnel: mode})
	a, cc, b := threePods(t, c)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	c.KubectlApply(allowAToB80)
	waitFor(t, "NetworkPolicy applied", probe{cc, b, 80, "tcp", false})
	check(t, "x/a admitted", []probe{{a, b, 80, "tcp", true}})

	n2.Stop()
	old := a.IP
	c.Delete(a)
	d := c.AddPod(n1, "x", "d", map[string]string{"pod": "d"})
	if d.IP == old {
		t.Fatalf("x/d got x/a's address %v while node %s's agent, which maps it to x/a, is down", old, n2.Name)
	}
	check(t, "node 2's agent down", []probe{{d, b, 80, "tcp", false}, {d, b, 80, "udp", false}})
	st := n1.Status()
	if q := st.Kubernetes.Quarantined; len(q) != 1 || q[0].Address != old.String() {
		t.Errorf("node %s: quarantined %+v, want %v", n1.Name, q, old)
	}

	n2.Start()
	n2.WaitSynced()
	if !testenv.Eventually(propagate, func() bool { return len(n1.Status().Kubernetes.Quarantined) == 0 }) {
		t.Fatalf("node %s: %v still quarantined after node %s's agent returned: %+v", n1.Name, old, n2.Name, n1.Status().Kubernetes.Quarantined)
	}
	e := c.AddPod(n1, "x", "e", map[string]string{"pod": "d"})
	if e.IP != old {
		t.Errorf("x/e got %v, want the released %v", e.IP, old)
	}
	waitRemote(t, c, d, e)
	check(t, "address reused", []probe{{e, b, 80, "tcp", false}, {d, b, 80, "tcp", false}, {cc, b, 80, "tcp", false}})
}
