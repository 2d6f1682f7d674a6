// Package conformance runs upstream Kubernetes' NetworkPolicy end-to-end specs (the
// `Netpol|NetworkPolicy` focus of the v1.37.2 e2e binary, scripts/build-e2e.sh) against a
// cluster of real nodes with Rampart as the CNI (internal/testenv/nodetest).
// TestConformanceSubset runs a handful of representative specs by default;
// TestConformance runs all of them when RAMPART_CONFORMANCE=full (scripts/conformance.sh).
// It needs root, scripts/build-node.sh's and scripts/build-e2e.sh's binaries; it skips
// without them, and fails under CI=true.
package conformance
