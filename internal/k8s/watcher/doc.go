// Package watcher is rampartd's Kubernetes mode (docs/cluster.md): client-go informers on
// Nodes, Namespaces, Pods, NetworkPolicies and the Cilium CRDs (CiliumNetworkPolicy,
// CiliumClusterwideNetworkPolicy, CiliumCIDRGroup) and the tap CRDs (TapContract, Antrea's
// TrafficControl), turned into the agent's whole desired view of the cluster
// (agent.ClusterView) after every burst of events. Policy objects and tap contracts go to
// the agent as JSON manifests, parsed by the same parser as `rampart apply`; pods with the
// annotation agent.MonitorAnnotation are monitors. The cluster's records of the last
// accepted version of each policy object (AcceptedPolicy) go to the agent with the view,
// and the watcher writes those the agent reports accepted (accepted.go). Pods'
// identities come from a cluster-wide allocator. The agent does not import client-go: it
// sees the watcher through agent.PodLookup and the view it is handed.
package watcher
