// Package cluster tests the Kubernetes control plane the project builds and starts itself
// (scripts/build-k8s.sh, internal/testenv/k8stest): a real etcd and kube-apiserver, the real
// kubectl, and Rampart's Cilium CRDs (deploy/crds, installed by internal/k8s/crds).
package cluster
