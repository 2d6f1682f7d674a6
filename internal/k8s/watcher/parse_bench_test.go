package watcher

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/policy"
)

// benchNetworkPolicy is the NetworkPolicy of n ingress rules of the apply benchmark
// (policy.benchPolicy, docs/benchmarks.md) as the informer holds it.
func benchNetworkPolicy(n int) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-apply", Namespace: "bench", ResourceVersion: "1", UID: "u"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "bench-server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	for i := range n {
		var r networkingv1.NetworkPolicyIngressRule
		port := 10000 + 4*i
		ports := []int{port, port + 2}
		if i%3 == 2 {
			ports = ports[:1]
			r.From = []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("198.19.%d.%d/32", 128+i/256%128, i%256)}}}
		} else {
			r.From = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("bench-client-%d", i%2)}}}}
		}
		for _, p := range ports {
			p := intstr.FromInt32(int32(p))
			r.Ports = append(r.Ports, networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &p})
		}
		np.Spec.Ingress = append(np.Spec.Ingress, r)
	}
	return np
}

// benchCiliumPolicy is a CiliumNetworkPolicy of n ingress rules as the dynamic informer
// holds it.
func benchCiliumPolicy(n int) *unstructured.Unstructured {
	var ingress []any
	for i := range n {
		var from []any
		if i%3 == 2 {
			from = []any{fmt.Sprintf("198.19.%d.%d/32", 128+i/256%128, i%256)}
			ingress = append(ingress, map[string]any{"fromCIDR": from, "toPorts": []any{map[string]any{
				"ports": []any{map[string]any{"port": fmt.Sprint(10000 + 4*i), "protocol": "TCP"}}}}})
			continue
		}
		ingress = append(ingress, map[string]any{
			"fromEndpoints": []any{map[string]any{"matchLabels": map[string]any{"app": fmt.Sprintf("bench-client-%d", i%2)}}},
			"toPorts": []any{map[string]any{"ports": []any{
				map[string]any{"port": fmt.Sprint(10000 + 4*i), "protocol": "TCP"},
				map[string]any{"port": fmt.Sprint(10002 + 4*i), "protocol": "TCP"}}}}})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
		"metadata": map[string]any{"name": "bench-apply", "namespace": "bench", "resourceVersion": "1", "uid": "u"},
		"spec": map[string]any{
			"endpointSelector": map[string]any{"matchLabels": map[string]any{"app": "bench-server"}},
			"ingress":          ingress,
		},
	}}
}

// BenchmarkObjectToPolicy10kRules is the watcher's half of a sync of a 10,000-rule
// policy object: from the informer's object to the agent's parsed policy (what the agent
// puts in the model). cpu-ms/op is the process's CPU time per op.
func BenchmarkObjectToPolicy10kRules(b *testing.B) {
	np := benchNetworkPolicy(10000)
	cnp := benchCiliumPolicy(10000)
	for _, c := range []struct {
		name   string
		object func() (agent.PolicyObject, error)
	}{
		{"NetworkPolicy", func() (agent.PolicyObject, error) { _, o, err := networkPolicyObject(np); return o, err }},
		{"CiliumNetworkPolicy", func() (agent.PolicyObject, error) {
			_, o := customObject("CiliumNetworkPolicy", cnp)
			return o, nil
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			start := cpuTime()
			for b.Loop() {
				o, err := c.object()
				if err != nil {
					b.Fatal(err)
				}
				docs, err := policy.ParseObject("bench", o.Object)
				if err != nil || len(docs.Policies) != 1 || len(docs.Policies[0].Rules) < 10000 {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime()-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
		})
	}
}

// cpuTime is the CPU time of the process so far, every thread's (the parser's goroutines
// and the collector's included): on a shared machine wall time says more of the load.
func cpuTime() time.Duration {
	var r syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r); err != nil {
		return 0
	}
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}
