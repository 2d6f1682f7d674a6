package labels

import "maps"

// ClusterName is the value of KeyCluster on every endpoint: Rampart runs one cluster.
const ClusterName = "default"

// ForPod is the full label set a pod's (an endpoint's) identity is made of
// (docs/architecture.md): its own labels, its namespace's name, its namespace's labels
// under KeyNamespaceLabelPrefix, the cluster and its service account. The agent (for its
// endpoints and for pods on other nodes) and the Kubernetes watcher (which allocates
// cluster-wide identities for these sets) both build it here, so they agree on it.
func ForPod(namespace string, podLabels, nsLabels Labels, serviceAccount string) Labels {
	l := make(Labels, len(podLabels)+len(nsLabels)+4)
	maps.Copy(l, podLabels)
	l[KeyNamespace] = namespace
	l[KeyNamespaceLabelPrefix+KeyNamespaceName] = namespace
	for k, v := range nsLabels {
		l[KeyNamespaceLabelPrefix+k] = v
	}
	l[KeyCluster] = ClusterName
	if serviceAccount != "" {
		l[KeyServiceAccount] = serviceAccount
	}
	return l
}
