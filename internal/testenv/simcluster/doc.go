// Package simcluster starts and stops a simulated Kubernetes cluster on this machine for
// people (scripts/cluster.sh, the cluster demo): a control plane (internal/testenv/controlplane)
// with Rampart's CRDs, N nodes that are network namespaces joined by a bridged fabric in
// 198.19.254.0/24, and on each node a rampartd in Kubernetes mode and a rampart-podrunner,
// as detached processes whose logs and state are under the cluster's directory. What it
// started is recorded in <dir>/cluster.json, which Stop reads to remove all of it. The
// fabric (LinkFabric) is also the one of the tests' clusters (internal/testenv/clustertest).
// It is not part of the product.
package simcluster
