package k8smode

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// corpusFiles are manifests of the policy corpus (published examples) that kubectl
// applies as they are: their policies, as the agent got them from the API, must be the
// policies `rampart apply -f` of the same file parses (rule for rule).
var corpusFiles = []string{
	"k8s-docs/networkpolicy.yaml",
	"k8s-docs/network-policy-default-deny-ingress.yaml",
	"k8s-docs/networkpolicy-multiport-egress.yaml",
	"cilium-examples/policies/l4/l4.yaml",
	"cilium-examples/policies/l3/match-expressions/and-statement.yaml",
	"cilium-examples/policies/kubernetes/clusterwide/clusterscope-policy.yaml",
	"cilium-examples/policies/l3/cidr/cidr.yaml",
}

func policies(t *testing.T, n *clustertest.Node) []api.Policy {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ps, err := n.Client.ListPolicies(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// kubectl apply -f X and rampart apply -f X give the same policies.
func TestKubectlApplyMatchesRampartApply(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2})
	root := filepath.Join(testenv.ModuleRoot(t), "internal", "policy", "testdata", "manifests")
	want := map[string]string{} // kind/ns/name -> formatted rules
	for _, f := range corpusFiles {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		docs, err := policy.Parse(f, data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, p := range docs.Policies {
			want[string(p.Kind)+"/"+p.Namespace+"/"+p.Name] = rulesOf(p)
			if p.Namespace != "" {
				c.EnsureNamespace(p.Namespace, nil)
			}
		}
		c.KubectlApply(string(data))
	}
	for _, n := range c.Nodes {
		var got map[string]string
		ok := testenv.Eventually(propagate, func() bool {
			got = map[string]string{}
			for _, ap := range policies(t, n) {
				docs, err := policy.Parse("agent", ap.Raw)
				if err != nil || len(docs.Policies) != 1 {
					t.Fatalf("node %s: policy %s/%s as stored does not parse: %v", n.Name, ap.Namespace, ap.Name, err)
				}
				got[ap.Kind+"/"+ap.Namespace+"/"+ap.Name] = rulesOf(docs.Policies[0])
			}
			return len(got) == len(want)
		})
		if !ok {
			t.Fatalf("node %s has %d policies, want %d", n.Name, len(got), len(want))
		}
		for key, w := range want {
			if got[key] != w {
				t.Errorf("node %s: %s from the API:\n%s\nwant (rampart apply):\n%s", n.Name, key, got[key], w)
			}
		}
	}
}

func rulesOf(p *policy.Policy) string {
	var b strings.Builder
	for _, r := range p.Rules {
		b.WriteString(policy.FormatRule(r))
	}
	return b.String()
}

// A policy object the parser refuses (a CRD the API server accepts, with a field Rampart
// does not support) is not applied and is reported in status and as an Event; the other
// objects apply, and the agents keep running.
func TestRefusedPolicyReported(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2})
	a, cc, b := threePods(t, c)
	const refused = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: services, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  egress:
  - toServices: [{k8sService: {serviceName: web, namespace: x}}]
`
	c.KubectlApply(refused)
	c.KubectlApply(allowAToB80)
	waitFor(t, "NetworkPolicy applied beside a refused one", probe{cc, b, 80, "tcp", false})
	// The refused policy would make x/a default-deny for egress: x/a still reaches x/b.
	check(t, "refused CiliumNetworkPolicy not applied", []probe{{a, b, 80, "tcp", true}, {a, cc, 81, "tcp", true}})
	for _, n := range c.Nodes {
		var st api.Status
		if !testenv.Eventually(propagate, func() bool {
			st = n.Status()
			return st.Kubernetes != nil && len(st.Kubernetes.Refused) == 1
		}) {
			t.Fatalf("node %s: status does not report the refused policy: %+v", n.Name, st.Kubernetes)
		}
		r := st.Kubernetes.Refused[0]
		if !strings.Contains(r.Object, "CiliumNetworkPolicy/x/services") || !strings.Contains(r.Error, "toServices") {
			t.Errorf("node %s: refused %+v, want CiliumNetworkPolicy x/services for toServices", n.Name, r)
		}
		for _, p := range policies(t, n) {
			if p.Name == "services" {
				t.Errorf("node %s applied the refused policy", n.Name)
			}
		}
	}
	if !testenv.Eventually(propagate, func() bool {
		evs, err := c.Client.CoreV1().Events("x").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		return slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
			return e.Reason == "PolicyRefused" && e.InvolvedObject.Name == "services" && strings.Contains(e.Message, "toServices")
		})
	}) {
		t.Error("no PolicyRefused event on CiliumNetworkPolicy x/services")
	}
	// The local API cannot change what Kubernetes owns.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.Nodes[0].Client.Apply(ctx, api.ApplyRequest{Documents: []api.Document{{Source: "x.yaml", Data: allowAToB80}}})
	if ae, ok := err.(*api.Error); !ok || ae.Status != 409 || !strings.Contains(ae.Message, "managed by the Kubernetes API") {
		t.Errorf("rampart apply in Kubernetes mode: %v, want 409 managed by the Kubernetes API", err)
	}
	// Both nodes refused the same version for the same reason: one Event says so, not one
	// per node.
	evs, err := c.Client.CoreV1().Events("x").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.Reason == "PolicyRefused" && e.InvolvedObject.Name == "services" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d PolicyRefused events on x/services from %d nodes, want 1", n, len(c.Nodes))
	}
}

// A CiliumCIDRGroup referenced by a CiliumNetworkPolicy: x/b admits the addresses of the
// group (x/a's) on port 81 and nothing else there.
func TestCIDRGroupReference(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2})
	a, cc, b := threePods(t, c)
	manifest := `apiVersion: cilium.io/v2
kind: CiliumCIDRGroup
metadata: {name: trusted}
spec:
  externalCIDRs: [` + a.IP.String() + `/32]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-from-trusted, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: b}}
  ingress:
  - fromCIDRSet: [{cidrGroupRef: trusted}]
    toPorts: [{ports: [{port: "81", protocol: TCP}]}]
`
	c.KubectlApply(manifest)
	waitFor(t, "CIDR group policy applied", probe{cc, b, 81, "tcp", false})
	check(t, "CIDR group", []probe{{a, b, 81, "tcp", true}, {a, b, 80, "tcp", false}, {cc, b, 81, "tcp", false}})
}

// A Node deleted from the API: its pods leave every other node's ipcache, and the pods
// there no longer reach them.
func TestNodeDeleted(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 3})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	p1 := c.AddPod(n1, "x", "p1", map[string]string{"pod": "p1"})
	p2 := c.AddPod(n2, "x", "p2", map[string]string{"pod": "p2"})
	p3 := c.AddPod(n3, "x", "p3", map[string]string{"pod": "p3"})
	waitRemote(t, c, p1, p2, p3)
	check(t, "three nodes", []probe{{p1, p3, 80, "tcp", true}, {p2, p3, 80, "tcp", true}, {p1, p2, 80, "tcp", true}})

	n3.Stop() // its agent goes with it, as a real node's would
	if err := c.Client.CoreV1().Nodes().Delete(context.Background(), n3.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*clustertest.Node{n1, n2} {
		if !testenv.Eventually(propagate, func() bool { _, ok := n.Remote("x", "p3"); return !ok }) {
			t.Errorf("node %s still has x/p3 of the deleted node", n.Name)
		}
		if !testenv.Eventually(propagate, func() bool {
			ns, err := n.Client.ListNodes(context.Background())
			return err == nil && !slices.ContainsFunc(ns, func(x api.Node) bool { return x.Name == n3.Name })
		}) {
			t.Errorf("node %s still lists node %s", n.Name, n3.Name)
		}
	}
	check(t, "node 3 deleted", []probe{{p1, p3, 80, "tcp", false}, {p2, p3, 80, "tcp", false}, {p1, p2, 80, "tcp", true}})
}

// An invalid update of an enforced policy is refused and its last accepted version stays
// in force, on every node and across restarts of the agents: a restarted agent does not
// forget it (which would leave the pods it selects open).
func TestRefusedUpdateSurvivesRestart(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2})
	a, cc, b := threePods(t, c)
	c.KubectlApply(cnpCToB81)
	waitFor(t, "CiliumNetworkPolicy applied", probe{a, b, 80, "tcp", false})
	records := func() string {
		return c.MustKubectl("get", "acceptedpolicies", "-o", "jsonpath={.items[*].spec.name}")
	}
	// Accepting costs the API server no write: only a refusal records a version.
	if out := records(); out != "" {
		t.Errorf("policy accepted: accepted policies %q, want none", out)
	}
	// The API server takes it (the CRD keeps unknown fields); the agents refuse toServices.
	c.KubectlApply(cnpCToB81 + "  egress:\n  - toServices: [{k8sService: {serviceName: web, namespace: x}}]\n")
	kept := func(what string) {
		t.Helper()
		for _, n := range c.Nodes {
			var st api.Status
			if !testenv.Eventually(propagate, func() bool {
				st = n.Status()
				return st.Kubernetes != nil && st.Kubernetes.Synced && len(st.Kubernetes.Refused) == 1 &&
					strings.Contains(st.Kubernetes.Refused[0].Error, "toServices")
			}) {
				t.Fatalf("%s: node %s does not report the refused update: %+v", what, n.Name, st.Kubernetes)
			}
			if r := st.Kubernetes.Refused[0]; !strings.Contains(r.Error, "last accepted version stays in force") {
				t.Errorf("%s: node %s refused %+v without keeping the accepted version", what, n.Name, r)
			}
			ps := policies(t, n)
			if len(ps) != 1 || ps[0].Name != "b-from-c" || strings.Contains(string(ps[0].Raw), "toServices") {
				t.Errorf("%s: node %s enforces %+v, want the accepted b-from-c", what, n.Name, ps)
			}
		}
		check(t, what, []probe{{cc, b, 81, "tcp", true}, {a, b, 80, "tcp", false}, {a, b, 81, "tcp", false}, {cc, b, 80, "tcp", false}})
	}
	kept("update refused")
	for _, n := range c.Nodes {
		n.Stop()
		n.Start()
		n.WaitSynced()
		kept("node " + n.Name + "'s agent restarted")
	}
	// Node 2's agent starts again with no accepted version of its own (its state lost
	// them: a node whose state is new): it takes the version the cluster recorded.
	n2 := c.Nodes[1]
	n2.Stop()
	forgetAccepted(t, n2.StateDir)
	n2.Start()
	n2.WaitSynced()
	kept("node " + n2.Name + "'s agent restarted without its accepted versions")
	if out := records(); out != "b-from-c" {
		t.Errorf("accepted policies %q, want b-from-c's", out)
	}
	// The record goes once the current version is accepted again, and with its object.
	gone := func(what string) {
		t.Helper()
		var out string
		if !testenv.Eventually(propagate, func() bool { out = records(); return out == "" }) {
			t.Errorf("%s: accepted policies %q remain", what, out)
		}
	}
	c.KubectlApply(cnpCToB81)
	gone("b-from-c accepted again")
	c.KubectlApply(cnpCToB81 + "  egress:\n  - toServices: [{k8sService: {serviceName: web, namespace: x}}]\n")
	if !testenv.Eventually(propagate, func() bool { return records() == "b-from-c" }) {
		t.Errorf("b-from-c refused again: accepted policies %q, want b-from-c's", records())
	}
	c.MustKubectl("delete", "ciliumnetworkpolicy", "-n", "x", "b-from-c")
	gone("b-from-c deleted")
}

// forgetAccepted removes the accepted versions of the policy objects from the agent
// state in dir (the agent stopped).
func forgetAccepted(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, "state.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]json.RawMessage
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	if _, ok := st["acceptedObjects"]; !ok {
		t.Fatalf("%s holds no acceptedObjects", path)
	}
	delete(st, "acceptedObjects")
	if data, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
