package k8smode

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/k8s/identities"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// What operators see in Kubernetes mode: status shows the node's view of the cluster;
// node and remote lists show what came from the API; observe and trace name the pods of
// other nodes with their node; the local API refuses writes to what Kubernetes owns.
func TestOperationsView(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2, Tunnel: overlay.VXLAN})
	a, cc, b := threePods(t, c)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	c.KubectlApply(allowAToB80)
	waitFor(t, "NetworkPolicy applied", probe{cc, b, 80, "tcp", false})
	check(t, "NetworkPolicy", []probe{{a, b, 80, "tcp", true}, {cc, b, 80, "tcp", false}})

	st := n2.Status()
	k := st.Kubernetes
	if k == nil || k.NodeName != n2.Name || k.NodeAddress != n2.Address.String() || k.Nodes != 1 || k.RemoteEndpoints != 2 ||
		!k.Synced || k.Syncs == 0 || k.LastSync.IsZero() || k.LastError != "" {
		t.Errorf("node 2 status: %+v", k)
	}
	if st.PodCIDR != n2.PodCIDR.String() {
		t.Errorf("node 2 pod CIDR %s, want %s (from its Node object)", st.PodCIDR, n2.PodCIDR)
	}
	if st.Identities < 3 {
		t.Errorf("node 2: %d identities, want at least the three pods'", st.Identities)
	}
	out := n2.CLI("status")
	for _, want := range []string{"Kubernetes node:", n2.Name + " (" + n2.Address.String() + ")", "1 other nodes, 2 remote pods", "Sync:", "synced"} {
		if !strings.Contains(out, want) {
			t.Errorf("rampart status on node 2 lacks %q:\n%s", want, out)
		}
	}
	out = n2.CLI("node", "list")
	if !strings.Contains(out, n1.Name) || !strings.Contains(out, n1.Address.String()) || !strings.Contains(out, n1.PodCIDR.String()) {
		t.Errorf("rampart node list on node 2:\n%s", out)
	}
	out = n2.CLI("remote", "list")
	for _, p := range []*clustertest.Pod{a, cc} {
		if !strings.Contains(out, p.Key()) || !strings.Contains(out, p.IP.String()) {
			t.Errorf("rampart remote list on node 2 lacks %s (%s):\n%s", p.Key(), p.IP, out)
		}
	}

	// Flows on node 2 name x/a and x/c with their node and their cluster identity.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var flows []api.Flow
	if err := n2.Client.Observe(ctx, api.ObserveRequest{SinceStart: true}, func(f api.Flow) error {
		flows = append(flows, f)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	named := func(p *clustertest.Pod, typ string) bool {
		return slices.ContainsFunc(flows, func(f api.Flow) bool {
			return f.Type == typ && f.Source.IP == p.IP.String() && f.Source.Name == p.Name && f.Source.Node == n1.Name &&
				f.Source.Identity == p.Identity
		})
	}
	if !named(a, "new") || !named(cc, "drop") {
		t.Errorf("node 2's flows do not name x/a (allowed) and x/c (dropped) with node %s and their identities", n1.Name)
	}
	// Trace from a pod of the other node, by address.
	for _, tc := range []struct {
		from  *clustertest.Pod
		allow bool
	}{{a, true}, {cc, false}} {
		res, err := n2.Client.Trace(ctx, api.TraceRequest{From: tc.from.IP.String(), To: b.Key(), Port: 80, Protocol: "TCP"})
		if err != nil {
			t.Fatalf("trace %s -> %s: %v", tc.from.Key(), b.Key(), err)
		}
		if res.FromIdent != tc.from.Identity {
			t.Errorf("trace on node 2 from %s (%s): identity %d, want the cluster's %d", tc.from.IP, tc.from.Key(), res.FromIdent, tc.from.Identity)
		}
		if res.Allowed != tc.allow {
			t.Errorf("trace on node 2 %s -> %s 80/TCP: allowed %v, want %v", tc.from.Key(), b.Key(), res.Allowed, tc.allow)
		}
	}

	// The local API does not write what Kubernetes owns.
	for what, err := range map[string]error{
		"node add": func() error {
			_, err := n2.Client.PutNode(ctx, "other", api.NodeSpec{Address: "198.19.254.99"})
			return err
		}(),
		"node delete":   n2.Client.DeleteNode(ctx, n1.Name),
		"remote delete": n2.Client.DeleteRemoteEndpoint(ctx, "x", "a"),
		"namespace label": func() error {
			_, err := n2.Client.LabelNamespace(ctx, "x", api.LabelChange{Set: map[string]string{"a": "b"}})
			return err
		}(),
	} {
		if ae, ok := err.(*api.Error); !ok || ae.Status != 409 {
			t.Errorf("%s in Kubernetes mode: %v, want 409", what, err)
		}
	}
	if _, ok := n2.Remote("x", "a"); !ok {
		t.Error("x/a left node 2's remote pods")
	}
}

// A CNI ADD for a pod the API does not have fails after a bounded wait, and leaves no
// endpoint: never an endpoint without the labels policy selects on.
func TestCNIAddWithoutPodFails(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2})
	n := c.Nodes[0]
	c.EnsureNamespace("x", nil)
	netns := testenv.NewNetns(t, "rp-"+testenv.Suffix(6)+"-ghost")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	_, err := n.Client.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "ghost" + testenv.Suffix(6), IfName: "eth0", Netns: netns,
		PodNamespace: "x", PodName: "ghost"})
	took := time.Since(began)
	ae, ok := err.(*api.Error)
	if !ok || ae.Status != 503 || !strings.Contains(ae.Message, "x/ghost") {
		t.Fatalf("CNI ADD of a pod the API does not have: %v, want 503 naming x/ghost", err)
	}
	if took < agent.CNIPodWait || took > agent.CNIPodWait+10*time.Second {
		t.Errorf("CNI ADD failed after %v, want about %v", took, agent.CNIPodWait)
	}
	eps, err := n.Client.ListEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 0 {
		t.Errorf("endpoints after a failed CNI ADD: %+v", eps)
	}
	// Without the pod's name the ADD is refused at once.
	_, err = n.Client.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "anon" + testenv.Suffix(6), IfName: "eth0", Netns: netns})
	if ae, ok := err.(*api.Error); !ok || ae.Status != 400 {
		t.Errorf("CNI ADD naming no pod in Kubernetes mode: %v, want 400", err)
	}
}

// A pod's identity is collected once no pod uses its label set for the grace period, and
// not before: the collector's InUse comes from the agents' pod and namespace caches.
func TestUnusedIdentityCollected(t *testing.T) {
	const grace = 3 * time.Second
	c := startCluster(t, clustertest.Options{Nodes: 2, AgentFlags: []string{"--identity-grace", grace.String()}})
	c.EnsureNamespace("x", nil)
	keep := c.AddPod(c.Nodes[0], "x", "keep", map[string]string{"pod": "keep"})
	gone := c.AddPod(c.Nodes[1], "x", "gone", map[string]string{"pod": "gone"})
	setOf := func(p *clustertest.Pod, l map[string]string) string {
		return identities.SetName(identity.LabelsKey(labels.ForPod(p.Namespace, l, labels.Labels{labels.KeyNamespaceName: p.Namespace}, "")))
	}
	exists := func(name string) bool {
		_, err := c.Dynamic(t).Resource(identities.IdentityResource).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil
	}
	keepSet, goneSet := setOf(keep, map[string]string{"pod": "keep"}), setOf(gone, map[string]string{"pod": "gone"})
	if !exists(keepSet) || !exists(goneSet) {
		t.Fatalf("SecurityIdentities of the two pods: %v %v", exists(keepSet), exists(goneSet))
	}
	c.Delete(gone)
	if !testenv.Eventually(grace+time.Minute, func() bool { return !exists(goneSet) }) {
		t.Fatal("the identity of the deleted pod's label set was not collected")
	}
	if !exists(keepSet) {
		t.Error("the identity of a pod still running was collected")
	}
}
