// Package identities allocates security identities cluster-wide through the Kubernetes API,
// so that every node gives a label set the same number and the number carried in the
// overlay's VNI means the same labels on every node.
//
// Two cluster-scoped kinds (rampart.io/v1alpha1, installed by internal/k8s/crds) hold the
// state. A SecurityIdentity is named from its label set (SetName) and holds the set and its
// number; a SecurityIdentityClaim is named by the number and names the SecurityIdentity
// that holds it, by name and UID. An identity is valid only when both exist and agree: the
// API server creates a name once, so one label set has one SecurityIdentity and one number
// has one claim, and two label sets can never both hold a number, however agents race.
//
// Allocator serves one agent: an informer keeps both kinds in memory (Lookup, LabelsOf,
// List make no API call) and Allocate gets or creates. RunCollector, run by one agent at a
// time under a Lease, deletes identities no pod has used for a grace period. The protocol
// and why it is race-safe are in docs/cluster.md, "Cluster-wide identities".
//
// The package uses client-go; the pure core (internal/identity, internal/labels) must not
// import it.
package identities
