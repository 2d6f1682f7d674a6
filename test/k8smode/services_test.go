package k8smode

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// A NodePort Service from the API (its EndpointSlice written as the controller would): a
// pod on one node reaches the backend on the other through the cluster IP and through
// either node's address at the node port, and policy
// judges the backend: an egress ipBlock of the backend's /32 admits the Service, one of
// another pod's denies it. On simulated nodes, both nodes' agents attach the translation
// to a cgroup of the test's (simulated nodes share a host), which their idempotent
// translation allows; on real nodes, to the kubelets' cgroup. The test's probes, made in
// the pod's network namespace, come from a cgroup inside it, as the pods' own processes.
func TestServiceAcrossNodes(t *testing.T) {
	cg := testenv.NewCgroup(t)
	c := startCluster(t, clustertest.Options{Nodes: 2, Tunnel: overlay.VXLAN, AgentFlags: []string{"--service-cgroup", cg}})
	a, cc, b := threePods(t, c)
	testenv.JoinNewCgroupIn(t, c.Nodes[0].ServiceCgroup())
	const clusterIP = "198.19.255.200" // inside the API server's service range
	svc := netip.AddrPortFrom(netip.MustParseAddr(clusterIP), 8080)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.Client.CoreV1().Services("x").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: clusterIP, Selector: map[string]string{"pod": "b"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 8080, TargetPort: intstr.FromInt32(80), NodePort: 30080}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := true
	_, err = c.Client.DiscoveryV1().EndpointSlices("x").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(80))}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{b.IP.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fronts := []netip.AddrPort{svc}
	for _, n := range c.Nodes {
		fronts = append(fronts, netip.AddrPortFrom(n.Address, 30080))
	}
	// reaches reports whether every frontend answers (want) or none does (!want).
	reaches := func(want bool) bool {
		timeout := allowWait
		if !want {
			timeout = denyWait
		}
		for _, f := range fronts {
			if testenv.Probe(a.Netns, f, "tcp", timeout) != want {
				t.Logf("%s -> %v: answered=%v", a.Key(), f, !want)
				return false
			}
		}
		return true
	}
	if !testenv.Eventually(propagate, func() bool { return reaches(true) }) {
		t.Fatalf("%s -> Service %v (backend %s on %s): no answer", a.Key(), fronts, b.Key(), b.Node.Name)
	}

	c.KubectlApply(egressTo("x", b.IP))
	waitFor(t, "egress policy applied", probe{a, cc, 80, "tcp", false})
	if !reaches(true) {
		t.Errorf("Service whose backend's /32 the egress policy allows: no answer")
	}
	c.KubectlApply(egressTo("x", cc.IP))
	waitFor(t, "egress policy changed", probe{a, cc, 80, "tcp", true})
	if !reaches(false) {
		t.Errorf("Service whose backend the egress policy does not allow: answered")
	}
}

func egressTo(ns string, ip netip.Addr) string {
	return `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-egress, namespace: ` + ns + `}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: ` + ip.String() + `/32}}]
`
}
