package watcher

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/policy"
)

// A NetworkPolicy as the informer holds it (no TypeMeta, the server's metadata, defaults
// filled in) becomes a manifest the parser takes, with the same rules as the manifest
// written by hand.
func TestNetworkPolicyDocument(t *testing.T) {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(80)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "b-from-a", Namespace: "x", ResourceVersion: "42", UID: "u",
			Generation: 1, Labels: map[string]string{"team": "t"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}, Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	key, o, err := networkPolicyObject(np)
	if err != nil {
		t.Fatal(err)
	}
	if key != "NetworkPolicy/x/b-from-a" || o.ResourceVersion != "42" || o.UID != "u" {
		t.Errorf("key %q, resourceVersion %q, uid %q", key, o.ResourceVersion, o.UID)
	}
	got := parseObject(t, o.Object)
	want := parse(t, []byte(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-a, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: a}}}]
    ports: [{port: 80, protocol: TCP}]
`))
	if got != want {
		t.Errorf("rules from the object:\n%s\nwant:\n%s", got, want)
	}
}

// The audit annotation reaches the parser, whatever the kind (a policy in audit mode
// through Kubernetes is audited, not enforced), and a bad value is refused as in a file.
func TestAuditAnnotationDocument(t *testing.T) {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "audited", Namespace: "x",
			Annotations: map[string]string{agent.AuditAnnotation: "true", "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}
	_, o, err := networkPolicyObject(np)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := policy.ParseObject("test", o.Object)
	if err != nil || len(docs.Policies) != 1 || !docs.Policies[0].Audit {
		t.Fatalf("audited NetworkPolicy: %v, %+v from %v", err, docs.Policies, o.Object)
	}
	np.Annotations[agent.AuditAnnotation] = "yes"
	if _, o, err = networkPolicyObject(np); err != nil {
		t.Fatal(err)
	}
	if _, err := policy.ParseObject("test", o.Object); err == nil || !strings.Contains(err.Error(), agent.AuditAnnotation) {
		t.Errorf("audit annotation %q: %v", "yes", err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
		"metadata": map[string]any{"name": "c", "namespace": "x", "annotations": map[string]any{agent.AuditAnnotation: "true"}},
		"spec":     map[string]any{"endpointSelector": map[string]any{}, "ingress": []any{map[string]any{}}},
	}}
	doc := document("cilium.io/v2", "CiliumNetworkPolicy", u, u.Object)
	if docs, err := policy.ParseObject("test", doc); err != nil || len(docs.Policies) != 1 || !docs.Policies[0].Audit {
		t.Errorf("audited CiliumNetworkPolicy: %v from %v", err, doc)
	}
}

// A CRD object keeps its own apiVersion and every top-level field but status; the
// server's metadata is dropped.
func TestCustomObjectDocument(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cilium.io/v2",
		"kind":       "CiliumNetworkPolicy",
		"metadata": map[string]any{"name": "p", "namespace": "x", "resourceVersion": "7", "uid": "u",
			"managedFields": []any{map[string]any{"manager": "kubectl"}}, "finalizers": []any{"f"}},
		"spec": map[string]any{
			"endpointSelector": map[string]any{"matchLabels": map[string]any{"pod": "b"}},
			"ingress":          []any{map[string]any{"fromEndpoints": []any{map[string]any{"matchLabels": map[string]any{"pod": "c"}}}}},
		},
		"status": map[string]any{"nodes": map[string]any{}},
	}}
	key, o := customObject("CiliumNetworkPolicy", u)
	if key != "CiliumNetworkPolicy/x/p" || o.ResourceVersion != "7" || o.UID != "u" {
		t.Errorf("key %q, resourceVersion %q, uid %q", key, o.ResourceVersion, o.UID)
	}
	doc := o.Object
	if _, ok := doc["status"]; ok {
		t.Error("status kept in the document")
	}
	if md := doc["metadata"].(map[string]any); len(md) != 2 {
		t.Errorf("metadata %v, want only name and namespace", md)
	}
	parseObject(t, o.Object)
	if _, ok := u.Object["status"]; !ok {
		t.Error("the informer's object was changed")
	}
}

func parseObject(t *testing.T, obj map[string]any) string {
	t.Helper()
	docs, err := policy.ParseObject("test", obj)
	if err != nil {
		t.Fatalf("parsing %v: %v", obj, err)
	}
	return rulesOf(t, docs)
}

func parse(t *testing.T, data []byte) string {
	t.Helper()
	docs, err := policy.Parse("test", data)
	if err != nil {
		t.Fatalf("parsing %s: %v", data, err)
	}
	return rulesOf(t, docs)
}

func rulesOf(t *testing.T, docs *policy.Documents) string {
	t.Helper()
	if len(docs.Policies) != 1 {
		t.Fatalf("%d policies", len(docs.Policies))
	}
	var s string
	for _, r := range docs.Policies[0].Rules {
		s += policy.FormatRule(r)
	}
	return s
}

// A TapContract object (cluster-scoped) becomes a manifest the parser takes as the
// contract written; one whose apiVersion the object lacks gets the CRD's. Refusal Events
// name the kind at the version the watcher serves it.
func TestTapContractDocument(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"kind":     "TapContract",
		"metadata": map[string]any{"name": "web-http", "resourceVersion": "9", "uid": "u"},
		"spec": map[string]any{
			"source":  map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "web"}}},
			"monitor": "sec/ids",
			"match":   map[string]any{"protocol": "TCP", "ports": []any{int64(80), "8000-8080"}},
			"action":  "Mirror",
		},
	}}
	key, o := customObject("TapContract", u)
	if key != "TapContract//web-http" || o.ResourceVersion != "9" {
		t.Errorf("key %q, resourceVersion %q", key, o.ResourceVersion)
	}
	docs, err := policy.ParseObject("test", o.Object)
	if err != nil {
		t.Fatalf("parsing %v: %v", o.Object, err)
	}
	if len(docs.Taps) != 1 {
		t.Fatalf("%d tap contracts in %v", len(docs.Taps), o.Object)
	}
	c := docs.Taps[0]
	if c.Name != "web-http" || c.Monitor != "sec/ids" || c.Match.String() != "both TCP ports 80,8000-8080" {
		t.Errorf("contract %s monitor %s match %s", c.Name, c.Monitor, c.Match)
	}
	for kind, want := range map[string]string{"TapContract": "rampart.io/v1alpha1", "TrafficControl": "crd.antrea.io/v1alpha2",
		"NetworkPolicy": "networking.k8s.io/v1", "CiliumNetworkPolicy": "cilium.io/v2"} {
		if got := apiVersionOf(kind); got != want {
			t.Errorf("apiVersionOf(%s) = %s, want %s", kind, got, want)
		}
	}
}

// A pod is a monitor, or in audit mode, only with its annotation's value "true".
func TestPodAnnotations(t *testing.T) {
	for annotation, is := range map[string]func(*corev1.Pod) bool{agent.MonitorAnnotation: isMonitor, agent.AuditAnnotation: inAudit} {
		for v, want := range map[string]bool{"true": true, "false": false, "": false, "yes": false} {
			p := &corev1.Pod{}
			if v != "" {
				p.Annotations = map[string]string{annotation: v}
			}
			if got := is(p); got != want {
				t.Errorf("annotation %s=%q: %v, want %v", annotation, v, got, want)
			}
		}
	}
}

// A pod's named ports are its containers' named ports, then its sidecars' (init
// containers with restartPolicy Always, not the others), the first of a name winning, the
// protocol TCP unless given.
func TestPodPorts(t *testing.T) {
	always, onFailure := corev1.ContainerRestartPolicyAlways, corev1.ContainerRestartPolicy("OnFailure")
	p := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{
			{Name: "setup", RestartPolicy: &onFailure, Ports: []corev1.ContainerPort{{Name: "init-port", ContainerPort: 9000}}},
			{Name: "proxy", RestartPolicy: &always, Ports: []corev1.ContainerPort{
				{Name: "proxy-admin", ContainerPort: 15000}, {Name: "serve-80-tcp", ContainerPort: 8080}}},
		},
		Containers: []corev1.Container{
			{Name: "main", Ports: []corev1.ContainerPort{
				{Name: "serve-80-tcp", ContainerPort: 80},
				{Name: "serve-80-udp", ContainerPort: 80, Protocol: corev1.ProtocolUDP},
				{ContainerPort: 81}, // no name: never named
			}},
			{Name: "side", Ports: []corev1.ContainerPort{
				{Name: "serve-80-tcp", ContainerPort: 8081}, // taken by main
				{Name: "sctp", ContainerPort: 9, Protocol: corev1.ProtocolSCTP},
				{Name: "bad", ContainerPort: 70000},
			}},
		},
	}}
	want := []agent.PortRecord{
		{Name: "serve-80-tcp", Port: 80, Protocol: "TCP"},
		{Name: "serve-80-udp", Port: 80, Protocol: "UDP"},
		{Name: "sctp", Port: 9, Protocol: "SCTP"},
		{Name: "bad", Port: 0, Protocol: "TCP"},
		{Name: "proxy-admin", Port: 15000, Protocol: "TCP"},
	}
	if got := podPorts(p); !reflect.DeepEqual(got, want) {
		t.Errorf("podPorts = %+v\nwant %+v", got, want)
	}
	if got := podPorts(&corev1.Pod{}); got != nil {
		t.Errorf("a pod without ports: %+v", got)
	}
}

// This node's pod ranges: spec.podCIDR alone, or spec.podCIDRs with an IPv6 range in
// either place; an IPv6-only node is refused.
func TestOwnNodePodCIDRs(t *testing.T) {
	node := func(podCIDR string, podCIDRs ...string) *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n1"},
			Spec:       corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: podCIDRs},
			Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.19.254.1"}}},
		}
	}
	for _, c := range []struct {
		n      *corev1.Node
		v4, v6 string
	}{
		{node("198.18.1.0/24"), "198.18.1.0/24", "invalid Prefix"},
		{node("198.18.1.0/24", "198.18.1.0/24"), "198.18.1.0/24", "invalid Prefix"},
		{node("198.18.1.0/24", "198.18.1.0/24", "2001:2:0:1::/64"), "198.18.1.0/24", "2001:2:0:1::/64"},
		{node("2001:2:0:1::/64", "2001:2:0:1::/64", "198.18.1.0/24"), "198.18.1.0/24", "2001:2:0:1::/64"},
	} {
		own, err := ownNode(c.n)
		if err != nil || own.PodCIDR.String() != c.v4 || own.PodCIDR6.String() != c.v6 || own.Address != netip.MustParseAddr("198.19.254.1") {
			t.Errorf("ownNode(%q, %q) = %+v, %v; want %s, %s", c.n.Spec.PodCIDR, c.n.Spec.PodCIDRs, own, err, c.v4, c.v6)
		}
	}
	if _, err := ownNode(node("2001:2:0:1::/64", "2001:2:0:1::/64")); err == nil || !strings.Contains(err.Error(), "no IPv4 prefix") {
		t.Errorf("an IPv6-only node: %v", err)
	}
}

// Another Node's fabric addresses: the first IPv4 InternalIP, and the first IPv6 one
// (native routing's gateway to its IPv6 pod CIDR), whatever their order; other address
// types and IPv4-mapped IPv6 addresses are not taken.
func TestInternalIPs(t *testing.T) {
	node := func(addrs ...corev1.NodeAddress) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Addresses: addrs}}
	}
	internal := func(a string) corev1.NodeAddress { return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a} }
	for _, c := range []struct {
		n      *corev1.Node
		v4, v6 string
	}{
		{node(internal("198.19.254.2")), "198.19.254.2", "invalid IP"},
		{node(internal("2001:2:0:fab::b"), internal("198.19.254.2"), internal("2001:2:0:fab::c")), "198.19.254.2", "2001:2:0:fab::b"},
		{node(corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "2001:2:0:fab::b"}, internal("198.19.254.2")), "198.19.254.2", "invalid IP"},
		{node(internal("::ffff:198.19.254.3"), internal("198.19.254.2")), "198.19.254.2", "invalid IP"},
	} {
		v4, ok := internalIP(c.n)
		if v6 := internalIP6(c.n); !ok || v4.String() != c.v4 || v6.String() != c.v6 {
			t.Errorf("internal IPs of %+v: %v %v, %v; want %s, %s", c.n.Status.Addresses, v4, ok, v6, c.v4, c.v6)
		}
	}
}
