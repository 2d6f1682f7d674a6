// Package cluster measures Rampart between two nodes, as the digital-marketplace paper
// (seeds/001) measured Cilium and Calico on a two-worker Kubernetes cluster:
//
//   - pods: pod scalability (the paper's Fig. 5-6), 1 to 40 client/server pod pairs, the
//     clients on node A and the servers on node B, all pairs at once; aggregate TCP and
//     UDP throughput (iperf3), UDP with datagrams that do and do not fragment, for each
//     tunnel mode, with an allow policy for the pairs and without policy;
//   - overlay: one pair's TCP throughput and request/response rate over VXLAN and
//     IP-in-IP against native routing (measured twice: the A/A control) and against the
//     bare fabric (two namespaces on the fabric veth, no agent, no pods);
//   - policies: policy scalability across nodes (the paper's Fig. 4), 1 to 10,000
//     policies selecting the server on the receiving node, differing by port, the one
//     that admits the traffic last, against no policy.
//
// By default a cluster is two real nodes (NewNodesCluster: internal/testenv/nodetest, with
// kubelet, containerd and kube-proxy per node, pods made by the kubelet), every cluster the
// run needs live at once in a lab slot of the host of its own. NewK8sCluster puts a pod
// runner in place of kubelet and containerd; NewAgentCluster has no control plane: a node
// is a network namespace with its own rampartd, joined to the other by a fabric veth, pods
// are the agents' endpoints, and each node is told of the other and its pods through the
// agent API (`rampart node add`, `rampart remote add --identity`), as
// test/e2e/overlay_test.go does. The benchmark reaches the nodes and pods only through the
// Cluster interface.
// NewAgentNodes makes the same agent cluster with more nodes, and monitor pods: the flow
// tap benchmark's (bench/taps).
// bench/run-cluster.sh runs it; docs/benchmarks.md describes the method.
package cluster
