// Package podrunner plays the network part of a kubelet for one node: it registers the
// Node object (address, pod CIDR, a Ready condition kept fresh by a heartbeat), watches
// the Pods bound to the node, and for each makes a sandbox network namespace, attaches it
// through the CNI plugins of a configuration directory (libcni, as a container runtime
// calls them), runs the pod's first container's command as a host process inside that
// namespace, and reports the pod's status (phase, addresses, conditions, container
// state) to the API server. It deletes pods the API server marks for graceful deletion
// once their process has stopped and their network is gone, and cleans up sandboxes of
// pods that vanished, also across its own restarts (state in the state directory).
//
// It is not a kubelet: there are no images, volumes, init containers, probes other than
// tcpSocket readiness, or scheduler. Tests, the cluster demo and the benchmarks use it to
// put pods on simulated nodes.
package podrunner
