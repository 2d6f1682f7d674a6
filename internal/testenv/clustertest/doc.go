// Package clustertest starts a Kubernetes cluster for a test: a real control plane
// (k8stest, with Rampart's CRDs), N nodes (network namespaces on a bridged fabric, each
// with its Node object: name, InternalIP in 198.19.254.0/24, pod CIDR in 198.18.0.0/16)
// and one rampartd per node in Kubernetes mode, run as a process. AddPod creates a Pod
// bound to a node and plays the runtime's network part (namespace, CNI ADD through libcni
// and rampart-cni to the node's agent, status.podIP). Everything is removed when the test
// ends.
package clustertest
