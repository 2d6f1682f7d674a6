package nodetest

import (
	"context"
	_ "embed"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/testenv"
)

//go:embed coredns.yaml
var corednsManifest string

// ClusterDomain is the cluster's DNS domain (the kubelets' clusterDomain, CoreDNS's zone).
const ClusterDomain = "cluster.local"

// CoreDNSManifest is the cluster DNS's manifest (coredns.yaml) with image as CoreDNS's
// image and dnsIP as the kube-dns Service's cluster IP: the lab's Slot.DNSServiceIP, which
// every kubelet gives its pods as their nameserver (clusterDNS). It is fixed, as a
// kubelet's configuration needs, and in the low sixteenth of the service range, which the
// API server keeps for addresses asked for by name, so no Service created before it takes
// it by chance.
func CoreDNSManifest(image string, dnsIP netip.Addr) string {
	return strings.NewReplacer("image: IMAGE", "image: "+image,
		"clusterIP: DNS_IP", "clusterIP: "+dnsIP.String()).Replace(corednsManifest)
}

// findCoreDNS sets b's CoreDNS directory and image (scripts/build-coredns.sh's, named after
// COREDNS_VERSION of tools/node/versions.env); the test is skipped (failed when CI=true)
// when a file is missing.
func findCoreDNS(t testing.TB, b *Bins, version string) {
	t.Helper()
	b.CoreDNS = filepath.Join(filepath.Dir(b.Node), "coredns-"+version)
	for _, f := range []string{"coredns.tar", "coredns.ref"} {
		if _, err := os.Stat(filepath.Join(b.CoreDNS, f)); err != nil {
			testenv.SkipOrFail(t, "%s missing (build with scripts/build-coredns.sh): %v", f, err)
		}
	}
	b.CoreDNSImage = readRef(t, filepath.Join(b.CoreDNS, "coredns.ref"))
}

// publishAPIServer writes the default/kubernetes Service's EndpointSlice: the API server's
// address and port. The API server does not (it runs with --endpoint-reconciler-type=none,
// which its loopback address in other labs needs), yet pods reach it only through that
// Service (in-cluster configuration: KUBERNETES_SERVICE_HOST is the Service's cluster IP,
// which the agents translate to this endpoint).
func (c *Cluster) publishAPIServer() error {
	u, err := url.Parse(c.Server)
	if err != nil {
		return fmt.Errorf("api server url %q: %w", c.Server, err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return fmt.Errorf("api server url %q: port: %w", c.Server, err)
	}
	name, proto, port32, ready := "https", corev1.ProtocolTCP, int32(port), true
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault, Labels: map[string]string{
			discoveryv1.LabelServiceName: "kubernetes",
			discoveryv1.LabelManagedBy:   "nodetest.rampart.dev",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{c.Slot.HostAddress.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports: []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port32}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("writing the kubernetes service's endpointslice: %w", err)
	}
	return nil
}

// routePodCIDR routes n's pod CIDR from the host through n, so that pods' connections to
// the API server (on the host's fabric address) are answered. The route goes with the
// host's fabric link when the lab ends.
func (c *Cluster) routePodCIDR(n *Node) error {
	link, err := netlink.LinkByName(c.hostLink)
	if err != nil {
		return fmt.Errorf("host fabric link %s: %w", c.hostLink, err)
	}
	dst := &net.IPNet{IP: n.PodCIDR.Addr().AsSlice(), Mask: net.CIDRMask(n.PodCIDR.Bits(), 32)}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Gw: n.Address.AsSlice()}); err != nil {
		return fmt.Errorf("route to node %s's pod cidr %v: %w", n.Name, n.PodCIDR, err)
	}
	return nil
}

// startDNS applies the CoreDNS manifest and waits (2 minutes at most) until every CoreDNS
// replica is ready and the kube-dns Service answers a query for the kubernetes Service from
// the host, through the agents' Service translation: then a pod's first lookup does not
// race the cluster DNS's start.
func (c *Cluster) startDNS() {
	t := c.T
	t.Helper()
	began := time.Now()
	c.KubectlApply(CoreDNSManifest(c.Bins.CoreDNSImage, c.Slot.DNSServiceIP))
	name := "kubernetes.default.svc." + ClusterDomain
	want := c.KubernetesServiceIP().String()
	var last string
	if !testenv.Eventually(2*time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		d, err := c.Client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false
		}
		if d.Spec.Replicas == nil || d.Status.ReadyReplicas != *d.Spec.Replicas {
			last = fmt.Sprintf("%d of %d replicas ready", d.Status.ReadyReplicas, *d.Spec.Replicas)
			return false
		}
		servers, err := c.CoreDNSAddrs(ctx)
		if err != nil || len(servers) == 0 {
			last = fmt.Sprintf("CoreDNS pods' addresses: %v %v", servers, err)
			return false
		}
		addrs, err := Resolver("", "", servers[0]).LookupHost(ctx, name)
		if err != nil || len(addrs) != 1 || addrs[0] != want {
			last = fmt.Sprintf("%s: %v %v", name, addrs, err)
			return false
		}
		return true
	}) {
		t.Fatalf("cluster DNS not ready after 2 minutes: %s\n%s", last,
			c.MustKubectl("-n", "kube-system", "get", "pods,endpointslices,events", "-o", "wide"))
	}
	t.Logf("cluster DNS answering %v after applying CoreDNS", time.Since(began).Round(time.Millisecond))
}

// Resolver is a DNS resolver that asks server only (a CoreDNS pod's address), from the
// network namespace at netns (the caller's own if netns is ""), over network ("udp" or
// "tcp"; "" for what the resolver chooses): what a pod's lookups send, without the pod's
// search path. Each exchange waits 2 seconds at most. It asks a CoreDNS pod, not the
// kube-dns Service: the Service address is translated for the pods' own sockets (their
// cgroup), and the caller's sockets are not the pods', even from a pod's namespace.
func Resolver(netns, network string, server netip.Addr) *net.Resolver {
	to := netip.AddrPortFrom(server, 53)
	return &net.Resolver{PreferGo: true, Dial: func(_ context.Context, asked, _ string) (net.Conn, error) {
		if network != "" {
			asked = network
		}
		if netns == "" {
			return net.DialTimeout(asked, to.String(), 2*time.Second)
		}
		return testenv.Dial(netns, asked, to, 2*time.Second)
	}}
}

// CoreDNSAddrs are the addresses of the CoreDNS pods that are ready.
func (c *Cluster) CoreDNSAddrs(ctx context.Context) ([]netip.Addr, error) {
	list, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		return nil, fmt.Errorf("listing CoreDNS pods: %w", err)
	}
	var addrs []netip.Addr
	for _, p := range list.Items {
		ready := false
		for _, cond := range p.Status.Conditions {
			ready = ready || (cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue)
		}
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil && ready {
			addrs = append(addrs, a)
		}
	}
	return addrs, nil
}

// podPids are the pids of the processes named comm in n's pods (its cgroupRoot in the
// memory hierarchy): for RSS, which counts the cluster DNS among the cluster's processes.
func (n *Node) podPids(comm string) []int {
	var pids []int
	filepath.WalkDir(filepath.Join(cgroupBase, "memory", n.CgroupRoot), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			if c, err := os.ReadFile("/proc/" + f + "/comm"); err == nil && strings.TrimSpace(string(c)) == comm {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}
