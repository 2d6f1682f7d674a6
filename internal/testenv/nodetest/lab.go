package nodetest

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/k8s/controlplane"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
	"github.com/rampartnet/rampart/internal/testenv/simcluster"
)

// HostAddress is the host's address on the fabric: the API server listens there, and the
// API server reaches the kubelets (at their InternalIPs) from there. It is the fabric's
// .254, fixed, which is why one lab runs on a host at a time.
var HostAddress = netip.AddrFrom4([4]byte{198, 19, 254, 254})

// lockFile serializes the labs on a host (HostAddress is fixed).
const lockFile = "/run/rampart-nodetest.lock"

// Options configure Start.
type Options struct {
	// Nodes is the number of nodes (default 2).
	Nodes int
	// WithoutAgents starts the nodes with no rampartd on the host and no CNI configuration:
	// Rampart is to be installed as users install it, from its image by deploy/'s
	// DaemonSet, whose agent pods write the configuration. The nodes stay NotReady until
	// then, so Start returns once they registered with a pod CIDR (WaitNodesReady waits
	// for the rest). The API server then issues service account tokens, which the agent
	// pods' in-cluster configuration reads, and each node has its own /run/rampart and
	// /var/lib/rampart (the DaemonSet's hostPath volumes).
	WithoutAgents bool
	// Images are more image archives imported into every node's containerd, as pause and
	// agnhost are (e.g. scripts/build-image.sh's): there is no registry to pull from.
	Images []string
	// Tunnel is the agents' --tunnel (default native routing); with WithoutAgents, deploy/'s
	// ConfigMap says it (InstallRampart's settings).
	Tunnel overlay.Mode
	// AgentFlags are more flags for every rampartd on the host (not with WithoutAgents);
	// the Service translation's --service-cgroup is the lab's own.
	AgentFlags []string
	// DNS runs the cluster DNS: CoreDNS (coredns.yaml) behind the kube-dns Service at
	// DNSServiceIP, the kubelets' clusterDNS. Start then also waits until it answers, about
	// 10-15 s more, which tests that resolve no names need not spend. With WithoutAgents,
	// InstallRampart starts it once the nodes are Ready.
	DNS bool
}

// Cluster is a control plane, the scheduler and controller manager, and real nodes.
type Cluster struct {
	*clustertest.Cluster
	Bins Bins
	// Nodes are the real nodes (the embedded clustertest.Cluster's Nodes are their agents).
	Nodes []*Node
	// Started is how long Start took, from nothing to every node Ready.
	Started time.Duration

	dir                          string
	hostLink                     string // the host's link into the fabric
	scheduler, controllerManager *proc
	withoutAgents, dns           bool
}

// Start starts a cluster of real nodes and returns once every node is Ready and its agent
// has synced with the API. Everything is stopped and removed when the test ends.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	testenv.RequireRoot(t)
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	bins := FindBins(t, opts.DNS)
	lock(t)
	// After the lock: the wait for another lab is not the cluster's start.
	began := time.Now()
	dir, err := os.MkdirTemp("", "rampart-nodes-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	suffix := testenv.Suffix(6)
	fab := "rp-" + suffix + "-fab"
	var netnsNames []string
	for i := range opts.Nodes {
		netnsNames = append(netnsNames, fmt.Sprintf("rp-%s-n%d", suffix, i+1))
	}
	t.Cleanup(func() {
		if err := simcluster.DeleteNetns(append([]string{fab}, netnsNames...)...); err != nil {
			t.Error(err)
		}
	})
	addrs, err := simcluster.LinkFabric(fab, netnsNames)
	if err != nil {
		t.Fatalf("fabric: %v", err)
	}
	hostLink := "rph" + suffix
	if err := simcluster.LinkHost(fab, hostLink, HostAddress); err != nil {
		t.Fatal(err)
	}

	var kopts []k8stest.Option
	dirs := privateDirs
	if opts.WithoutAgents {
		kopts = append(kopts, k8stest.WithServiceAccounts())
		dirs = append(slices.Clip(dirs), agentDirs...)
	}
	k := k8stest.StartOn(t, HostAddress, kopts...)
	k.InstallCRDs(t)
	c := &Cluster{Cluster: &clustertest.Cluster{Cluster: k, T: t}, Bins: bins, dir: dir, hostLink: hostLink, withoutAgents: opts.WithoutAgents, dns: opts.DNS}
	// clustertest's AddPod makes Pod objects the kubelets run.
	c.Runtime = kubeletRuntime{c}
	if err := c.publishAPIServer(); err != nil {
		t.Fatal(err)
	}

	saved, err := recordSysctls()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := restoreSysctls(saved); err != nil {
			t.Error(err)
		}
	})
	mounts, err := ensureMountPoints(dirs, suffix)
	t.Cleanup(func() {
		if err := mounts.remove(); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		c.scheduler.stop(10 * time.Second)
		c.controllerManager.stop(10 * time.Second)
		if t.Failed() {
			c.logTails("kube-scheduler.log", "kube-controller-manager.log")
		}
	})
	if err := c.startControllers(); err != nil {
		t.Fatal(err)
	}

	for i := range opts.Nodes {
		name := fmt.Sprintf("node-%d", i+1)
		root := "/rampart-" + suffix + "-" + name
		// The Service translation is attached where the node's pods run: the kubelet's
		// cgroupRoot in the cgroup2 hierarchy, which runc joins beside the v1 ones. Not
		// the host's root, where it would rewrite every host socket (and the other
		// node's pods twice); kube-proxy still serves NodePorts from outside.
		agentOpts := clustertest.Options{Tunnel: opts.Tunnel,
			AgentFlags: append([]string{"--service-cgroup", filepath.Join(datapath.DefaultServiceCgroup(), root)}, opts.AgentFlags...)}
		n := &Node{
			Dir:        filepath.Join(dir, name),
			CgroupRoot: root,
			dirs:       dirs,
			images:     opts.Images,
		}
		if opts.WithoutAgents {
			// The node, without the agent clustertest would start on the host.
			n.Node = &clustertest.Node{Name: name, Address: addrs[i], Netns: netnsNames[i]}
		} else {
			n.Node = c.AddNode(name, netnsNames[i], addrs[i], agentOpts)
		}
		if opts.DNS {
			n.ClusterDNS = DNSServiceIP
		}
		c.Nodes = append(c.Nodes, n)
	}
	// Registered after the agents' cleanups, so it runs before them: the pods' CNI DELs
	// reach a running agent.
	t.Cleanup(func() {
		for _, n := range c.Nodes {
			if err := n.stop(filepath.Join(bins.CRI, "crictl")); err != nil {
				t.Error(err)
			}
			if t.Failed() {
				c.logTails(n.Name+"/containerd.log", n.Name+"/kubelet.log", n.Name+"/kube-proxy.log")
			}
		}
	})
	cni := ""
	if !opts.WithoutAgents {
		cni = filepath.Join(clustertest.Bins.Dir(t), "rampart-cni")
	}
	for _, n := range c.Nodes {
		if err := n.start(bins, c.Kubeconfig, cni); err != nil {
			t.Fatalf("starting node %s: %v", n.Name, err)
		}
	}
	// The agents wait for their Node's InternalIP and pod CIDR: the kubelet registers the
	// first, kube-controller-manager allocates the second.
	for _, n := range c.Nodes {
		n.PodCIDR = c.waitNode(n, func(node *corev1.Node) bool { return node.Spec.PodCIDR != "" }, "registered with a pod CIDR")
		if err := c.routePodCIDR(n); err != nil {
			t.Fatal(err)
		}
	}
	if opts.WithoutAgents {
		c.Started = time.Since(began)
		t.Logf("cluster of %d real nodes without agents started in %v", opts.Nodes, c.Started.Round(time.Millisecond))
		return c
	}
	for _, n := range c.Nodes {
		n.Node.Start()
	}
	for _, n := range c.Nodes {
		n.WaitSynced()
	}
	for _, n := range c.Nodes {
		c.waitNode(n, nodeReady, "Ready")
	}
	if opts.DNS {
		c.startDNS()
	}
	c.Started = time.Since(began)
	t.Logf("cluster of %d real nodes started in %v (DNS: %v)", opts.Nodes, c.Started.Round(time.Millisecond), opts.DNS)
	return c
}

// WaitNodesReady waits up to timeout for every node to be Ready: with WithoutAgents, once
// the agent pods installed the CNI configuration.
func (c *Cluster) WaitNodesReady(timeout time.Duration) error {
	notReady := func() []string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var names []string
		for _, n := range c.Nodes {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil || !nodeReady(node) {
				names = append(names, n.Name)
			}
		}
		return names
	}
	if !testenv.Eventually(timeout, func() bool { return len(notReady()) == 0 }) {
		return fmt.Errorf("nodes %v not Ready after %v", notReady(), timeout)
	}
	return nil
}

func nodeReady(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitNode waits up to 3 minutes for n's Node object to satisfy ok and returns its pod
// CIDR.
func (c *Cluster) waitNode(n *Node, ok func(*corev1.Node) bool, what string) netip.Prefix {
	c.T.Helper()
	var last *corev1.Node
	if !testenv.Eventually(3*time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = node
		return ok(node)
	}) {
		c.T.Fatalf("node %s not %s after 3 minutes (Node %+v); its kubelet log ends:\n%s", n.Name, what, last, controlplane.LogTail(n.path("kubelet.log"), 30))
	}
	if last.Spec.PodCIDR == "" {
		return netip.Prefix{}
	}
	p, err := netip.ParsePrefix(last.Spec.PodCIDR)
	if err != nil {
		c.T.Fatalf("node %s: spec.podCIDR %q: %v", n.Name, last.Spec.PodCIDR, err)
	}
	return p
}

// lock takes the host's lab lock, waiting for another lab to end, until the test ends.
func lock(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(lockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("locking %s: %v", lockFile, err)
	}
	t.Cleanup(func() { f.Close() })
	if err := removeStaleHostLinks(t.Logf); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) logTails(names ...string) {
	for _, name := range names {
		c.T.Logf("%s ends:\n%s", name, controlplane.LogTail(filepath.Join(c.dir, name), 30))
	}
}

// RSS returns the resident memory (KiB) of each process of the cluster by name
// ("node-1/kubelet"), the shims and containers not included but CoreDNS's
// ("node-1/coredns-1").
func (c *Cluster) RSS() map[string]int64 {
	m := map[string]int64{}
	add := func(name string, pid int) {
		if pid > 0 {
			m[name] = rssKiB(pid)
		}
	}
	add("etcd", c.EtcdPid())
	add("kube-apiserver", c.APIServerPid())
	add("kube-scheduler", c.scheduler.pid())
	add("kube-controller-manager", c.controllerManager.pid())
	for _, n := range c.Nodes {
		for _, p := range []*proc{n.containerd, n.kubelet, n.kubeProxy} {
			add(n.Name+"/"+p.name, p.pid())
		}
		add(n.Name+"/rampartd", n.AgentPid())
		if c.withoutAgents {
			if pid, err := n.agentPodPid(filepath.Join(c.Bins.CRI, "crictl")); err == nil {
				add(n.Name+"/rampartd (pod)", pid)
			}
		}
		for i, pid := range n.podPids("coredns") {
			add(fmt.Sprintf("%s/coredns-%d", n.Name, i+1), pid)
		}
	}
	return m
}

// RSSReport formats RSS sorted by name, one process per line.
func (c *Cluster) RSSReport() string {
	m := c.RSS()
	var names []string
	var total int64
	for name, kib := range m {
		names = append(names, name)
		total += kib
	}
	sort.Strings(names)
	s := ""
	for _, name := range names {
		s += fmt.Sprintf("%-28s %7.1f MiB\n", name, float64(m[name])/1024)
	}
	return s + fmt.Sprintf("%-28s %7.1f MiB\n", "total", float64(total)/1024)
}
