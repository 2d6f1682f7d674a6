package k8smode

import (
	"testing"

	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// adminDenyAToB80 denies x/a into x/b on TCP 80 in the Admin tier, over the NetworkPolicy
// that allows it; baselineDenyCToA81 denies x/c into x/a on TCP 81 in the Baseline tier,
// which decides because no NetworkPolicy isolates x/a, and accepts x/c on TCP 80 into the
// namespace, which does not open x/b: its NetworkPolicy isolates it.
const (
	adminDenyAToB80 = `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: admin-a-b}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {pod: b}}}}
  ingress:
  - action: Deny
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {pod: a}}}}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]
`
	baselineDenyCToA81 = `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: baseline-c-a}
spec:
  tier: Baseline
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}
  ingress:
  - action: Deny
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {pod: c}}}}]
    protocols: [{tcp: {destinationPort: {number: 81}}}]
  - action: Accept
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {pod: c}}}}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]
`
)

// ClusterNetworkPolicy objects from the API server (the CRD from network-policy-api
// v0.3.0, installed with Rampart's) are enforced on every node, across nodes: an Admin
// Deny over a NetworkPolicy allow, a Baseline Deny for a pod no NetworkPolicy isolates and
// not for one it does; deleting them brings the NetworkPolicy alone back.
func TestClusterNetworkPolicyAcrossNodes(t *testing.T) {
	c := startCluster(t, clustertest.Options{Nodes: 2})
	a, cc, b := threePods(t, c)
	c.KubectlApply(allowAToB80)
	waitFor(t, "NetworkPolicy applied", probe{cc, b, 80, "tcp", false})

	c.KubectlApply(adminDenyAToB80)
	c.KubectlApply(baselineDenyCToA81)
	waitFor(t, "Admin tier applied", probe{a, b, 80, "tcp", false})
	waitFor(t, "Baseline tier applied", probe{cc, a, 81, "tcp", false})
	check(t, "ClusterNetworkPolicies", []probe{
		{a, b, 80, "tcp", false}, // Admin Deny over the NetworkPolicy allow
		{a, b, 80, "udp", true},  // the Deny is for TCP only
		{cc, a, 81, "tcp", false},
		{cc, a, 80, "tcp", true},
		{cc, b, 80, "tcp", false}, // b is isolated by its NetworkPolicy: the Baseline Accept does not apply
		{b, a, 81, "tcp", true},
	})

	c.KubectlDelete(adminDenyAToB80)
	c.KubectlDelete(baselineDenyCToA81)
	waitFor(t, "ClusterNetworkPolicies deleted", probe{a, b, 80, "tcp", true})
	check(t, "NetworkPolicy alone", []probe{{cc, a, 81, "tcp", true}, {cc, b, 80, "tcp", false}})
}
