package realcluster

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// dnsWebServices: a ClusterIP Service and a headless one for the web pods.
const dnsWebServices = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: %[1]s}
spec:
  selector: {app: web}
  ports: [{port: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: web-headless, namespace: %[1]s}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{port: 8080, protocol: TCP}]
`

// dnsPolicies: the client pods may send only DNS, to the kube-dns pods (the usual rule
// that lets DNS through a default-deny egress policy); the other pods may send nothing.
const dnsPolicies = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-dns-only, namespace: %[1]s}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}
      podSelector: {matchLabels: {k8s-app: kube-dns}}
    ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: other-no-egress, namespace: %[1]s}
spec:
  podSelector: {matchLabels: {app: other}}
  policyTypes: [Egress]
`

// The cluster DNS on real nodes: pods on both nodes get kube-dns as their nameserver and
// their namespace's search path from the kubelet; they resolve a Service by its full name
// and by its short name (search path, through the pod's own resolver, agnhost connect),
// kubernetes.default (and reach the API server through it), and a headless Service to its
// pods' addresses. Under an egress policy that allows only DNS to the kube-dns pods
// (namespaceSelector kube-system and podSelector k8s-app=kube-dns), a client pod still
// resolves over UDP and TCP while its connection to the Service it resolved is dropped;
// a pod under a policy that allows no egress cannot resolve.
func TestClusterDNS(t *testing.T) {
	c := nodetest.Start(t, nodetest.Options{Nodes: 2, DNS: true})
	began := time.Now()
	ctx := context.Background()
	ns := "dns-" + testenv.Suffix(6)
	c.MustKubectl("create", "namespace", ns)
	pods := deployWebClientOther(t, c, ns) // app -> node -> pod
	c.KubectlApply(fmt.Sprintf(dnsWebServices, ns))
	svc, err := c.Client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var webIPs []string
	for _, p := range pods["web"] {
		webIPs = append(webIPs, p.Status.PodIP)
	}
	slices.Sort(webIPs)
	fqdn := "web." + ns + ".svc." + nodetest.ClusterDomain
	kubernetes := "kubernetes.default.svc." + nodetest.ClusterDomain
	want := map[string][]string{
		fqdn: {svc.Spec.ClusterIP},
		"web-headless." + ns + ".svc.cluster.local": webIPs,
		kubernetes: {c.KubernetesServiceIP().String()},
	}

	for _, node := range c.Nodes {
		client := pods["client"][node.Name]
		out := c.MustKubectl("-n", ns, "exec", client.Name, "--", "/agnhost", "dns-server-list")
		if strings.TrimSpace(out) != c.Slot.DNSServiceIP.String() {
			t.Errorf("%s on %s: nameservers %q, want %v", client.Name, node.Name, out, c.Slot.DNSServiceIP)
		}
		out = c.MustKubectl("-n", ns, "exec", client.Name, "--", "/agnhost", "dns-suffix")
		if !strings.HasPrefix(strings.TrimSpace(out), ns+".svc.cluster.local,svc.cluster.local,cluster.local") {
			t.Errorf("%s on %s: search path %q, want %s.svc.cluster.local,svc.cluster.local,cluster.local first", client.Name, node.Name, out, ns)
		}
		// The pod's own resolver (Go's, in agnhost), with the search path for short names.
		for _, to := range []string{fqdn + ":8080", "web:8080", "web." + ns + ":8080", "kubernetes.default:443"} {
			var out string
			if !testenv.Eventually(30*time.Second, func() bool {
				out, err = c.Kubectl("-n", ns, "exec", client.Name, "--", "/agnhost", "connect", to, "--timeout=2s")
				return err == nil
			}) {
				t.Errorf("%s on %s: agnhost connect %s: %v\n%s", client.Name, node.Name, to, err, out)
			}
		}
		netns := podNetns(t, c, client)
		for name, addrs := range want {
			var got []string
			// The headless Service's answer follows its EndpointSlice, which may lag.
			if !testenv.Eventually(15*time.Second, func() bool { got = lookup(c, netns, "", name); return slices.Equal(got, addrs) }) {
				t.Errorf("%s on %s: %s resolves to %v, want %v", client.Name, node.Name, name, got, addrs)
			}
		}
	}
	t.Logf("names resolved from both nodes in %v", time.Since(began).Round(time.Millisecond))

	c.KubectlApply(fmt.Sprintf(dnsPolicies, ns))
	policyApplied := time.Now()
	for _, node := range c.Nodes {
		client, other := pods["client"][node.Name], pods["other"][node.Name]
		clientNetns, otherNetns := podNetns(t, c, client), podNetns(t, c, other)
		// The other pods' lookups stop once the policy is in force; the client pods'
		// never do.
		var got map[string][]string
		if !testenv.Eventually(30*time.Second, func() bool {
			got = map[string][]string{
				"client udp": lookup(c, clientNetns, "udp", fqdn), "client tcp": lookup(c, clientNetns, "tcp", fqdn),
				"other udp": lookup(c, otherNetns, "udp", fqdn), "other tcp": lookup(c, otherNetns, "tcp", fqdn),
			}
			return slices.Equal(got["client udp"], want[fqdn]) && slices.Equal(got["client tcp"], want[fqdn]) &&
				got["other udp"] == nil && got["other tcp"] == nil
		}) {
			t.Errorf("on %s under the policies, %s resolves to %v; want the client pod's answered over UDP and TCP (%v), the other pod's not", node.Name, fqdn, got, want[fqdn])
		}
		// The client's own resolver, search path included, still answers; the connection
		// to what it resolved is dropped by the same policy.
		out, err := c.Kubectl("-n", ns, "exec", client.Name, "--", "/agnhost", "connect", "web:8080", "--timeout=1s")
		if err == nil || !strings.Contains(out, "TIMEOUT") {
			t.Errorf("%s on %s: agnhost connect web:8080 under DNS-only egress: %v, %q; want a TIMEOUT after resolving", client.Name, node.Name, err, out)
		}
	}
	t.Logf("policies judged from both nodes %v after applying them", time.Since(policyApplied).Round(time.Millisecond))

	fqdnPhase(t, c, ns, pods, fqdn, kubernetes)
	t.Logf("test body (after start) took %v", time.Since(began).Round(time.Millisecond))

	list, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		t.Logf("CoreDNS pod %s on %s at %s", p.Name, p.Spec.NodeName, p.Status.PodIP)
	}
	t.Logf("resident memory with 6 pods and CoreDNS:\n%s", c.RSSReport())
}

// clientFQDN: the client pods may ask kube-dns for names in their namespace only
// (rules.dns) and connect to the addresses learnt for the headless Service (toFQDNs).
const clientFQDN = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: client-fqdn, namespace: %[1]s}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toEndpoints: [{matchLabels: {"k8s:io.kubernetes.pod.namespace": kube-system, k8s-app: kube-dns}}]
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns: [{matchPattern: "*.%[1]s.svc.cluster.local"}]
  - toFQDNs: [{matchName: web-headless.%[1]s.svc.cluster.local}]
    toPorts:
    - ports: [{port: "8080", protocol: TCP}]
`

// fqdnPhase: with DNS rules and toFQDNs instead of the plain DNS allow, the client pods'
// queries go through their node's DNS proxy on the way to CoreDNS: names outside their
// namespace are refused, and the web pods' addresses open to a client only once that
// client's node learnt them from an answer: each node learns from its own pods.
func fqdnPhase(t *testing.T, c *nodetest.Cluster, ns string, pods map[string]map[string]corev1.Pod, fqdn, kubernetes string) {
	t.Helper()
	c.MustKubectl("-n", ns, "delete", "networkpolicy", "client-dns-only")
	c.KubectlApply(fmt.Sprintf(clientFQDN, ns))
	headless := "web-headless." + ns + ".svc." + nodetest.ClusterDomain
	var webIPs []netip.AddrPort
	for _, p := range pods["web"] {
		webIPs = append(webIPs, netip.AddrPortFrom(netip.MustParseAddr(p.Status.PodIP), 8080))
	}
	opens := func(netns string) []bool {
		var out []bool
		for _, to := range webIPs {
			conn, err := testenv.Dial(netns, "tcp", to, 500*time.Millisecond)
			if err == nil {
				conn.Close()
			}
			out = append(out, err == nil)
		}
		return out
	}
	first, second := c.Nodes[0], c.Nodes[1]
	clientA, clientB := podNetns(t, c, pods["client"][first.Name]), podNetns(t, c, pods["client"][second.Name])
	// In force on both nodes: a name outside the namespace is refused while the
	// namespace's own still resolve, and the web pods are closed to both clients.
	for _, netns := range []string{clientA, clientB} {
		if !testenv.Eventually(30*time.Second, func() bool {
			return lookup(c, netns, "", kubernetes) == nil && lookup(c, netns, "", fqdn) != nil && !slices.Contains(opens(netns), true)
		}) {
			t.Fatalf("the DNS policy is not in force: %s resolves to %v, %s to %v, web pods open %v",
				kubernetes, lookup(c, netns, "", kubernetes), fqdn, lookup(c, netns, "", fqdn), opens(netns))
		}
	}
	if got := lookup(c, clientA, "", headless); len(got) != len(webIPs) {
		t.Fatalf("%s from the client on %s: %v, want the %d web pods", headless, first.Name, got, len(webIPs))
	}
	if got := opens(clientA); slices.Contains(got, false) {
		t.Errorf("web pods open to the client on %s right after its answer: %v, want all", first.Name, got)
	}
	if got := opens(clientB); slices.Contains(got, true) {
		t.Errorf("web pods open to the client on %s, whose node learnt nothing: %v, want none", second.Name, got)
	}
	if got := lookup(c, clientB, "tcp", headless); len(got) != len(webIPs) {
		t.Fatalf("%s over TCP from the client on %s: %v", headless, second.Name, got)
	}
	if got := opens(clientB); slices.Contains(got, false) {
		t.Errorf("web pods open to the client on %s after its answer: %v, want all", second.Name, got)
	}
}

// lookup resolves name from the network namespace at netns, asking a CoreDNS pod over network
// ("" for UDP, TCP if truncated), and returns its IPv4 addresses sorted, nil if it fails
// within 3 s.
func lookup(c *nodetest.Cluster, netns, network, name string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	servers, err := c.CoreDNSAddrs(ctx)
	if err != nil || len(servers) == 0 {
		return nil
	}
	ips, err := nodetest.Resolver(netns, network, servers[0]).LookupIP(ctx, "ip4", name)
	if err != nil {
		return nil
	}
	var s []string
	for _, ip := range ips {
		s = append(s, ip.String())
	}
	slices.Sort(s)
	return s
}

// podNetns is the network namespace of pod's sandbox, asked of its node's containerd.
func podNetns(t *testing.T, c *nodetest.Cluster, pod corev1.Pod) string {
	t.Helper()
	for _, n := range c.Nodes {
		if n.Name == pod.Spec.NodeName {
			path, err := n.PodNetns(filepath.Join(c.Bins.CRI, "crictl"), pod.Namespace, pod.Name)
			if err != nil {
				t.Fatal(err)
			}
			return path
		}
	}
	t.Fatalf("pod %s is on no node of the cluster", pod.Name)
	return ""
}
