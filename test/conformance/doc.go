// Package conformance runs upstream Kubernetes' NetworkPolicy end-to-end specs (the
// `Netpol|NetworkPolicy` focus of the v1.37.2 e2e binary, scripts/build-e2e.sh) and
// cyclonus' generated NetworkPolicy cases (v0.5.6, scripts/build-cyclonus.sh) against a
// cluster of real nodes with Rampart as the CNI (internal/testenv/nodetest).
// TestConformanceSubset and TestCyclonusSubset run a handful of representative specs and
// cases by default; TestConformance runs every spec when RAMPART_CONFORMANCE=full and
// TestCyclonus every case when RAMPART_CYCLONUS=full (scripts/conformance.sh, --cyclonus).
// TestNetworkPolicyAPISubset and, when RAMPART_NPA=full, TestNetworkPolicyAPI run SIG
// Network's ClusterNetworkPolicy conformance tests (network-policy-api v0.3.0, package
// npa) on the same nodes.
// It needs root and the build scripts' binaries; it skips without them, and fails under
// CI=true.
package conformance
