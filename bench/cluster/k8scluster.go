package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv/simcluster"
)

// K8sBinaries are what a Kubernetes-mode cluster runs: rampartd, rampart-cni and
// rampart-podrunner in BinDir, etcd and kube-apiserver in K8sBinDir
// (scripts/build-k8s.sh --dir).
type K8sBinaries struct{ BinDir, K8sBinDir string }

// Control planes a run can use.
const (
	ControlNodes = "nodes" // real nodes: kubelet, containerd and kube-proxy each (NewNodesCluster)
	ControlK8s   = "k8s"   // a Kubernetes API server and etcd; pods made by the pod runner
	ControlAgent = "agent" // nodes, pods and policies declared through each agent's API
)

// k8sCluster is two nodes in Kubernetes mode, as users run them: a real kube-apiserver and
// etcd, each node's rampartd --kubeconfig and rampart-podrunner (simcluster). Pods are Pod
// objects bound to a node, which its runner starts through the CNI; policies are
// NetworkPolicy objects written to the API; identities are the cluster's.
type k8sCluster struct {
	mode  string
	nodes []k8sNode
	// container is the pods' only container: its process only holds the sandbox; the
	// benchmark runs its servers and clients in the pod's network namespace.
	container corev1.Container
	close     func() error
	cs        kubernetes.Interface
	mu        sync.Mutex
	epIDs     map[string]uint32 // namespace/name -> the endpoint's ID on its node
}

// k8sNode is a node of a k8sCluster as the benchmark reaches its agent.
type k8sNode struct {
	Name   string
	Socket string // the agent's API socket
	Pins   string // the agent's BPF pin directory
}

// podWait bounds the wait for every pod of AddPods to be Ready, in the API and on its node.
const podWait = 3 * time.Minute

// writers is how many API writes a policy apply or delete keeps in flight.
const writers = 8

// NewK8sCluster starts a control plane and two nodes with --tunnel=mode (simcluster,
// named prefix).
func NewK8sCluster(ctx context.Context, bin K8sBinaries, mode, prefix string) (_ Cluster, err error) {
	dir, err := os.MkdirTemp("", "rp-k8scluster-")
	if err != nil {
		return nil, err
	}
	c := &k8sCluster{mode: mode, epIDs: map[string]uint32{},
		container: corev1.Container{Name: "main", Image: "rampart.local/pause", Command: []string{"sleep", "infinity"}},
		close:     func() error { return errors.Join(simcluster.Stop(dir), os.RemoveAll(dir)) }}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	state, err := simcluster.Start(ctx, simcluster.Config{
		Dir: dir, K8sBinDir: bin.K8sBinDir, BinDir: bin.BinDir, Name: prefix, Nodes: 2, Tunnel: mode,
	})
	if err != nil {
		return nil, err
	}
	for _, n := range state.Nodes {
		c.nodes = append(c.nodes, k8sNode{Name: n.Name, Socket: n.Socket, Pins: filepath.Join("/sys/fs/bpf/rampart", n.Instance)})
	}
	return c, c.connect(state.Kubeconfig)
}

// connect makes the cluster's API client.
func (c *k8sCluster) connect(kubeconfig string) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	// Thousands of policies are written at once: client-go's default 5 writes/s would
	// measure its own rate limiter.
	rc.QPS, rc.Burst = 2000, 4000
	c.cs, err = kubernetes.NewForConfig(rc)
	return err
}

func (c *k8sCluster) Mode() string { return c.mode }

// AddPods creates the namespaces and a Pod object per spec bound to its node, whose runner
// makes the sandbox and calls the CNI; then it waits until every pod is Ready with an
// address, and asks each node's agent for its pods' network namespaces.
func (c *k8sCluster) AddPods(ctx context.Context, specs []PodSpec) ([]*Pod, error) {
	for _, s := range specs {
		if s.Monitor {
			return nil, fmt.Errorf("pod %s/%s: monitor pods are made by agent clusters only", s.Namespace, s.Name)
		}
	}
	for _, ns := range namespacesOf(specs) {
		_, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating namespace %s: %w", ns, err)
		}
	}
	err := parallel(ctx, len(specs), func(i int) error {
		s := specs[i]
		labels := map[string]string{}
		for _, kv := range s.Labels {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = v
		}
		grace := int64(0)
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: labels},
			Spec: corev1.PodSpec{
				NodeName:                      c.nodes[s.Node].Name,
				TerminationGracePeriodSeconds: &grace,
				Containers:                    []corev1.Container{c.container},
			},
		}
		if _, err := c.cs.CoreV1().Pods(s.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating pod %s/%s: %w", s.Namespace, s.Name, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ips, err := c.waitReady(ctx, specs)
	if err != nil {
		return nil, err
	}
	netnsOf := map[string]api.Endpoint{}
	for _, n := range c.nodes {
		ac := api.NewClient(n.Socket)
		eps, err := ac.ListEndpoints(ctx)
		ac.Close()
		if err != nil {
			return nil, fmt.Errorf("endpoints of %s: %w", n.Name, err)
		}
		for _, e := range eps {
			netnsOf[e.Key()] = e
		}
	}
	out := make([]*Pod, len(specs))
	for i, s := range specs {
		key := s.Namespace + "/" + s.Name
		e, ok := netnsOf[key]
		if !ok {
			return nil, fmt.Errorf("the agent of %s has no endpoint for pod %s", c.nodes[s.Node].Name, key)
		}
		mtu, err := podMTU(e.Netns)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.epIDs[key] = e.EpID
		c.mu.Unlock()
		out[i] = &Pod{Name: key, Node: s.Node, IP: ips[key], MTU: mtu, Netns: e.Netns, Command: nsenterCommand(e.Netns)}
	}
	return out, nil
}

// waitReady polls the API until every pod of specs is Ready with an address.
func (c *k8sCluster) waitReady(ctx context.Context, specs []PodSpec) (map[string]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, podWait)
	defer cancel()
	want := map[string]bool{}
	for _, s := range specs {
		want[s.Namespace+"/"+s.Name] = true
	}
	for {
		ips := map[string]netip.Addr{}
		var missing string
		for _, ns := range namespacesOf(specs) {
			list, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, fmt.Errorf("listing pods of %s: %w", ns, err)
			}
			for _, p := range list.Items {
				key := p.Namespace + "/" + p.Name
				if !want[key] {
					continue
				}
				ip, err := netip.ParseAddr(p.Status.PodIP)
				if err != nil || !podReady(&p) {
					missing = key
					continue
				}
				ips[key] = ip
			}
		}
		if len(ips) == len(want) {
			return ips, nil
		}
		if missing == "" {
			missing = fmt.Sprintf("%d of %d pods", len(want)-len(ips), len(want))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pods not Ready within %v (%d of %d ready; %s is not): %w", podWait, len(ips), len(want), missing, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func namespacesOf(specs []PodSpec) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range specs {
		if !seen[s.Namespace] {
			seen[s.Namespace] = true
			out = append(out, s.Namespace)
		}
	}
	return out
}

// Apply writes the file's NetworkPolicies to the API server, writers at a time; every
// node's agent receives them through its informers. The node does not matter: policy is
// the cluster's.
func (c *k8sCluster) Apply(ctx context.Context, _ int, file string) error {
	pols, err := readNetworkPolicies(file)
	if err != nil {
		return err
	}
	return parallel(ctx, len(pols), func(i int) error {
		p := pols[i]
		_, err := c.cs.NetworkingV1().NetworkPolicies(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			var cur *networkingv1.NetworkPolicy
			if cur, err = c.cs.NetworkingV1().NetworkPolicies(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
				p.ResourceVersion = cur.ResourceVersion
				_, err = c.cs.NetworkingV1().NetworkPolicies(p.Namespace).Update(ctx, p, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("applying %s: NetworkPolicy %s/%s: %w", filepath.Base(file), p.Namespace, p.Name, err)
		}
		return nil
	})
}

// Delete deletes the file's NetworkPolicies from the API server; one already gone is not
// an error.
func (c *k8sCluster) Delete(ctx context.Context, _ int, file string) error {
	pols, err := readNetworkPolicies(file)
	if err != nil {
		return err
	}
	return parallel(ctx, len(pols), func(i int) error {
		p := pols[i]
		err := c.cs.NetworkingV1().NetworkPolicies(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s: NetworkPolicy %s/%s: %w", filepath.Base(file), p.Namespace, p.Name, err)
		}
		return nil
	})
}

// readNetworkPolicies decodes the YAML stream in file, which holds NetworkPolicies only
// (what policies.go writes).
func readNetworkPolicies(file string) ([]*networkingv1.NetworkPolicy, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 64<<10)
	var out []*networkingv1.NetworkPolicy
	for {
		var p networkingv1.NetworkPolicy
		if err := d.Decode(&p); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: document %d: %w", filepath.Base(file), len(out)+1, err)
		}
		if p.Kind != "NetworkPolicy" {
			return nil, fmt.Errorf("%s: document %d: kind %q, want NetworkPolicy", filepath.Base(file), len(out)+1, p.Kind)
		}
		out = append(out, &p)
	}
}

// parallel runs fn(0..n-1), writers at a time, and returns the first error.
func parallel(ctx context.Context, n int, fn func(i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(writers, n) {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

func (c *k8sCluster) PolicyEntries(p *Pod) (int, error) {
	c.mu.Lock()
	id, ok := c.epIDs[p.Name]
	c.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("unknown pod %s", p.Name)
	}
	return benchkit.PolicyEntries(c.nodes[p.Node].Pins, id)
}

// Close stops the cluster (pods, agents, namespaces, control plane) and removes its
// directory.
func (c *k8sCluster) Close() error { return c.close() }
