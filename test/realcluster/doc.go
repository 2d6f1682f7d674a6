// Package realcluster tests a cluster of real nodes (internal/testenv/nodetest): kubelet
// and containerd on every node, kube-scheduler and kube-controller-manager, Rampart as the
// CNI. It needs root and scripts/build-node.sh's binaries; it skips without them, and fails
// under CI=true.
package realcluster
