package podrunner

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

var bins = testenv.Binaries{Packages: []string{"./cmd/rampart-cni", "./test/rampart-podrunner", "./test/rampart-testserver"}}

func TestMain(m *testing.M) { bins.Main(m) }

// node is one simulated node: a control plane shared by the test, an agent in its node
// namespace (non-Kubernetes mode), and the configuration of a runner for it.
type node struct {
	t       *testing.T
	cluster *k8stest.Cluster
	agent   *agenttest.Env
	cfg     Config
	ns      string // the test's Kubernetes namespace
	bin     string
}

var podCIDR = netip.MustParsePrefix("198.18.0.0/16")

func newNode(t *testing.T) *node {
	t.Helper()
	testenv.RequireRoot(t)
	cluster := k8stest.Start(t)
	bin := bins.Dir(t)
	env := agenttest.StartAgent(t, agenttest.Options{NoServers: true, PodCIDR: podCIDR})
	confDir := t.TempDir()
	conf := `{"cniVersion": "1.1.0", "name": "rampart", "plugins": [{"type": "rampart-cni", "socket": "` + env.Socket() + `"}]}`
	if err := os.WriteFile(filepath.Join(confDir, "10-rampart.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// The runner's own client, with a kubelet's rate limits (rampart-podrunner's too).
	rc := rest.CopyConfig(cluster.Config)
	rc.QPS, rc.Burst = 50, 100
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{
		t: t, cluster: cluster, agent: env, bin: bin,
		ns: "pr-" + testenv.Suffix(6),
		cfg: Config{
			Client:     client,
			NodeName:   "node-" + testenv.Suffix(6),
			Address:    netip.MustParseAddr("198.19.0.1"),
			PodCIDR:    podCIDR,
			CNIConfDir: confDir,
			CNIBinDirs: []string{bin},
			StateDir:   t.TempDir(),
			NodeNetns:  env.Config.NodeNetns,
			Heartbeat:  time.Second,
			RetryMax:   2 * time.Second,
			Logger:     slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		},
	}
	// Registered after the agent's: runs before it, while the plugin can still reach it.
	t.Cleanup(func() {
		if err := Cleanup(n.cfg); err != nil {
			t.Errorf("cleaning up the runner's sandboxes: %v", err)
		}
	})
	ctx := context.Background()
	if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return n
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// start runs a runner in-process until stop is called or the test ends.
func (n *node) start() (stop func()) {
	n.t.Helper()
	r, err := New(n.cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			n.t.Errorf("runner: %v", err)
		}
	}
	n.t.Cleanup(stop)
	return stop
}

// serverPod runs rampart-testserver on TCP port 80, ready when the port answers.
func (n *node) serverPod(name string) *corev1.Pod {
	grace := int64(5)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: n.ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:                      n.cfg.NodeName,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "server", Image: "none",
				Command: []string{filepath.Join(n.bin, "rampart-testserver"), "serve"},
				Args:    []string{"--tcp", "80"},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(80)}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

// shellPod runs sh -c script with a restart policy.
func (n *node) shellPod(name, script string, policy corev1.RestartPolicy) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: n.ns},
		Spec: corev1.PodSpec{
			NodeName:      n.cfg.NodeName,
			RestartPolicy: policy,
			Containers: []corev1.Container{{
				Name: "sh", Image: "none", Command: []string{"sh", "-c", script},
				Env: []corev1.EnvVar{{Name: "GREETING", Value: "hello"}, {Name: "MY_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}},
			}},
		},
	}
}

func (n *node) create(p *corev1.Pod) *corev1.Pod {
	n.t.Helper()
	out, err := n.cluster.Client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		n.t.Fatalf("creating pod %s: %v", p.Name, err)
	}
	return out
}

func (n *node) get(name string) (*corev1.Pod, error) {
	return n.cluster.Client.CoreV1().Pods(n.ns).Get(context.Background(), name, metav1.GetOptions{})
}

// waitPod polls the pod until cond holds.
func (n *node) waitPod(name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	n.t.Helper()
	var last *corev1.Pod
	if !testenv.Eventually(timeout, func() bool {
		p, err := n.get(name)
		if err != nil {
			return false
		}
		last = p
		return cond(p)
	}) {
		n.t.Fatalf("pod %s not %s after %v; status: %+v", name, what, timeout, statusOf(last))
	}
	return last
}

func statusOf(p *corev1.Pod) any {
	if p == nil {
		return nil
	}
	return p.Status
}

func podCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func isReady(p *corev1.Pod) bool {
	c := podCondition(p, corev1.PodReady)
	return p.Status.Phase == corev1.PodRunning && c != nil && c.Status == corev1.ConditionTrue
}

func (n *node) waitReady(name string) *corev1.Pod {
	n.t.Helper()
	return n.waitPod(name, 30*time.Second, "Ready", isReady)
}

func (n *node) waitGone(name string) {
	n.t.Helper()
	if !testenv.Eventually(30*time.Second, func() bool {
		_, err := n.get(name)
		return apierrors.IsNotFound(err)
	}) {
		n.t.Fatalf("pod %s still in the API", name)
	}
}

// sandboxOf is the runner's saved state of a pod.
func (n *node) sandboxOf(uid types.UID) *sandbox {
	n.t.Helper()
	sbs, err := loadSandboxes(filepath.Join(n.cfg.StateDir, "sandboxes"))
	if err != nil {
		n.t.Fatal(err)
	}
	sb := sbs[uid]
	if sb == nil {
		n.t.Fatalf("no sandbox for pod %s", uid)
	}
	return sb
}

func (n *node) nodeNetns() string { return filepath.Join("/run/netns", n.cfg.NodeNetns) }

func (n *node) reach(from string, p *corev1.Pod) bool {
	return testenv.Probe(from, netip.AddrPortFrom(netip.MustParseAddr(p.Status.PodIP), 80), "tcp", 3*time.Second)
}

func (n *node) hasEndpoint(name string) bool {
	n.t.Helper()
	eps, err := n.agent.Client.ListEndpoints(context.Background())
	if err != nil {
		n.t.Fatal(err)
	}
	return slices.ContainsFunc(eps, func(e api.Endpoint) bool { return e.Namespace == n.ns && e.Name == name })
}

func alive(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) == nil && !procZombie(pid)
}

// A pod bound to the node runs, gets an address from the agent's range, becomes Ready,
// and answers from the node and from another pod; the Node carries the runner's address,
// pod CIDR and a Ready condition; deleting the pod stops its process, detaches it and
// removes its namespace and the object. Exits follow the restart policy.
func TestPodLifecycle(t *testing.T) {
	n := newNode(t)
	n.start()
	ctx := context.Background()

	a := n.create(n.serverPod("a"))
	b := n.create(n.serverPod("b"))
	a = n.waitReady("a")
	b = n.waitReady("b")
	for _, p := range []*corev1.Pod{a, b} {
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !podCIDR.Contains(ip) || len(p.Status.PodIPs) != 1 || p.Status.HostIP != n.cfg.Address.String() {
			t.Fatalf("pod %s: podIP %q podIPs %v hostIP %q", p.Name, p.Status.PodIP, p.Status.PodIPs, p.Status.HostIP)
		}
		if ep := n.agent.Endpoint(n.ns + "/" + p.Name); ep.CNI == nil || ep.IP != p.Status.PodIP {
			t.Fatalf("agent's endpoint of %s: %+v", p.Name, ep)
		}
		for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.PodReadyToStartContainers, corev1.ContainersReady} {
			if c := podCondition(p, c); c == nil || c.Status != corev1.ConditionTrue {
				t.Fatalf("pod %s condition %v", p.Name, c)
			}
		}
		if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Running == nil || !cs[0].Ready {
			t.Fatalf("pod %s container status %+v", p.Name, cs)
		}
	}
	if a.Status.PodIP == b.Status.PodIP {
		t.Fatalf("two pods with address %s", a.Status.PodIP)
	}
	if !n.reach(n.nodeNetns(), a) {
		t.Fatal("pod a does not answer from the node")
	}
	sbB := n.sandboxOf(b.UID)
	if !n.reach(sbB.Netns, a) {
		t.Fatal("pod a does not answer from pod b")
	}

	nd, err := n.cluster.Client.CoreV1().Nodes().Get(ctx, n.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nd.Spec.PodCIDR != podCIDR.String() || len(nd.Status.Addresses) == 0 || nd.Status.Addresses[0].Address != n.cfg.Address.String() || nd.Status.Addresses[0].Type != corev1.NodeInternalIP {
		t.Fatalf("node %+v %+v", nd.Spec, nd.Status.Addresses)
	}
	hb := func() time.Time {
		nd, err := n.cluster.Client.CoreV1().Nodes().Get(ctx, n.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return time.Time{}
		}
		for _, c := range nd.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return c.LastHeartbeatTime.Time
			}
		}
		return time.Time{}
	}
	first := hb()
	if first.IsZero() || !testenv.Eventually(5*time.Second, func() bool { return hb().After(first) }) {
		t.Fatalf("node Ready heartbeat does not advance from %v", first)
	}

	// Deletion: graceful, as for any pod bound to a node; the runner finishes it.
	sbA := n.sandboxOf(a.UID)
	if !alive(sbA.PID) {
		t.Fatalf("pod a's process %d not running", sbA.PID)
	}
	if err := n.cluster.Client.CoreV1().Pods(n.ns).Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n.waitGone("a")
	if alive(sbA.PID) {
		t.Fatalf("pod a's process %d still runs", sbA.PID)
	}
	if _, err := os.Stat(sbA.Netns); err == nil {
		t.Fatalf("pod a's namespace %s still there", sbA.Netns)
	}
	if n.hasEndpoint("a") {
		t.Fatal("agent still has pod a's endpoint")
	}
	if _, err := os.Stat(LogPath(n.cfg.StateDir, n.ns, "a", a.UID)); err == nil {
		t.Fatal("pod a's log still there")
	}

	// Ready waits for the readiness probe: a process that listens 2 s after it starts is
	// Running and not Ready first.
	slow := n.serverPod("slow")
	slow.Spec.Containers[0].Command = []string{"sh", "-c", "sleep 2; exec " + filepath.Join(n.bin, "rampart-testserver") + ` serve "$@"`, "sh"}
	n.create(slow)
	n.waitPod("slow", 30*time.Second, "Running and not Ready", func(p *corev1.Pod) bool {
		c := podCondition(p, corev1.PodReady)
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && c != nil && c.Status == corev1.ConditionFalse && c.Reason == "ContainersNotReady"
	})
	n.waitReady("slow")

	// Deleted by force (gone from the API at once): the sandbox goes all the same.
	if err := n.cluster.Client.CoreV1().Pods(n.ns).Delete(ctx, "b", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	if !testenv.Eventually(20*time.Second, func() bool {
		_, err := os.Stat(sbB.Netns)
		return err != nil && !alive(sbB.PID) && !n.hasEndpoint("b")
	}) {
		t.Fatalf("pod b deleted by force: namespace, process %d or endpoint stay", sbB.PID)
	}

	// Restart policies. Never: the exit code decides Succeeded or Failed. Always: the
	// process comes back, counted. The environment holds literal and downward-API values.
	n.create(n.shellPod("fails", `echo "$GREETING $MY_IP"; exit 3`, corev1.RestartPolicyNever))
	n.create(n.shellPod("done", "exit 0", corev1.RestartPolicyOnFailure))
	n.create(n.shellPod("again", "exit 0", corev1.RestartPolicyAlways))
	failed := n.waitPod("fails", 30*time.Second, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if cs := failed.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Terminated == nil || cs[0].State.Terminated.ExitCode != 3 {
		t.Fatalf("failed pod's container status %+v", cs)
	}
	if log, err := os.ReadFile(LogPath(n.cfg.StateDir, n.ns, "fails", failed.UID)); err != nil || string(log) != "hello "+failed.Status.PodIP+"\n" {
		t.Fatalf("failed pod's log %q (%v), want its greeting and address %s", log, err, failed.Status.PodIP)
	}
	n.waitPod("done", 30*time.Second, "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	n.waitPod("again", 30*time.Second, "restarted twice", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 2
	})

	// A terminal pod is deleted at once by the API server: its sandbox goes too.
	sbF := n.sandboxOf(failed.UID)
	if err := n.cluster.Client.CoreV1().Pods(n.ns).Delete(ctx, "fails", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !testenv.Eventually(20*time.Second, func() bool { _, err := os.Stat(sbF.Netns); return err != nil && !n.hasEndpoint("fails") }) {
		t.Fatal("the deleted failed pod's sandbox stays")
	}
	n.waitGone("fails")
}

// A failing CNI ADD (the agent stopped) leaves the pod not Ready, without an address,
// with the reason in its conditions; the runner retries and the pod becomes Ready once
// the agent is back.
func TestCNIFailureReportedAndRetried(t *testing.T) {
	n := newNode(t)
	n.start()
	n.agent.Stop()
	n.create(n.serverPod("blocked"))
	p := n.waitPod("blocked", 30*time.Second, "reporting the network failure", func(p *corev1.Pod) bool {
		c := podCondition(p, corev1.PodReadyToStartContainers)
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == "NetworkSetupFailed"
	})
	c := podCondition(p, corev1.PodReadyToStartContainers)
	ready := podCondition(p, corev1.PodReady)
	if !strings.Contains(c.Message, "CNI ADD") || ready == nil || ready.Status != corev1.ConditionFalse || ready.Reason != "NetworkSetupFailed" || p.Status.PodIP != "" || p.Status.Phase != corev1.PodPending {
		t.Fatalf("pod while the network fails: phase %s, podIP %q, conditions %+v", p.Status.Phase, p.Status.PodIP, p.Status.Conditions)
	}
	if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Waiting == nil || cs[0].State.Waiting.Reason != "ContainerCreating" {
		t.Fatalf("container status while the network fails: %+v", cs)
	}
	t.Logf("reported: %s", c.Message)
	n.agent.Start()
	p = n.waitReady("blocked")
	if c := podCondition(p, corev1.PodReadyToStartContainers); c.Status != corev1.ConditionTrue || c.Reason != "" {
		t.Fatalf("network condition after recovery %+v", c)
	}
	if !n.reach(n.nodeNetns(), p) {
		t.Fatal("recovered pod does not answer")
	}
}

// startBinary runs rampart-podrunner for the node until stop (SIGTERM) or the test's end.
func (n *node) startBinary() (stop func()) {
	n.t.Helper()
	cmd := exec.Command(filepath.Join(n.bin, "rampart-podrunner"),
		"--kubeconfig", n.cluster.Kubeconfig, "--node-name", n.cfg.NodeName,
		"--address", n.cfg.Address.String(), "--pod-cidr", n.cfg.PodCIDR.String(),
		"--cni-conf-dir", n.cfg.CNIConfDir, "--cni-bin-dir", n.cfg.CNIBinDirs[0],
		"--state-dir", n.cfg.StateDir, "--node-netns", n.cfg.NodeNetns)
	cmd.Stdout, cmd.Stderr = testWriter{n.t}, testWriter{n.t}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				n.t.Errorf("rampart-podrunner: %v", err)
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			n.t.Error("rampart-podrunner did not stop on SIGTERM")
		}
	}
	n.t.Cleanup(stop)
	return stop
}

// The runner binary stopped and started again: pods that still exist keep their process
// (not restarted), network and Ready; one whose attachment changed (CHECK fails) is
// attached again under its running process; a pod deleted by force meanwhile loses its
// sandbox; a pod created meanwhile starts; an attachment no sandbox names is collected.
func TestRunnerRestartAdopts(t *testing.T) {
	n := newNode(t)
	stop := n.startBinary()
	keep := n.create(n.serverPod("keep"))
	gone := n.create(n.serverPod("gone"))
	keep = n.waitReady("keep")
	broken := n.create(n.serverPod("broken"))
	n.waitReady("gone")
	broken = n.waitReady("broken")
	sbKeep, sbGone, sbBroken := n.sandboxOf(keep.UID), n.sandboxOf(gone.UID), n.sandboxOf(broken.UID)
	stop()

	// An attachment changed while no runner watched: CNI CHECK fails on adoption, and the
	// runner attaches the sandbox again (DEL, ADD) under the running process.
	h := testenv.NetlinkHandle(t, sbBroken.Netns)
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrDel(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(broken.Status.PodIP), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}

	if !alive(sbKeep.PID) || !alive(sbGone.PID) {
		t.Fatal("the runner's stop ended its pods' processes")
	}
	ctx := context.Background()
	if err := n.cluster.Client.CoreV1().Pods(n.ns).Delete(ctx, "gone", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	n.waitGone("gone")
	n.create(n.serverPod("late"))
	// An attachment the runner's plugin made for a sandbox the runner has no record of.
	stale := testenv.NewNetns(t, "rp-prtest-"+testenv.Suffix(8))
	r, err := New(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	staleSB := &sandbox{PodNamespace: n.ns, PodName: "stale", PodUID: "stale", ContainerID: newContainerID(), Netns: stale}
	if _, err := r.cniAdd(ctx, staleSB); err != nil {
		t.Fatal(err)
	}
	if !n.hasEndpoint("stale") {
		t.Fatal("no endpoint for the stale attachment")
	}

	n.startBinary()
	n.waitReady("late")
	if !testenv.Eventually(30*time.Second, func() bool {
		p, err := n.get("broken")
		return err == nil && isReady(p) && n.reach(n.nodeNetns(), p)
	}) {
		t.Fatal("the pod whose address was taken is not attached again")
	}
	if sb := n.sandboxOf(broken.UID); sb.PID != sbBroken.PID || sb.Restarts != 0 {
		t.Fatalf("re-attached pod's process %d (restarts %d), was %d", sb.PID, sb.Restarts, sbBroken.PID)
	}
	if !testenv.Eventually(30*time.Second, func() bool {
		_, err := os.Stat(sbGone.Netns)
		return err != nil && !alive(sbGone.PID) && !n.hasEndpoint("gone") && !n.hasEndpoint("stale")
	}) {
		t.Fatalf("after restart: gone's namespace, process %d or endpoint, or the stale endpoint, stay", sbGone.PID)
	}
	keep2, err := n.get("keep")
	if err != nil || !isReady(keep2) || keep2.Status.PodIP != keep.Status.PodIP || keep2.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("kept pod after restart: %v %+v", err, statusOf(keep2))
	}
	if sb := n.sandboxOf(keep.UID); sb.PID != sbKeep.PID || !alive(sb.PID) {
		t.Fatalf("kept pod's process %d, was %d", sb.PID, sbKeep.PID)
	}
	if !n.reach(n.nodeNetns(), keep2) {
		t.Fatal("kept pod does not answer after restart")
	}
	// The adopted process is still watched: deleting the pod stops it.
	if err := n.cluster.Client.CoreV1().Pods(n.ns).Delete(ctx, "keep", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n.waitGone("keep")
	if alive(sbKeep.PID) || n.hasEndpoint("keep") {
		t.Fatalf("deleted adopted pod: process %d alive %v, endpoint %v", sbKeep.PID, alive(sbKeep.PID), n.hasEndpoint("keep"))
	}
}

// 20 pods created at once all become Ready, each with its own address, answering.
func TestManyPods(t *testing.T) {
	n := newNode(t)
	n.start()
	const count = 20
	began := time.Now()
	for i := range count {
		n.create(n.serverPod(fmt.Sprintf("p%02d", i)))
	}
	var pods []*corev1.Pod
	if !testenv.Eventually(2*time.Minute, func() bool {
		l, err := n.cluster.Client.CoreV1().Pods(n.ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		pods = pods[:0]
		for i := range l.Items {
			if isReady(&l.Items[i]) {
				pods = append(pods, &l.Items[i])
			}
		}
		return len(pods) == count
	}) {
		t.Fatalf("%d of %d pods Ready after 2 min", len(pods), count)
	}
	t.Logf("%d pods Ready %v after their creation", count, time.Since(began).Round(time.Millisecond))
	ips := map[string]bool{}
	for _, p := range pods {
		ips[p.Status.PodIP] = true
	}
	if len(ips) != count {
		t.Fatalf("%d distinct addresses for %d pods", len(ips), count)
	}
	for _, p := range pods {
		if !n.reach(n.nodeNetns(), p) {
			t.Fatalf("pod %s (%s) does not answer", p.Name, p.Status.PodIP)
		}
	}
}

// Status the API server could not take (unreachable) is written once it is back: a
// process without readiness probe, killed and restarted during the outage. (Both the
// worker's retry timer and the informer's re-list after the outage wake the worker; this
// checks the outcome, not which of them.)
func TestStatusAfterAPIOutage(t *testing.T) {
	n := newNode(t)
	// The runner reaches the API server through a proxy the test can cut.
	target := strings.TrimPrefix(n.cluster.Server, "https://")
	px := newProxy(t, target)
	rc := rest.CopyConfig(n.cluster.Config)
	rc.Host = "https://" + px.addr
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	n.cfg.Client = client
	n.start()
	p := n.create(n.shellPod("sleeper", "exec sleep 3600", corev1.RestartPolicyAlways))
	n.waitReady("sleeper")
	sb := n.sandboxOf(p.UID)

	px.cut()
	if err := syscall.Kill(sb.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !testenv.Eventually(20*time.Second, func() bool {
		now := n.sandboxOf(p.UID)
		return now.PID != 0 && now.PID != sb.PID && now.Restarts == 1
	}) {
		t.Fatal("killed process not restarted while the API server is away")
	}
	// The restart's status write fails (the runner logs it).
	px.restore()
	n.waitPod("sleeper", 30*time.Second, "Ready with one restart", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return isReady(p) && len(cs) == 1 && cs[0].RestartCount == 1 && cs[0].LastTerminationState.Terminated != nil
	})
}

// proxy forwards TCP connections to target until cut, which closes its listener and every
// connection; restore listens again on the same address.
type proxy struct {
	t      *testing.T
	target string
	addr   string
	mu     sync.Mutex
	l      net.Listener
	conns  []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	p := &proxy{t: t, target: target}
	p.listen("127.0.0.1:0")
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) listen(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.l, p.addr = l, l.Addr().String()
	p.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.l != nil {
		p.l.Close()
		p.l = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) restore() { p.listen(p.addr) }

// A Node that exists with another pod CIDR cannot be this runner's: Run fails and says
// why instead of retrying.
func TestWrongPodCIDR(t *testing.T) {
	n := newNode(t)
	stop := n.start()
	if !testenv.Eventually(10*time.Second, func() bool {
		_, err := n.cluster.Client.CoreV1().Nodes().Get(context.Background(), n.cfg.NodeName, metav1.GetOptions{})
		return err == nil
	}) {
		t.Fatal("node not registered")
	}
	stop()
	cfg := n.cfg
	cfg.PodCIDR = netip.MustParsePrefix("198.18.128.0/24")
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Run(ctx); err == nil || !strings.Contains(err.Error(), "cannot change") || ctx.Err() != nil {
		t.Fatalf("Run with another pod CIDR: %v (context: %v)", err, ctx.Err())
	}
}
