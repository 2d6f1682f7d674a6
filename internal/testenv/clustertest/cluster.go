package clustertest

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
	"github.com/rampartnet/rampart/internal/testenv/simcluster"
)

// Bins builds rampartd, the rampart CLI and the CNI plugin for the clusters; call
// Bins.Remove from TestMain.
var Bins = &testenv.Binaries{Packages: []string{"./cmd/rampartd", "./cmd/rampart", "./cmd/rampart-cni"}}

// Options configure Start.
type Options struct {
	// Nodes is the number of nodes (default 2, at most 200).
	Nodes int
	// Tunnel is every agent's --tunnel ("": native routing).
	Tunnel overlay.Mode
	// AgentFlags are more flags for every rampartd. Without --service-cgroup the agents
	// attach their Service translation to an empty cgroup of the test's own (the API
	// server's own "kubernetes" Service is always there), so the host's sockets stay as
	// they are; tests of Services pass the cgroup they joined (testenv.JoinNewCgroup).
	AgentFlags []string
}

// Cluster is a control plane and its nodes.
type Cluster struct {
	*k8stest.Cluster
	T     testing.TB
	Nodes []*Node
	// Runtime runs the pods on real nodes; nil on simulated ones, where the test does.
	Runtime Runtime
}

// Node is one simulated node: a network namespace on the fabric, its Node object and its
// rampartd in Kubernetes mode.
type Node struct {
	Name    string
	Address netip.Addr   // fabric address, the Node's InternalIP
	PodCIDR netip.Prefix // the Node's spec.podCIDR
	Netns   string       // node network namespace name
	Client  *api.Client
	// StateDir is the agent's --state-dir.
	StateDir string

	c        *Cluster
	cni      *libcni.CNIConfig
	cniList  *libcni.NetworkConfigList
	flags    []string
	socket   string
	instance string
	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	log      *testenv.SyncBuffer
}

// Start starts a control plane with the CRDs, a fabric, the nodes' Node objects and one
// rampartd per node, and returns once every agent has applied its first view of the
// cluster. Everything is removed when the test ends.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	testenv.RequireRoot(t)
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if !slices.Contains(opts.AgentFlags, "--service-cgroup") {
		opts.AgentFlags = append(slices.Clip(opts.AgentFlags), "--service-cgroup", testenv.NewCgroup(t))
	}
	k := k8stest.Start(t)
	k.InstallCRDs(t)
	c := &Cluster{Cluster: k, T: t}
	suffix := testenv.Suffix(6)
	fabric := linkFabric(t, suffix, opts.Nodes)
	for i := range opts.Nodes {
		n := c.AddNode(fmt.Sprintf("node-%d", i+1), fabric.nodes[i], fabric.addrs[i], opts)
		n.PodCIDR = simcluster.NodePodCIDR(i)
		c.createNodeObject(n)
	}
	for _, n := range c.Nodes {
		n.Start()
	}
	for _, n := range c.Nodes {
		n.WaitSynced()
	}
	return c
}

// AddNode adds a node whose agent runs in the network namespace netns, where the node has
// address addr, without starting the agent or creating its Node object (Start does both
// for simulated nodes; real nodes' kubelets register themselves). The agent's state is
// removed when the test ends; its --pod-cidr there (for --uninstall) is n.PodCIDR, set by
// the caller once it is known.
func (c *Cluster) AddNode(name, netns string, addr netip.Addr, opts Options) *Node {
	t := c.T
	t.Helper()
	if opts.Tunnel == "" {
		opts.Tunnel = overlay.Native
	}
	bin := Bins.Dir(t)
	n := &Node{
		Name:     name,
		Address:  addr,
		Netns:    netns,
		instance: "k" + testenv.Suffix(6),
		c:        c,
		log:      &testenv.SyncBuffer{},
	}
	sockDir, err := os.MkdirTemp("", "rp-sock-")
	if err != nil {
		t.Fatal(err)
	}
	n.StateDir = filepath.Join(t.TempDir(), "state")
	n.socket = filepath.Join(sockDir, "r.sock")
	n.flags = []string{"--instance", n.instance, "--state-dir", n.StateDir, "--socket", n.socket,
		"--bpf-dir", "/sys/fs/bpf/rampart/" + n.instance, "--node-netns", n.Netns, "--tunnel", string(opts.Tunnel)}
	n.flags = append(n.flags, opts.AgentFlags...)
	n.Client = api.NewClient(n.socket)
	n.cni, n.cniList = cniRuntime(t, bin, n.socket)
	t.Cleanup(func() {
		n.Stop()
		n.Client.Close()
		out, err := exec.Command(filepath.Join(bin, "rampartd"), append(n.flags, "--pod-cidr", n.PodCIDR.String(), "--uninstall")...).CombinedOutput()
		if err != nil {
			t.Errorf("uninstalling node %s's agent: %v\n%s", n.Name, err, out)
		}
		os.RemoveAll(sockDir)
		if t.Failed() {
			t.Logf("node %s's rampartd log:\n%s", n.Name, n.log.String())
		}
	})
	c.Nodes = append(c.Nodes, n)
	return n
}

// AgentPid is the node's rampartd's process id (0 when it is not running).
func (n *Node) AgentPid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Socket is the path of the node agent's API socket (what rampart-cni's configuration names).
func (n *Node) Socket() string { return n.socket }

// ServiceCgroup is the cgroup v2 directory the agent attaches its Service translation to
// (its --service-cgroup): the sockets of processes in it, or in a cgroup inside it, are
// translated at connect.
func (n *Node) ServiceCgroup() string {
	cg := ""
	for i := 0; i+1 < len(n.flags); i++ {
		if n.flags[i] == "--service-cgroup" {
			cg = n.flags[i+1] // the last one counts, as for the flag parser
		}
	}
	return cg
}

// BPFDir is the agent's BPF pin directory.
func (n *Node) BPFDir() string { return "/sys/fs/bpf/rampart/" + n.instance }

func (c *Cluster) createNodeObject(n *Node) {
	c.T.Helper()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name},
		Spec:       corev1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	created, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		c.T.Fatalf("creating Node %s: %v", n.Name, err)
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.Address.String()}, {Type: corev1.NodeHostName, Address: n.Name}}
	if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		c.T.Fatalf("setting Node %s's address: %v", n.Name, err)
	}
}

// Start starts the node's rampartd (again, after Stop).
func (n *Node) Start() {
	t := n.c.T
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		t.Fatalf("node %s's agent already running", n.Name)
	}
	cmd := exec.Command(filepath.Join(Bins.Dir(t), "rampartd"),
		append(n.flags, "--kubeconfig", n.c.Kubeconfig, "--node-name", n.Name)...)
	cmd.Stderr = n.log
	cmd.Stdout = n.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(n.done)
	if !testenv.Eventually(30*time.Second, func() bool {
		select {
		case <-n.done:
			return true
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := n.Client.Status(ctx)
		return err == nil
	}) {
		t.Fatalf("node %s's rampartd did not come up:\n%s", n.Name, n.log.String())
	}
	select {
	case <-n.done:
		t.Fatalf("node %s's rampartd exited:\n%s", n.Name, n.log.String())
	default:
	}
}

// Kill kills the node's rampartd at once (SIGKILL), as a crash or power loss would.
func (n *Node) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	n.cmd.Process.Kill()
	<-n.done
	n.cmd = nil
}

// Stop stops the node's rampartd (SIGTERM): its pinned programs keep enforcing.
func (n *Node) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	testenv.Terminate(n.cmd.Process, n.done, 15*time.Second)
	n.cmd = nil
}

// Status is the node agent's status.
func (n *Node) Status() api.Status {
	n.c.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := n.Client.Status(ctx)
	if err != nil {
		n.c.T.Fatalf("node %s status: %v", n.Name, err)
	}
	return st
}

// CLI runs the rampart CLI against the node's agent and returns its output; it fails the
// test on a non-zero exit.
func (n *Node) CLI(args ...string) string {
	n.c.T.Helper()
	cmd := exec.Command(filepath.Join(Bins.Dir(n.c.T), "rampart"), append([]string{"--socket", n.socket}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		n.c.T.Fatalf("rampart %s on node %s: %v\n%s", strings.Join(args, " "), n.Name, err, out)
	}
	return string(out)
}

// Log is what the node's rampartd wrote so far.
func (n *Node) Log() string { return n.log.String() }

// WaitSynced waits until the agent has applied a view of the cluster after now.
func (n *Node) WaitSynced() {
	n.c.T.Helper()
	if !testenv.Eventually(30*time.Second, func() bool {
		st, err := n.Client.Status(context.Background())
		return err == nil && st.Kubernetes != nil && st.Kubernetes.Synced
	}) {
		n.c.T.Fatalf("node %s's agent did not sync with the API:\n%s", n.Name, n.log.String())
	}
}

// Remote returns what the node's agent knows of pod ns/name on another node (ok false if
// it does not know it).
func (n *Node) Remote(ns, name string) (api.RemoteEndpoint, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rs, err := n.Client.ListRemoteEndpoints(ctx)
	if err != nil {
		return api.RemoteEndpoint{}, false
	}
	for _, r := range rs {
		if r.Namespace == ns && r.Name == name {
			return r, true
		}
	}
	return api.RemoteEndpoint{}, false
}

// Kubectl runs kubectl and fails the test on error.
func (c *Cluster) MustKubectl(args ...string) string {
	c.T.Helper()
	out, err := c.Kubectl(args...)
	if err != nil {
		c.T.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// KubectlApply applies a manifest with kubectl apply -f.
func (c *Cluster) KubectlApply(manifest string) string {
	c.T.Helper()
	return c.kubectlStdin(manifest, "apply", "-f", "-")
}

// KubectlDelete deletes a manifest's objects with kubectl delete -f.
func (c *Cluster) KubectlDelete(manifest string) string {
	c.T.Helper()
	return c.kubectlStdin(manifest, "delete", "-f", "-")
}

func (c *Cluster) kubectlStdin(stdin string, args ...string) string {
	c.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.T.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// fabric is the network between the nodes: a bridge in a namespace of its own, and a
// veth from it into each node's namespace.
type fabric struct {
	nodes []string // node namespace names
	addrs []netip.Addr
}

// linkFabric makes the fabric namespace with its bridge and n node namespaces joined to
// it, node i at 198.19.254.(i+1)/24 (simcluster.LinkFabric, as scripts/cluster.sh's nodes).
// Everything is deleted when the test ends.
func linkFabric(t testing.TB, suffix string, n int) fabric {
	t.Helper()
	f := fabric{}
	fab := "rp-" + suffix + "-fab"
	for i := range n {
		f.nodes = append(f.nodes, fmt.Sprintf("rp-%s-n%d", suffix, i+1))
	}
	t.Cleanup(func() {
		if err := simcluster.DeleteNetns(append([]string{fab}, f.nodes...)...); err != nil {
			t.Error(err)
		}
	})
	addrs, err := simcluster.LinkFabric(fab, f.nodes)
	if err != nil {
		t.Fatalf("fabric: %v", err)
	}
	f.addrs = addrs
	return f
}

// newNetns creates a named network namespace and deletes it when the test ends (if the
// agent's uninstall has not).
func newNetns(t testing.TB, name string) string {
	t.Helper()
	path, err := endpoint.CreateNetns(name)
	if err != nil {
		t.Fatalf("network namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		if endpoint.NetnsExists(name) {
			if err := endpoint.DeleteNetns(name); err != nil {
				t.Errorf("deleting network namespace %s: %v", name, err)
			}
		}
	})
	return path
}

// Dynamic is a dynamic client for the cluster (custom resources).
func (c *Cluster) Dynamic(t testing.TB) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// cniRuntime is libcni as a container runtime uses it, with a network configuration list
// that runs rampart-cni against the node's agent.
func cniRuntime(t testing.TB, binDir, socket string) (*libcni.CNIConfig, *libcni.NetworkConfigList) {
	t.Helper()
	list, err := libcni.ConfListFromBytes([]byte(`{"cniVersion": "1.1.0", "name": "rampart",
  "plugins": [{"type": "rampart-cni", "socket": "` + socket + `"}]}`))
	if err != nil {
		t.Fatalf("CNI configuration: %v", err)
	}
	return libcni.NewCNIConfigWithCacheDir([]string{binDir}, t.TempDir(), nil), list
}
