// Package k8smode tests rampartd in Kubernetes mode against a real API server and etcd,
// with real packets between pods on different nodes.
package k8smode

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// nodesEnv chooses the nodes the tests run on: simulated by default (the test plays the
// container runtime's network part, with exact control of each pod's life), or, with
// "real", real nodes (kubelet, containerd and kube-proxy in each node's namespace:
// nodetest), where the kubelet runs the same pods.
const nodesEnv = "RAMPART_K8SMODE_NODES"

// startCluster starts the cluster a test runs on, of the nodes nodesEnv chooses.
func startCluster(t *testing.T, opts clustertest.Options) *clustertest.Cluster {
	t.Helper()
	if os.Getenv(nodesEnv) != "real" {
		return clustertest.Start(t, opts)
	}
	// The Service translation's cgroup is the lab's, where its kubelets run the pods.
	var flags []string
	for i := 0; i < len(opts.AgentFlags); i++ {
		if opts.AgentFlags[i] == "--service-cgroup" {
			i++
			continue
		}
		flags = append(flags, opts.AgentFlags[i])
	}
	return nodetest.Start(t, nodetest.Options{Nodes: opts.Nodes, Tunnel: opts.Tunnel, AgentFlags: flags}).Cluster
}

func TestMain(m *testing.M) {
	code := m.Run()
	clustertest.Bins.Remove()
	os.Exit(code)
}

// Probe timeouts: an allowed connection answers well within allowWait; a denied one is
// given denyWait to prove it does not.
const (
	allowWait = 3 * time.Second
	denyWait  = 700 * time.Millisecond
	// propagate bounds how long a change in the API takes to be enforced on every node.
	propagate = 20 * time.Second
)

// probe is one connection attempt and the outcome wanted.
type probe struct {
	from  *clustertest.Pod
	to    *clustertest.Pod
	port  uint16
	proto string
	want  bool
}

func (p probe) String() string {
	return fmt.Sprintf("%s (%s) -> %s (%s) %d/%s", p.from.Key(), p.from.Node.Name, p.to.Key(), p.to.Node.Name, p.port, p.proto)
}

// check runs the probes in parallel and reports each whose outcome is not the wanted one.
func check(t *testing.T, what string, probes []probe) {
	t.Helper()
	got := make([]bool, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Go(func() {
			timeout := allowWait
			if !p.want {
				timeout = denyWait
			}
			got[i] = p.from.Probe(p.to.IP, p.port, p.proto, timeout)
		})
	}
	wg.Wait()
	for i, p := range probes {
		if got[i] != p.want {
			t.Errorf("%s: %v: connected %v, want %v", what, p, got[i], p.want)
		}
	}
}

// waitFor polls one probe until it has the wanted outcome (a change propagating).
func waitFor(t *testing.T, what string, p probe) {
	t.Helper()
	timeout := allowWait
	if !p.want {
		timeout = denyWait
	}
	if !testenv.Eventually(propagate, func() bool { return p.from.Probe(p.to.IP, p.port, p.proto, timeout) == p.want }) {
		t.Fatalf("%s: %v: still not connected=%v after %v", what, p, p.want, propagate)
	}
}

// waitRemote waits until every node knows every pod of the others (with its address).
func waitRemote(t *testing.T, c *clustertest.Cluster, pods ...*clustertest.Pod) {
	t.Helper()
	for _, n := range c.Nodes {
		for _, p := range pods {
			if p.Node == n {
				continue
			}
			if !testenv.Eventually(propagate, func() bool {
				r, ok := n.Remote(p.Namespace, p.Name)
				return ok && r.IP == p.IP.String() && r.Identity != 0
			}) {
				t.Fatalf("node %s does not know pod %s on %s", n.Name, p.Key(), p.Node.Name)
			}
		}
	}
}

// allowAToB80: x/b admits x/a on port 80, TCP and UDP.
var allowAToB80 = testenv.AllowAToB80

const cnpCToB81 = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-from-c, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {pod: c}}]
    toPorts: [{ports: [{port: "81", protocol: TCP}]}]
`

// threePods makes x/a and x/c on the first node, x/b on the second, and waits until each
// node knows the others' pods.
func threePods(t *testing.T, c *clustertest.Cluster) (a, cc, b *clustertest.Pod) {
	t.Helper()
	n1, n2 := c.Nodes[0], c.Nodes[1]
	a = c.AddPod(n1, "x", "a", map[string]string{"pod": "a"})
	cc = c.AddPod(n1, "x", "c", map[string]string{"pod": "c"})
	b = c.AddPod(n2, "x", "b", map[string]string{"pod": "b"})
	waitRemote(t, c, a, cc, b)
	return a, cc, b
}

// kubectl apply of a NetworkPolicy and of a CiliumNetworkPolicy selecting pods across
// two nodes: the allowed pairs connect, the denied ones do not; kubectl delete brings the
// pairs back to allowed.
// With native routing and IP-in-IP (the receiver takes the source's identity from its
// address) and VXLAN (the identity travels in the VNI: the nodes must agree on numbers).
func TestKubectlPolicyAcrossNodes(t *testing.T) {
	for _, mode := range []overlay.Mode{overlay.Native, overlay.VXLAN, overlay.IPIP} {
		t.Run(string(mode), func(t *testing.T) { kubectlPolicyAcrossNodes(t, mode) })
	}
}

func kubectlPolicyAcrossNodes(t *testing.T, mode overlay.Mode) {
	c := startCluster(t, clustertest.Options{Nodes: 2, Tunnel: mode})
	a, cc, b := threePods(t, c)

	check(t, "no policy", []probe{{a, b, 80, "tcp", true}, {cc, b, 80, "tcp", true}, {b, a, 81, "tcp", true}})

	c.KubectlApply(allowAToB80)
	waitFor(t, "NetworkPolicy applied", probe{cc, b, 80, "tcp", false})
	check(t, "NetworkPolicy", []probe{
		{a, b, 80, "tcp", true}, {a, b, 80, "udp", true},
		{a, b, 81, "tcp", false}, {a, b, 81, "udp", false},
		{cc, b, 80, "tcp", false}, {cc, b, 80, "udp", false},
		{b, a, 80, "tcp", true}, // a is selected by no policy
	})

	c.KubectlApply(cnpCToB81)
	waitFor(t, "CiliumNetworkPolicy applied", probe{cc, b, 81, "tcp", true})
	check(t, "NetworkPolicy and CiliumNetworkPolicy", []probe{
		{a, b, 80, "tcp", true}, {cc, b, 81, "tcp", true},
		{a, b, 81, "tcp", false}, {cc, b, 80, "tcp", false},
	})

	c.KubectlDelete(allowAToB80)
	c.KubectlDelete(cnpCToB81)
	waitFor(t, "policies deleted", probe{cc, b, 80, "tcp", true})
	check(t, "policies deleted", []probe{{a, b, 81, "tcp", true}, {cc, b, 80, "tcp", true}})
}

// A pod relabelled with kubectl label gets a new identity on every node, and enforcement
// follows its new labels.
func TestRelabelPod(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2, Tunnel: overlay.VXLAN})
	a, cc, b := threePods(t, c)
	c.KubectlApply(allowAToB80)
	waitFor(t, "NetworkPolicy applied", probe{cc, b, 80, "tcp", false})
	check(t, "before relabel", []probe{{a, b, 80, "tcp", true}, {cc, b, 80, "tcp", false}})

	n1, n2 := c.Nodes[0], c.Nodes[1]
	before, _ := n2.Remote("x", "c")
	c.Label(cc, "pod=a")
	if !testenv.Eventually(propagate, func() bool {
		r, ok := n2.Remote("x", "c")
		return ok && r.Labels["pod"] == "a" && r.Identity != before.Identity
	}) {
		t.Fatalf("node %s: x/c's labels or identity did not change (was %d)", n2.Name, before.Identity)
	}
	waitFor(t, "x/c relabelled pod=a", probe{cc, b, 80, "tcp", true})
	// x/c's identity on its own node is the one of x/a's label set now, as on node 2.
	ra, _ := n2.Remote("x", "a")
	rc, _ := n2.Remote("x", "c")
	if ra.Identity != rc.Identity {
		t.Errorf("node %s: x/a identity %d, x/c (same labels now) %d", n2.Name, ra.Identity, rc.Identity)
	}
	// Its number is the cluster's: the same on its own node and on the other.
	ep, err := n1.Client.GetEndpoint(context.Background(), "x", "c")
	if err != nil {
		t.Fatal(err)
	}
	if uint32(ep.Identity) != rc.Identity {
		t.Errorf("x/c: identity %d on its node %s, %d on node %s", ep.Identity, n1.Name, rc.Identity, n2.Name)
	}
	check(t, "after relabel", []probe{{a, b, 80, "tcp", true}, {cc, b, 80, "tcp", true}, {cc, b, 81, "tcp", false}})
}
