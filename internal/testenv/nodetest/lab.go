package nodetest

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
	"github.com/rampartnet/rampart/internal/testenv/controlplane"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
	"github.com/rampartnet/rampart/internal/testenv/simcluster"
)

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
	// the slot's DNSServiceIP, the kubelets' clusterDNS. Start then also waits until it answers, about
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
	// Started is how long Start took, from nothing to every node Ready (the wait for a
	// slot not counted).
	Started time.Duration
	// Slot is where the lab runs on the host: its fabric, the host's address there (where
	// the API server listens and reaches the kubelets from), its pod and service ranges.
	Slot Slot

	dir                          string
	hostLink                     string // the host's link into the fabric
	scheduler, controllerManager *proc
	withoutAgents, dns           bool
}

// Start starts a cluster of real nodes and returns once every node is Ready and its agent
// has synced with the API. It runs in the first free slot of the host, waiting for one if
// all are taken. Everything is stopped and removed when the test ends.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	testenv.RequireRoot(t)
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	bins := FindBins(t, opts.DNS)
	dirs := privateDirs
	if opts.WithoutAgents {
		dirs = append(slices.Clip(dirs), agentDirs...)
	}
	slot := takeSlot(t, dirs)
	if opts.Nodes > slot.MaxNodes() {
		t.Fatalf("%d nodes: slot %d holds %d", opts.Nodes, slot.Index, slot.MaxNodes())
	}
	// After the slot: the wait for other labs is not the cluster's start.
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
	addrs, err := simcluster.LinkFabricIn(slot.Fabric, fab, netnsNames)
	if err != nil {
		t.Fatalf("fabric: %v", err)
	}
	hostLink := "rph" + suffix
	// Deleted by itself, before the namespaces: a namespace's links go with it only once
	// the kernel's clean-up of the namespace has run, some time after the lab ends, and
	// until then the slot's host address would still be on the host.
	t.Cleanup(func() {
		if err := deleteLink(hostLink); err != nil {
			t.Error(err)
		}
	})
	if err := simcluster.LinkHost(fab, hostLink, netip.PrefixFrom(slot.HostAddress, slot.Fabric.Bits())); err != nil {
		t.Fatal(err)
	}

	kopts := []k8stest.Option{k8stest.WithServiceCIDR(slot.ServiceCIDR)}
	if opts.WithoutAgents {
		kopts = append(kopts, k8stest.WithServiceAccounts())
	}
	k := k8stest.StartOn(t, slot.HostAddress, kopts...)
	k.InstallCRDs(t)
	c := &Cluster{Cluster: &clustertest.Cluster{Cluster: k, T: t}, Bins: bins, Slot: slot, dir: dir, hostLink: hostLink, withoutAgents: opts.WithoutAgents, dns: opts.DNS}
	// clustertest's AddPod makes Pod objects the kubelets run.
	c.Runtime = kubeletRuntime{c}
	if err := c.publishAPIServer(); err != nil {
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
			n.ClusterDNS = slot.DNSServiceIP
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
		if err := n.start(bins, c.Kubeconfig, slot.ClusterCIDR, cni); err != nil {
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

// takeSlot takes the host's first free lab slot (waiting for one if all are taken) and
// the mount points dirs on the host, until the test ends: then, as the last lab to end,
// it restores the sysctls the kubelets changed and removes the mount points labs made.
// What a killed lab left in the slot (its host link) is removed first.
func takeSlot(t testing.TB, dirs []string) Slot {
	t.Helper()
	l, err := theHost(t.Logf).acquire(true)
	if err != nil {
		t.Fatal(err)
	}
	// Registered before every other clean-up of the lab, so it runs after them all.
	t.Cleanup(func() {
		if err := l.release(); err != nil {
			t.Error(err)
		}
	})
	if err := removeStaleHostLinks(l.slot.HostAddress, t.Logf); err != nil {
		t.Fatal(err)
	}
	if err := l.ensureMountPoints(dirs); err != nil {
		t.Fatal(err)
	}
	return l.slot
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
