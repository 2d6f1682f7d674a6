package k8smode

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// An agent stopped on one node: its pinned programs keep enforcing while it is down, and
// the changes made in the API meanwhile apply once it is back.
func TestAgentRestartResyncs(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2})
	a, cc, b := threePods(t, c)
	n2 := c.Nodes[1]
	c.KubectlApply(allowAToB80)
	waitFor(t, "NetworkPolicy applied", probe{cc, b, 80, "tcp", false})

	n2.Stop()
	c.KubectlDelete(allowAToB80)
	c.KubectlApply(cnpCToB81)
	check(t, "node 2's agent down: the last policy still enforced", []probe{
		{a, b, 80, "tcp", true}, {cc, b, 80, "tcp", false}, {cc, b, 81, "tcp", false},
	})

	n2.Start()
	waitFor(t, "changes made while the agent was down", probe{cc, b, 81, "tcp", true})
	check(t, "node 2's agent back", []probe{
		{cc, b, 81, "tcp", true}, {a, b, 80, "tcp", false}, {cc, b, 80, "tcp", false}, {a, b, 81, "tcp", false},
	})
}

// outage is how long the API server the agents watch stays down: a minute, as the issue
// asks. Over that time the informers' reconnect backoff grows towards its cap, so the
// return is also a test of the agents picking the changes up after a long break, not only
// after a blip (the wait below allows for the backoff).
const outage = time.Minute

// The API server the agents watch stopped: enforcement continues, status reports the
// error, and changes made meanwhile (through a second API server on the same etcd, which
// the agents do not know) apply when it returns.
func TestAPIServerOutage(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2})
	a, cc, b := threePods(t, c)
	c.KubectlApply(allowAToB80)
	waitFor(t, "NetworkPolicy applied", probe{cc, b, 80, "tcp", false})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, kc2, err := c.AddAPIServer(ctx)
	if err != nil {
		t.Fatalf("second API server: %v", err)
	}
	kubectl2 := func(stdin string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(c.BinDir, "kubectl"), append([]string{"--kubeconfig", kc2}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubectl (second API server) %v: %v\n%s", args, err, out)
		}
	}
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	kubectl2(allowAToB80, "delete", "-f", "-")
	kubectl2(cnpCToB81, "apply", "-f", "-")
	// The agents still enforce the last view they had.
	check(t, "API server down", []probe{{a, b, 80, "tcp", true}, {cc, b, 80, "tcp", false}, {cc, b, 81, "tcp", false}})
	for _, n := range c.Nodes {
		if !testenv.Eventually(outage, func() bool {
			st := n.Status()
			return st.Kubernetes != nil && st.Kubernetes.LastError != ""
		}) {
			t.Errorf("node %s: status reports no error with its API server down", n.Name)
		}
	}
	if !testenv.Eventually(outage+time.Second, func() bool { return time.Since(began) >= outage }) {
		t.Fatal("clock")
	}
	check(t, "API server still down", []probe{{a, b, 80, "tcp", true}, {cc, b, 80, "tcp", false}})
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	// Informers reconnect each on its own, with a backoff.
	if !testenv.Eventually(time.Minute, func() bool {
		return cc.Probe(b.IP, 81, "tcp", allowWait) && !a.Probe(b.IP, 80, "tcp", denyWait)
	}) {
		t.Fatal("the changes made while the API server was down did not apply after it returned")
	}
	check(t, "API server back", []probe{{cc, b, 81, "tcp", true}, {a, b, 80, "tcp", false}, {cc, b, 80, "tcp", false}})
	for _, n := range c.Nodes {
		if !testenv.Eventually(propagate, func() bool { return n.Status().Kubernetes.LastError == "" }) {
			t.Errorf("node %s: last error not cleared after the API server returned: %s", n.Name, n.Status().Kubernetes.LastError)
		}
	}
}

// etcd restarted: nothing is lost. The policy, the pods and their identities are still
// there and enforced, and the cluster takes changes again.
func TestEtcdRestart(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2})
	a, cc, b := threePods(t, c)
	c.KubectlApply(allowAToB80)
	waitFor(t, "NetworkPolicy applied", probe{cc, b, 80, "tcp", false})
	before, _ := c.Nodes[1].Remote("x", "a")

	if err := c.StopEtcd(); err != nil {
		t.Fatal(err)
	}
	check(t, "etcd down", []probe{{a, b, 80, "tcp", true}, {cc, b, 80, "tcp", false}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.StartEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	c.WaitReady(t, time.Minute)
	out := c.MustKubectl("get", "networkpolicy,pods", "-n", "x", "-o", "name")
	for _, want := range []string{"networkpolicy.networking.k8s.io/b-from-a", "pod/a", "pod/b", "pod/c"} {
		if !strings.Contains(out, want) {
			t.Errorf("after etcd restarted, %s is missing:\n%s", want, out)
		}
	}
	c.KubectlApply(cnpCToB81)
	waitFor(t, "a change after etcd restarted", probe{cc, b, 81, "tcp", true})
	check(t, "etcd restarted", []probe{{a, b, 80, "tcp", true}, {cc, b, 80, "tcp", false}, {a, b, 81, "tcp", false}})
	after, _ := c.Nodes[1].Remote("x", "a")
	if after.Identity != before.Identity {
		t.Errorf("x/a's identity on node 2 changed across the etcd restart: %d, then %d", before.Identity, after.Identity)
	}
}
