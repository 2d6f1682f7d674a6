package clustertest

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/testenv"
)

// Pod is a pod on a node: its Pod object, and the network part a runtime makes (a network
// namespace, the CNI ADD through libcni and rampart-cni, status.podIP), with echo servers
// on TCP and UDP 80 and 81.
type Pod struct {
	Namespace, Name string
	Node            *Node
	IP              netip.Addr
	Netns           string // path
	rt              *libcni.RuntimeConf
	Identity        uint32 // as the CNI ADD answered
}

// PodPorts are the ports every pod serves (echo, TCP and UDP).
var PodPorts = []uint16{80, 81}

// Runtime runs the pods of a cluster whose nodes have a real kubelet and containerd
// (nodetest sets it). Without one, the test plays the runtime's network part itself: a
// network namespace, the CNI ADD through libcni, status.podIP.
type Runtime interface {
	// Image is the image of the pods' containers: one the nodes hold, since nothing pulls.
	Image() string
	// Started waits until pod obj, bound to node n, runs, and returns its address and
	// the path of its network namespace.
	Started(ctx context.Context, n *Node, obj *corev1.Pod) (ip netip.Addr, netns string, err error)
	// Delete deletes pod p and waits until its sandbox (and so its network) is gone.
	Delete(ctx context.Context, p *Pod) error
}

// EnsureNamespace creates namespace ns with labels if it does not exist.
func (c *Cluster) EnsureNamespace(ns string, labels map[string]string) {
	c.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		c.T.Fatalf("creating namespace %s: %v", ns, err)
	}
}

// AddPod creates pod ns/name with labels on node n and plays the runtime's network part
// for it. This is the one place pods are made (a pod runner may replace it).
func (c *Cluster) AddPod(n *Node, ns, name string, labels map[string]string) *Pod {
	c.T.Helper()
	return c.AddAnnotatedPod(n, ns, name, labels, nil)
}

// AddAnnotatedPod is AddPod for a pod with annotations (a monitor's, say).
func (c *Cluster) AddAnnotatedPod(n *Node, ns, name string, labels, annotations map[string]string) *Pod {
	c.T.Helper()
	return c.AddPodWith(n, ns, name, PodOptions{Labels: labels, Annotations: annotations})
}

// PodOptions describe the Pod object AddPodWith creates.
type PodOptions struct {
	Labels, Annotations map[string]string
	// Ports are the main container's ports (named ports for policy); the pod's servers
	// listen on PodPorts whatever they say.
	Ports []corev1.ContainerPort
	// InitContainers are added as they are (a sidecar has restartPolicy Always); their
	// image is the pause image unless given.
	InitContainers []corev1.Container
}

// PodImage is the image of the pods' containers: with a Runtime, one the nodes hold;
// without, a name nothing runs (the test is the runtime).
func (c *Cluster) PodImage() string {
	if c.Runtime != nil {
		return c.Runtime.Image()
	}
	return "rampart.local/pause"
}

// AddPodWith is AddPod for a pod described by o.
func (c *Cluster) AddPodWith(n *Node, ns, name string, o PodOptions) *Pod {
	t := c.T
	t.Helper()
	c.EnsureNamespace(ns, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	image := c.PodImage()
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: o.Labels, Annotations: o.Annotations},
		Spec: corev1.PodSpec{
			NodeName:   n.Name,
			Containers: []corev1.Container{{Name: "main", Image: image, Ports: o.Ports}},
		},
	}
	for _, ic := range o.InitContainers {
		if ic.Image == "" {
			ic.Image = image
		}
		obj.Spec.InitContainers = append(obj.Spec.InitContainers, ic)
	}
	obj, err := c.Client.CoreV1().Pods(ns).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s/%s: %v", ns, name, err)
	}
	return c.runPod(ctx, n, obj)
}

// RunPod plays the runtime's network part for pod ns/name, which exists already (made
// with kubectl, say) and is bound to node n: the CNI ADD, status.podIP, echo servers.
func (c *Cluster) RunPod(n *Node, ns, name string) *Pod {
	t := c.T
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obj, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pod %s/%s: %v", ns, name, err)
	}
	if obj.Spec.NodeName != n.Name {
		t.Fatalf("pod %s/%s is bound to %q, not %s", ns, name, obj.Spec.NodeName, n.Name)
	}
	return c.runPod(ctx, n, obj)
}

func (c *Cluster) runPod(ctx context.Context, n *Node, obj *corev1.Pod) *Pod {
	t := c.T
	t.Helper()
	ns, name := obj.Namespace, obj.Name
	p := &Pod{Namespace: ns, Name: name, Node: n}
	if c.Runtime != nil {
		return c.startedPod(n, p, obj)
	}
	// 12 hex digits: with thousands of pods (bench/propagation makes 2,000) six collided.
	p.Netns = newNetns(t, "rp-"+testenv.Suffix(12)+"-pod")
	// The runtime's ADD: libcni runs rampart-cni, which asks the node's agent.
	p.rt = &libcni.RuntimeConf{ContainerID: "c" + testenv.Suffix(12), NetNS: p.Netns, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", ns}, {"K8S_POD_NAME", name}}}
	res, err := n.cni.AddNetworkList(ctx, n.cniList, p.rt)
	if err != nil {
		t.Fatalf("CNI ADD of pod %s/%s on %s: %v", ns, name, n.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.cni.DelNetworkList(ctx, n.cniList, p.rt) // the agent may be gone already: its uninstall removes it then
	})
	r, err := types100.NewResultFromResult(res)
	if err != nil || len(r.IPs) != 1 {
		t.Fatalf("CNI ADD of pod %s/%s: result %v: %v", ns, name, res, err)
	}
	ip, ok := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	if !ok {
		t.Fatalf("CNI ADD of pod %s/%s: address %v", ns, name, r.IPs[0].Address)
	}
	ep, err := n.Client.GetEndpoint(ctx, ns, name)
	if err != nil {
		t.Fatalf("pod %s/%s's endpoint: %v", ns, name, err)
	}
	p.IP, p.Identity = ip, uint32(ep.Identity)
	obj.Status.Phase = corev1.PodRunning
	obj.Status.PodIP = p.IP.String()
	obj.Status.PodIPs = []corev1.PodIP{{IP: p.IP.String()}}
	obj.Status.HostIP = n.Address.String()
	if _, err := c.Client.CoreV1().Pods(ns).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("writing pod %s/%s's status: %v", ns, name, err)
	}
	c.serve(p)
	return p
}

// startedPod is runPod on nodes with a Runtime: the kubelet runs the pod and writes its
// status; the test waits for it and serves in its network namespace.
func (c *Cluster) startedPod(n *Node, p *Pod, obj *corev1.Pod) *Pod {
	t := c.T
	t.Helper()
	// Longer than a CNI ADD: the kubelet's sync, the sandbox and the containers come first.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ip, netns, err := c.Runtime.Started(ctx, n, obj)
	if err != nil {
		t.Fatalf("pod %s on %s: %v", p.Key(), n.Name, err)
	}
	ep, err := n.Client.GetEndpoint(ctx, p.Namespace, p.Name)
	if err != nil {
		t.Fatalf("pod %s's endpoint: %v", p.Key(), err)
	}
	p.IP, p.Netns, p.Identity = ip, netns, uint32(ep.Identity)
	c.serve(p)
	return p
}

// serve starts the pod's echo servers on PodPorts until the test ends.
func (c *Cluster) serve(p *Pod) {
	c.T.Helper()
	s, err := testenv.Serve(p.Netns, PodPorts, PodPorts)
	if err != nil {
		c.T.Fatalf("servers in pod %s: %v", p.Key(), err)
	}
	c.T.Cleanup(s.Close)
}

// Probe reports whether p reaches to:port over proto ("tcp", "udp") within timeout.
func (p *Pod) Probe(to netip.Addr, port uint16, proto string, timeout time.Duration) bool {
	return testenv.Probe(p.Netns, netip.AddrPortFrom(to, port), strings.ToLower(proto), timeout)
}

// Key is "namespace/name".
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// Label sets labels on the Pod object (kubectl label --overwrite).
func (c *Cluster) Label(p *Pod, kv ...string) {
	c.T.Helper()
	c.MustKubectl(append([]string{"label", "--overwrite", "-n", p.Namespace, "pod", p.Name}, kv...)...)
}

// Delete deletes the pod as the kubelet would once its containers ended: the CNI DEL,
// then the Pod object with no grace period (a graceful delete waits for a kubelet); with a
// Runtime, the kubelet does it.
func (c *Cluster) Delete(p *Pod) {
	c.T.Helper()
	if c.Runtime != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Runtime.Delete(ctx, p); err != nil {
			c.T.Fatalf("deleting pod %s: %v", p.Key(), err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Node.cni.DelNetworkList(ctx, p.Node.cniList, p.rt); err != nil {
		c.T.Fatalf("CNI DEL of pod %s: %v", p.Key(), err)
	}
	zero := int64(0)
	if err := c.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		c.T.Fatalf("deleting pod %s: %v", p.Key(), err)
	}
}
