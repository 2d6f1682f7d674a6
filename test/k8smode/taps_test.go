package k8smode

import (
	"context"
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// tapWeb mirrors shop/b's TCP port 80, both ways, to the monitor pod sec/ids.
var tapWeb = mirrorPort80("web", "shop/b")

// mirrorPort80 is TapContract name mirroring TCP port 80 of endpoint source, both ways,
// to the monitor pod sec/ids.
func mirrorPort80(name, source string) string {
	return `apiVersion: rampart.io/v1alpha1
kind: TapContract
metadata: {name: ` + name + `}
spec:
  source: {endpoint: ` + source + `}
  monitor: sec/ids
  match: {protocol: TCP, ports: [80]}
  action: Mirror
`
}

// tapBad names ports without a port protocol: the schema lets it through, the parser
// refuses it naming spec.match.ports.
const tapBad = `apiVersion: rampart.io/v1alpha1
kind: TapContract
metadata: {name: bad}
spec:
  source: {endpoint: shop/a}
  monitor: sec/ids
  match: {ports: [80]}
  action: Mirror
`

// capture counts the IPv4 TCP packets between two addresses that a monitor receives on
// its tap-rx, read with an AF_PACKET socket in the monitor pod's namespace.
type capture struct{ s *testenv.Sniffer }

func newCapture(t *testing.T, netnsPath string) *capture {
	t.Helper()
	return &capture{s: testenv.NewSniffer(t, netnsPath, endpoint.MonitorRxIfName)}
}

// count reads what arrived since the last call and counts the TCP packets between x and
// y (either way) with port on either side.
func (c *capture) count(t *testing.T, x, y netip.Addr, port uint16) int {
	t.Helper()
	n := 0
	for _, f := range c.s.Frames(t) {
		if len(f) < 14+20 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[14+9] != unix.IPPROTO_TCP {
			continue
		}
		ihl := int(f[14]&0x0f) * 4
		if len(f) < 14+ihl+4 {
			continue
		}
		src, dst := netip.AddrFrom4([4]byte(f[26:30])), netip.AddrFrom4([4]byte(f[30:34]))
		sport, dport := binary.BigEndian.Uint16(f[14+ihl:]), binary.BigEndian.Uint16(f[14+ihl+2:])
		if (src == x && dst == y || src == y && dst == x) && (sport == port || dport == port) {
			n++
		}
	}
	return n
}

// waitCopies connects from to to's port until the monitor has received copies of a
// connection, and returns how many it received.
func (c *capture) waitCopies(t *testing.T, from, to *clustertest.Pod, port uint16) int {
	t.Helper()
	copies := 0
	if !testenv.Eventually(propagate, func() bool {
		if !from.Probe(to.IP, port, "tcp", allowWait) {
			t.Fatalf("%s -> %s:%d failed with a mirror tap", from.Key(), to.Key(), port)
		}
		copies += c.count(t, from.IP, to.IP, port)
		return copies > 0
	}) {
		t.Fatalf("the monitor received no copy of %s -> %s:%d", from.Key(), to.Key(), port)
	}
	return copies
}

func listTaps(t *testing.T, n *clustertest.Node) []api.Tap {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ts, err := n.Client.ListTaps(ctx)
	if err != nil {
		t.Fatalf("node %s: listing taps: %v", n.Name, err)
	}
	return ts
}

// A monitor pod (annotation rampart.io/monitor) and two pods on one node: the CNI ADD
// makes the monitor with its tap interfaces, the other node knows it as a remote monitor.
// A TapContract applied with kubectl mirrors shop/b's TCP 80 into the monitor's tap-rx
// (and nothing of port 81); deleted, the copies stop. A TapContract the parser refuses
// is reported with a PolicyRefused Event naming the field, and nothing of it applies. A
// TrafficControl applied with kubectl mirrors as well.
func TestTapContractFromAPI(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ids := c.AddAnnotatedPod(n1, "sec", "ids", map[string]string{"app": "ids"}, map[string]string{agent.MonitorAnnotation: "true"})
	a := c.AddPod(n1, "shop", "a", map[string]string{"app": "client"})
	b := c.AddPod(n1, "shop", "b", map[string]string{"app": "web"})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ep, err := n1.Client.GetEndpoint(ctx, "sec", "ids"); err != nil || !ep.Monitor {
		t.Fatalf("the monitor pod's endpoint: %+v, %v; want a monitor", ep, err)
	}
	if !testenv.Eventually(propagate, func() bool { r, ok := n2.Remote("sec", "ids"); return ok && r.Monitor }) {
		t.Fatalf("node %s does not know sec/ids as a remote monitor", n2.Name)
	}
	if r, _ := n2.Remote("shop", "a"); r.Monitor {
		t.Errorf("node %s: shop/a, not annotated, is a monitor", n2.Name)
	}
	capt := newCapture(t, ids.Netns)

	c.KubectlApply(tapWeb)
	if !testenv.Eventually(propagate, func() bool {
		ts := listTaps(t, n1)
		return len(ts) == 1 && ts[0].Name == "web" && slices.Equal(ts[0].Endpoints, []string{"shop/b"}) && ts[0].MonitorProblem == ""
	}) {
		t.Fatalf("node %s did not take TapContract web: %+v\n%s", n1.Name, listTaps(t, n1), n1.Log())
	}
	capt.count(t, a.IP, b.IP, 80)
	copies := capt.waitCopies(t, a, b, 80)
	t.Logf("the monitor received %d copies of %s -> %s:80", copies, a.Key(), b.Key())
	// A connect, the echo and the close: both ways, several packets.
	if copies < 4 {
		t.Errorf("the monitor received %d copies of a connection, want both directions", copies)
	}
	if !a.Probe(b.IP, 81, "tcp", allowWait) {
		t.Fatalf("%s -> %s:81 failed", a.Key(), b.Key())
	}
	if n := capt.count(t, a.IP, b.IP, 81); n != 0 {
		t.Errorf("the monitor received %d packets of port 81, which the contract does not match", n)
	}
	if ts := listTaps(t, n1); ts[0].Counters == nil || ts[0].Counters.MirroredPackets == 0 {
		t.Errorf("tap web's counters: %+v", ts[0].Counters)
	}
	// The other node has no endpoint the contract taps, and accepted it all the same (once
	// its own informers have the contract: it syncs on its own).
	var ts2 []api.Tap
	if !testenv.Eventually(propagate, func() bool {
		ts2 = listTaps(t, n2)
		return len(ts2) == 1 && len(ts2[0].Endpoints) == 0 && ts2[0].MonitorNode == n1.Name
	}) {
		t.Errorf("node %s: taps %+v, want web with no local endpoint and its monitor on %s", n2.Name, ts2, n1.Name)
	}

	c.KubectlApply(tapBad)
	if !testenv.Eventually(propagate, func() bool {
		evs, err := c.Client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
		return err == nil && slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
			return e.Reason == "PolicyRefused" && e.InvolvedObject.Kind == "TapContract" && e.InvolvedObject.Name == "bad" &&
				e.InvolvedObject.APIVersion == "rampart.io/v1alpha1" && strings.Contains(e.Message, "spec.match.ports")
		})
	}) {
		t.Error("no PolicyRefused event on TapContract bad naming spec.match.ports")
	}
	for _, n := range c.Nodes {
		st := n.Status()
		if st.Kubernetes == nil || !slices.ContainsFunc(st.Kubernetes.Refused, func(r api.RefusedObject) bool {
			return strings.Contains(r.Object, "TapContract//bad") && strings.Contains(r.Error, "spec.match.ports")
		}) {
			t.Errorf("node %s: status does not report TapContract bad: %+v", n.Name, st.Kubernetes)
		}
		if ts := listTaps(t, n); len(ts) != 1 {
			t.Errorf("node %s: taps %+v, want web only", n.Name, ts)
		}
	}

	c.KubectlDelete(tapWeb)
	if !testenv.Eventually(propagate, func() bool { return len(listTaps(t, n1)) == 0 }) {
		t.Fatalf("node %s still has TapContract web after its deletion: %+v", n1.Name, listTaps(t, n1))
	}
	capt.count(t, a.IP, b.IP, 80)
	for range 3 {
		if !a.Probe(b.IP, 80, "tcp", allowWait) {
			t.Fatalf("%s -> %s:80 failed after the tap's deletion", a.Key(), b.Key())
		}
	}
	if n := capt.count(t, a.IP, b.IP, 80); n != 0 {
		t.Errorf("the monitor received %d copies after the TapContract's deletion", n)
	}

	// Antrea's TrafficControl, served as a CRD too: all of shop/b's ingress.
	c.KubectlApply(trafficControl)
	if !testenv.Eventually(propagate, func() bool {
		ts := listTaps(t, n1)
		return len(ts) == 1 && ts[0].Kind == "TrafficControl" && slices.Equal(ts[0].Endpoints, []string{"shop/b"}) && ts[0].MonitorProblem == ""
	}) {
		t.Fatalf("node %s did not take TrafficControl web-in: %+v", n1.Name, listTaps(t, n1))
	}
	capt.waitCopies(t, a, b, 81)
}

// trafficControl mirrors what pods app=web receive to sec/ids.
const trafficControl = `apiVersion: crd.antrea.io/v1alpha2
kind: TrafficControl
metadata: {name: web-in}
spec:
  appliedTo: {podSelector: {matchLabels: {app: web}}}
  direction: Ingress
  action: Mirror
  targetPort: {device: {name: sec/ids}}
`

// tapRemote mirrors shop/d's TCP port 80, both ways, to the monitor pod sec/ids, which runs
// on another node.
var tapRemote = mirrorPort80("remote", "shop/d")

// A monitor pod on one node receives the copies of a pod on another through the tap
// tunnel (VXLAN between the nodes): the contract names the monitor's node on the source's
// node, the copies are those of the source's connection, and they stop with the contract.
// A redirect through that monitor is not installed: its traffic stops (fail closed) and
// the contract says why.
func TestTapContractMonitorOnAnotherNode(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2, Tunnel: overlay.VXLAN})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ids := c.AddAnnotatedPod(n1, "sec", "ids", map[string]string{"app": "ids"}, map[string]string{agent.MonitorAnnotation: "true"})
	a := c.AddPod(n1, "shop", "a", map[string]string{"app": "client"})
	d := c.AddPod(n2, "shop", "d", map[string]string{"app": "web"})
	capt := newCapture(t, ids.Netns)

	c.KubectlApply(tapRemote)
	if !testenv.Eventually(propagate, func() bool {
		ts := listTaps(t, n2)
		return len(ts) == 1 && slices.Equal(ts[0].Endpoints, []string{"shop/d"}) && ts[0].MonitorNode == n1.Name && ts[0].MonitorProblem == ""
	}) {
		t.Fatalf("node %s did not take TapContract remote with its monitor on %s: %+v", n2.Name, n1.Name, listTaps(t, n2))
	}
	copies := capt.waitCopies(t, a, d, 80)
	t.Logf("the monitor on %s received %d copies of %s -> %s:80 tapped on %s", n1.Name, copies, a.Key(), d.Key(), n2.Name)
	if copies < 4 {
		t.Errorf("the monitor received %d copies of a connection, want both directions", copies)
	}
	if ts := listTaps(t, n2); ts[0].Counters == nil || ts[0].Counters.MirroredPackets == 0 || ts[0].Counters.CopiesLost != 0 {
		t.Errorf("tap remote's counters on %s: %+v", n2.Name, ts[0].Counters)
	}

	c.KubectlApply(strings.Replace(tapRemote, "action: Mirror", "action: Redirect", 1))
	if !testenv.Eventually(propagate, func() bool {
		ts := listTaps(t, n2)
		return len(ts) == 1 && strings.Contains(ts[0].MonitorProblem, "a redirect goes through a monitor on its source's node only")
	}) {
		t.Fatalf("node %s: a redirect through a monitor on %s: %+v", n2.Name, n1.Name, listTaps(t, n2))
	}
	if a.Probe(d.IP, 80, "tcp", allowWait) {
		t.Errorf("a redirect whose monitor is on another node let %s -> %s:80 pass", a.Key(), d.Key())
	}

	c.KubectlDelete(tapRemote)
	if !testenv.Eventually(propagate, func() bool { return len(listTaps(t, n2)) == 0 }) {
		t.Fatalf("node %s still has TapContract remote: %+v", n2.Name, listTaps(t, n2))
	}
	capt.count(t, a.IP, d.IP, 80)
	if !a.Probe(d.IP, 80, "tcp", allowWait) {
		t.Fatalf("%s -> %s:80 failed after the tap's deletion", a.Key(), d.Key())
	}
	if n := capt.count(t, a.IP, d.IP, 80); n != 0 {
		t.Errorf("the monitor received %d copies after the TapContract's deletion", n)
	}
}
