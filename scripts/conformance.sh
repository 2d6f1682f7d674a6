#!/usr/bin/env bash
# Runs upstream Kubernetes' NetworkPolicy end-to-end specs (the `Netpol|NetworkPolicy`
# focus of the v1.37.2 e2e binary; the 3 SCTP specs skipped, this kernel has no SCTP)
# against a cluster of two real nodes with Rampart as the CNI: kubelet, containerd and
# kube-proxy per node, kube-scheduler and kube-controller-manager (test/conformance,
# TestConformance, on internal/testenv/nodetest). Builds what it needs first
# (scripts/build-k8s.sh, build-cri.sh, build-node.sh, build-e2e.sh; cached). Needs root.
# Takes 30 to 60 minutes on a 2-core machine. docs/conformance.md.
#
#   scripts/conformance.sh           the full run (48 specs)
#   scripts/conformance.sh --subset  the 6 specs CI runs on every change (a few minutes)
#   scripts/conformance.sh --cyclonus         cyclonus' generated cases instead (102 that
#                                             are not SCTP; TestCyclonus; about an hour)
#   scripts/conformance.sh --cyclonus-subset  the 4 cyclonus cases CI runs (TestCyclonusSubset)
#   scripts/conformance.sh --npa         SIG Network's network-policy-api v0.3.0
#                                        ClusterNetworkPolicy conformance tests instead
#                                        (TestNetworkPolicyAPI: 30 tests, 6 skipped, and
#                                        6 run again without their SCTP probes; about
#                                        25 minutes)
#   scripts/conformance.sh --npa-subset  the 3 of them CI runs (TestNetworkPolicyAPISubset)
#
# The JUnit report, ginkgo's log and a summary (spec, result, seconds; the run's time) go
# to $RAMPART_CONFORMANCE_REPORT_DIR (default /tmp/rampart-conformance). Specs run one at a
# time; RAMPART_CONFORMANCE_NODES=N runs N at once, RAMPART_CONFORMANCE_TIMEOUT (a Go
# duration, default 2h) bounds the run (the full run only). cyclonus' log, JUnit report and
# summary go there too (cyclonus.log, cyclonus-junit.xml, cyclonus-summary.txt);
# RAMPART_CYCLONUS_TIMEOUT (default 100m) bounds its full run, RAMPART_CYCLONUS_INCLUDE
# and RAMPART_CYCLONUS_EXCLUDE (cyclonus tags, comma-separated) narrow it,
# RAMPART_CYCLONUS_DESTINATION=pod-ip probes pod IPs instead of Service names. The
# network-policy-api tests' go test -json events, log and summary (test, subtest, result,
# seconds) go there as npa.json, npa.log and npa-summary.txt; RAMPART_NPA_TIMEOUT (default
# 1h) bounds the full run, RAMPART_NPA_RUN (a go test -run pattern for the tests, e.g.
# 'WithoutSCTP$') narrows it.
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

bash scripts/build-k8s.sh
bash scripts/build-cri.sh
bash scripts/build-node.sh
export RAMPART_CONFORMANCE_REPORT_DIR="${RAMPART_CONFORMANCE_REPORT_DIR:-/tmp/rampart-conformance}"
case "${1:-}" in
--cyclonus | --cyclonus-subset)
	# cyclonus probes its pods' Services by name: the cluster runs CoreDNS.
	bash scripts/build-coredns.sh
	bash scripts/build-cyclonus.sh
	if [ "$1" = "--cyclonus-subset" ]; then
		CI=true go test -count=1 -v -timeout 30m -run 'TestCyclonusSubset$' ./test/conformance/
	else
		CI=true RAMPART_CYCLONUS=full go test -count=1 -v -timeout 3h -run 'TestCyclonus$' ./test/conformance/
	fi
	;;
--npa | --npa-subset)
	if [ "$1" = "--npa-subset" ]; then
		CI=true go test -count=1 -v -timeout 30m -run 'TestNetworkPolicyAPISubset$' ./test/conformance/
	else
		CI=true RAMPART_NPA=full go test -count=1 -v -timeout 2h -run 'TestNetworkPolicyAPI$' ./test/conformance/
	fi
	;;
--subset)
	bash scripts/build-e2e.sh
	CI=true go test -count=1 -v -timeout 30m -run 'TestConformanceSubset$' ./test/conformance/
	;;
*)
	bash scripts/build-e2e.sh
	CI=true RAMPART_CONFORMANCE=full go test -count=1 -v -timeout 3h -run 'TestConformance$' ./test/conformance/
	;;
esac
