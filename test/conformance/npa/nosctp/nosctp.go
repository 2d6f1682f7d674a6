// Package nosctp is six of network-policy-api v0.3.0's conformance tests with their SCTP
// probes taken out: the inline CIDR, gress and port-range tests of both tiers, which are
// not about SCTP but probe it between their TCP and UDP probes. On a kernel without SCTP
// such a probe fails whatever the policy and ends its subtest, so the TCP and UDP probes
// after it never run; these copies run them. They are a supplement to upstream's tests,
// which test/conformance/npa runs unchanged, not a substitute.
//
// The copies are not in the repository: test/conformance's TestNetworkPolicyAPI writes them
// (npa.NoSCTP of the module's conformance/tests: the package clause changed, each
// `kubernetes.PokeServer(..., "sctp", ...)` statement dropped, nothing else) to a
// temporary directory and adds them to this package with go test -overlay. Without them
// ConformanceTests is empty.
package nosctp

import "sigs.k8s.io/network-policy-api/conformance/utils/suite"

// ConformanceTests is the six tests, in the order of their files.
var ConformanceTests []suite.ConformanceTest
