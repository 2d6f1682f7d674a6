package k8smode

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// NetworkPolicies that name ports, as the corpus's `port: serve-80-tcp`: x/s admits x/a on
// its named ports, x/a sends to x/s only on x/s's named ports.
const (
	namedIngress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: s-in, namespace: x}
spec:
  podSelector: {matchLabels: {pod: s}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: a}}}]
    ports: [{port: serve-80-tcp}, {port: serve-81-tcp}, {port: serve-80-udp, protocol: UDP}]
`
	namedEgress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-out, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {pod: s}}}]
    ports: [{port: serve-81-tcp}, {port: serve-80-udp, protocol: UDP}]
`
)

// serverPorts names x/s's ports: TCP in its container, UDP in a sidecar (an init
// container with restartPolicy Always), as Kubernetes resolves names.
func serverPorts(tcp80, tcp81 int32) clustertest.PodOptions {
	always := corev1.ContainerRestartPolicyAlways
	return clustertest.PodOptions{
		Labels: map[string]string{"pod": "s"},
		Ports:  []corev1.ContainerPort{{Name: "serve-80-tcp", ContainerPort: tcp80}, {Name: "serve-81-tcp", ContainerPort: tcp81}},
		InitContainers: []corev1.Container{{Name: "sidecar", RestartPolicy: &always,
			Ports: []corev1.ContainerPort{{Name: "serve-80-udp", ContainerPort: 80, Protocol: corev1.ProtocolUDP}}}},
	}
}

// Named ports resolve on every node from the pods' container ports: ingress on the
// server's node from its own ports, egress on the client's node from the ports of a pod
// on the other node; they follow a pod replaced with other ports and a policy update,
// and a trace on the destination's node shows the source node's egress verdict.
func TestNamedPortsAcrossNodes(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2, Tunnel: overlay.VXLAN})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	a := c.AddPod(n1, "x", "a", map[string]string{"pod": "a"})
	o := c.AddPod(n1, "x", "o", map[string]string{"pod": "o"})
	s := c.AddPodWith(n2, "x", "s", serverPorts(80, 81))
	waitRemote(t, c, a, o, s)

	c.KubectlApply(namedIngress)
	waitFor(t, "ingress by named ports", probe{o, s, 80, "tcp", false})
	check(t, "ingress by named ports", []probe{
		{a, s, 80, "tcp", true}, {a, s, 81, "tcp", true}, {a, s, 80, "udp", true},
		{a, s, 81, "udp", false}, {o, s, 81, "tcp", false},
	})

	c.KubectlApply(namedEgress)
	waitFor(t, "egress by named ports", probe{a, s, 80, "tcp", false})
	check(t, "egress by the remote pod's named ports", []probe{
		{a, s, 81, "tcp", true}, {a, s, 80, "udp", true}, {a, s, 80, "tcp", false},
	})
	// On the destination's node the trace judges the source's side as its node does.
	out := n2.CLI("policy", "trace", "--from", "x/a", "--to", "x/s", "--port", "80/TCP")
	if !strings.Contains(out, ": DENIED") || !strings.Contains(out, "at x/a (node "+n1.Name+"): denied") {
		t.Errorf("trace on %s of x/a -> x/s 80/TCP:\n%s\nwant DENIED by x/a's egress on %s", n2.Name, out, n1.Name)
	}

	// The server replaced by one whose names swap the numbers.
	c.Delete(s)
	s2 := c.AddPodWith(n2, "x", "s2", serverPorts(81, 80))
	waitRemote(t, c, s2)
	waitFor(t, "server replaced", probe{a, s2, 80, "tcp", true})
	check(t, "server replaced", []probe{{a, s2, 81, "tcp", false}, {a, s2, 80, "udp", true}, {o, s2, 80, "tcp", false}})

	// A policy update: egress now names serve-80-tcp (81 on s2).
	c.KubectlApply(strings.Replace(namedEgress, "port: serve-81-tcp", "port: serve-80-tcp", 1))
	waitFor(t, "egress policy updated", probe{a, s2, 81, "tcp", true})
	check(t, "egress policy updated", []probe{{a, s2, 80, "tcp", false}, {a, s2, 80, "udp", true}})
}
