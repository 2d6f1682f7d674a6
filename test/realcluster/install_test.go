package realcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// agentSelector selects deploy/'s agent pods.
const agentSelector = "app.kubernetes.io/name=rampart"

// What deploy/'s agent makes on a node, as seen in the node's mount namespace: the
// plugin, its configuration list, its state and its pins.
var installed = []string{
	"/opt/cni/bin/rampart-cni",
	"/etc/cni/net.d/05-rampart.conflist",
	"/var/lib/rampart/default",
	"/sys/fs/bpf/rampart/default",
}

// previousRelease is the commit a user upgrades from in TestInstallDaemonSet: an earlier
// build of main whose tests passed and that runs under this deploy/. Move it forward when
// deploy/ changes in a way an older agent cannot run under (here: --metrics-address and
// --hubble-address).
const previousRelease = "c087ec6b970606bb51ec7533798d37072e81f21c"

// Rampart installed as a user installs it: two real nodes start with no agent and no CNI
// configuration (NotReady); `kubectl apply -R -f deploy/` (its ConfigMap edited for this
// cluster, the image pinned to the previous release's, built from that commit) runs the
// agent on each, which installs the plugin, and only then the nodes are Ready. A
// NetworkPolicy is enforced across nodes. Under traffic probed every 300 ms from the pods'
// own network namespaces: a rolling update of the DaemonSet to the image built from this
// tree (the agents report the new version after it), then one agent pod deleted (the
// DaemonSet makes it again); in both, no denied connection is made, every allowed one
// succeeds and a long-lived allowed connection keeps answering. Then the uninstall
// (deploy-uninstall/ after deploy/'s DaemonSet is deleted) removes from every node each
// thing the agent installed, and the nodes are NotReady again.
func TestInstallDaemonSet(t *testing.T) {
	testenv.RequireRoot(t)
	root := testenv.ModuleRoot(t)
	previousArchive, previousRef := nodetest.BuildImageOf(t, previousRelease)
	archive, ref := nodetest.BuildImage(t)
	if previousRef == ref {
		t.Fatalf("the previous release and this tree are the same version %s", ref)
	}
	// The previous release first: both archives tag rampart.io/rampart:latest, and the
	// last import holds it.
	c := nodetest.Start(t, nodetest.Options{Nodes: 2, WithoutAgents: true, Images: []string{previousArchive, archive}})
	ctx := context.Background()

	for _, n := range c.Nodes {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ready(node) {
			t.Fatalf("node %s is Ready with no CNI installed", n.Name)
		}
		if _, err := os.Stat(filepath.Join(n.Dir, "etc/cni/net.d/05-rampart.conflist")); !os.IsNotExist(err) {
			t.Fatalf("node %s has a CNI configuration before the install (%v)", n.Name, err)
		}
	}

	readyAfter := c.InstallRampartImage(previousRef, nil)
	agents := agentPods(t, c)
	agentVersions(t, c, agents, previousRef)
	for node, p := range agents {
		if !podReady(&p) {
			t.Errorf("node %s is Ready but its agent pod %s is not", node, p.Name)
		}
	}
	for _, n := range c.Nodes {
		for _, p := range installed {
			if out, err := n.Exec("test", "-e", p); err != nil {
				t.Errorf("node %s: %s not there after the install: %v %s", n.Name, p, err, out)
			}
		}
	}
	t.Logf("nodes Ready %v after kubectl apply", readyAfter.Round(100*time.Millisecond))

	ns := "install-" + testenv.Suffix(6)
	c.MustKubectl("create", "namespace", ns)
	t.Cleanup(func() { c.Kubectl("delete", "namespace", ns, "--wait=false") })
	pods := deployWebClientOther(t, c, ns)
	enforcedAcrossNodes(t, c, ns, pods)

	p := &prober{c: c, ns: ns, netns: map[string]string{}}
	if !testenv.Eventually(time.Minute, func() bool { r := p.round(); return r.allowedFailed == 0 && r.allowedOK == 4 && r.deniedBlocked == 4 }) {
		t.Fatalf("probes before the upgrade: %+v", p.round())
	}
	web2 := pods["web"]["node-2"].Status.PodIP + ":8080"
	underTraffic := func(name string, change func() error) {
		t.Helper()
		long, err := p.dialLong(pods["client"]["node-1"], web2)
		if err != nil {
			t.Fatalf("%s: opening the long-lived connection: %v", name, err)
		}
		stop := p.run(long)
		began := time.Now()
		if err := change(); err != nil {
			stop()
			t.Fatalf("%s: %v", name, err)
		}
		ok := testenv.Eventually(2*time.Minute, func() bool { return p.converged(began) })
		r := stop()
		t.Logf("%s: converged in %v; %d requests answered on the long-lived connection, %d new allowed connections, %d denied blocked, %d failed, %d denied made, %d skipped",
			name, time.Since(began).Round(100*time.Millisecond), r.longAnswered, r.allowedOK, r.deniedBlocked, r.allowedFailed, r.deniedPassed, r.skipped)
		if r.deniedPassed > 0 {
			t.Errorf("%s: %d denied connections were made: %s", name, r.deniedPassed, strings.Join(r.errors, "; "))
		}
		if r.allowedFailed > 0 || r.longBroken != "" {
			t.Errorf("%s: %d allowed connections failed (%s); long-lived connection: %q", name, r.allowedFailed, strings.Join(r.errors, "; "), r.longBroken)
		}
		if !ok {
			t.Fatalf("%s: the cluster did not converge in 2 minutes; last probes %+v", name, p.round())
		}
	}

	// The upgrade to this tree's build, as a new version is rolled out (docs/install.md).
	underTraffic("rolling update to "+ref, func() error {
		if _, err := c.Kubectl("-n", "kube-system", "set", "image", "daemonset/rampart", "rampartd="+ref); err != nil {
			return err
		}
		return waitAgents(c, 3*time.Minute, func(node string, p corev1.Pod) bool {
			return p.UID != agents[node].UID && p.Spec.Containers[0].Image == ref
		})
	})
	upgraded := agentPods(t, c)
	agentVersions(t, c, upgraded, ref)

	// One agent pod deleted: the DaemonSet makes it again.
	var replacedIn time.Duration
	underTraffic("agent pod deleted", func() error {
		old := upgraded["node-2"]
		deleted := time.Now()
		if _, err := c.Kubectl("-n", "kube-system", "delete", "pod", old.Name, "--wait=false"); err != nil {
			return err
		}
		err := waitAgents(c, 2*time.Minute, func(node string, p corev1.Pod) bool { return node != "node-2" || p.UID != old.UID })
		replacedIn = time.Since(deleted)
		return err
	})
	t.Logf("deleted agent pod replaced and ready in %v", replacedIn.Round(100*time.Millisecond))
	observedOnTheCluster(t, c, ns, pods)
	t.Logf("resident memory, agents as pods, 6 workload pods:\n%s", c.RSSReport())

	// Uninstall: the workloads go while the agents answer their CNI DELs, then the agents,
	// then deploy-uninstall/ runs on every node.
	if out, err := c.Kubectl("delete", "namespace", ns, "--timeout=50s"); err != nil {
		t.Fatalf("kubectl delete namespace %s: %v\n%s", ns, err, out)
	}
	c.MustKubectl("-n", "kube-system", "delete", "daemonset", "rampart", "--timeout=50s")
	if !testenv.Eventually(time.Minute, func() bool { return len(listPods(c, agentSelector)) == 0 }) {
		t.Fatalf("agent pods left a minute after their DaemonSet was deleted")
	}
	c.MustKubectl("apply", "-f", filepath.Join(root, "deploy-uninstall", "daemonset.yaml"))
	t.Cleanup(func() { c.Kubectl("-n", "kube-system", "delete", "daemonset", "rampart-uninstall", "--wait=false") })
	// Done on a node: its pod runs (idle) and has logged the uninstall.
	var last []corev1.Pod
	if !testenv.Eventually(2*time.Minute, func() bool {
		last = listPods(c, "app.kubernetes.io/name=rampart-uninstall")
		done := 0
		for _, p := range last {
			if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
				continue
			}
			if out, err := c.Kubectl("-n", "kube-system", "logs", p.Name); err == nil && strings.Contains(out, "instance default uninstalled") {
				done++
			}
		}
		return done == len(c.Nodes)
	}) {
		out, _ := c.Kubectl("-n", "kube-system", "logs", "-l", "app.kubernetes.io/name=rampart-uninstall")
		t.Fatalf("uninstall not done on every node after 2 minutes: %+v\n%s", last, out)
	}
	for _, p := range last {
		if n := p.Status.ContainerStatuses[0].RestartCount; n > 0 {
			t.Errorf("uninstall pod %s on %s restarted %d times (a failed uninstall)", p.Name, p.Spec.NodeName, n)
		}
	}
	for _, n := range c.Nodes {
		for _, p := range installed {
			if out, err := n.Exec("test", "-e", p); err == nil {
				t.Errorf("node %s: %s left after the uninstall", n.Name, p)
			} else if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
				t.Errorf("node %s: testing %s: %v %s", n.Name, p, err, out)
			}
		}
		if out, _ := n.Exec("ls", "-A", "/sys/fs/bpf/rampart"); strings.TrimSpace(out) != "" && !strings.Contains(out, "No such file") {
			t.Errorf("node %s: pins left in /sys/fs/bpf/rampart after the uninstall: %s", n.Name, out)
		}
	}
	// No CNI configuration: the runtime reports the network not ready again.
	if !testenv.Eventually(time.Minute, func() bool {
		for _, n := range c.Nodes {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil || ready(node) {
				return false
			}
		}
		return true
	}) {
		t.Errorf("nodes still Ready a minute after the uninstall")
	}
	c.MustKubectl("-n", "kube-system", "delete", "daemonset", "rampart-uninstall", "--timeout=50s")
}

// agentPods waits for one running agent pod per node and returns them by node.
func agentPods(t *testing.T, c *nodetest.Cluster) map[string]corev1.Pod {
	t.Helper()
	if err := waitAgents(c, 2*time.Minute, func(string, corev1.Pod) bool { return true }); err != nil {
		t.Fatal(err)
	}
	m := map[string]corev1.Pod{}
	for _, p := range listPods(c, agentSelector) {
		m[p.Spec.NodeName] = p
	}
	return m
}

// waitAgents waits until every node has exactly one agent pod, Ready and not being
// deleted, and each satisfies ok.
func waitAgents(c *nodetest.Cluster, timeout time.Duration, ok func(node string, p corev1.Pod) bool) error {
	var last []corev1.Pod
	if testenv.Eventually(timeout, func() bool {
		last = listPods(c, agentSelector)
		byNode := map[string]int{}
		for _, p := range last {
			if p.DeletionTimestamp != nil || !podReady(&p) || !ok(p.Spec.NodeName, p) {
				return false
			}
			byNode[p.Spec.NodeName]++
		}
		for _, n := range c.Nodes {
			if byNode[n.Name] != 1 {
				return false
			}
		}
		return true
	}) {
		return nil
	}
	var s []string
	for _, p := range last {
		s = append(s, fmt.Sprintf("%s on %s: %s ready=%v image %s", p.Name, p.Spec.NodeName, p.Status.Phase, podReady(&p), p.Spec.Containers[0].Image))
	}
	return fmt.Errorf("agent pods not as wanted after %v: %s", timeout, strings.Join(s, "; "))
}

func listPods(c *nodetest.Cluster, selector string) []corev1.Pod {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil
	}
	return list.Items
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// agentVersions checks that each agent pod's rampartd reports the version of image ref
// (rampart.io/rampart:<version>), asked with the image's own CLI in the pod.
func agentVersions(t *testing.T, c *nodetest.Cluster, agents map[string]corev1.Pod, ref string) {
	t.Helper()
	want := strings.TrimPrefix(ref, "rampart.io/rampart:")
	for node, p := range agents {
		out, err := c.Kubectl("-n", "kube-system", "exec", p.Name, "--", "rampart", "version", "-o", "json")
		if err != nil {
			t.Fatalf("rampart version in %s's agent pod: %v\n%s", node, err, out)
		}
		var v struct {
			Agent struct{ Version string }
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("rampart version -o json in %s's agent pod: %v\n%s", node, err, out)
		}
		// "<version> (revision <commit>) <go version>" (version.Info).
		if !strings.HasPrefix(v.Agent.Version, want+" ") {
			t.Errorf("node %s: the agent reports version %q, want %s (%s)", node, v.Agent.Version, want, ref)
		}
	}
}
