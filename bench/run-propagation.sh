#!/usr/bin/env bash
# Runs the policy propagation benchmark (see docs/benchmarks.md, "Policy propagation"): a real
# control plane and 4 simulated nodes (VXLAN), 1,000 pods with distinct label sets and 1,000
# sharing four (identity allocation), then 20 writes of one NetworkPolicy through the API,
# each timed until every selected endpoint's node enforces it.
# It is the bench module's TestPropagation in full mode, run as root:
#   bench/run-propagation.sh                         # full run, about ten minutes
#   RAMPART_PROP_PODS=200 RAMPART_PROP_SHARED=0 bench/run-propagation.sh
# Results: bench/results/propagation-<timestamp>.{json,md,png}
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
bench_require run-propagation "network namespaces, BPF" go ip
if ! bin=$(bash scripts/build-k8s.sh --dir) || [ ! -x "$bin/kube-apiserver" ]; then
	echo "run-propagation: no control plane binaries (run bash scripts/build-k8s.sh)" >&2
	exit 1
fi
# 2,000 pods: a network namespace and four listening sockets each, and the agents' maps.
ulimit -n 1048576 2>/dev/null || ulimit -n 65536 2>/dev/null || true

mkdir -p bench/results
cd bench
RAMPART_BENCH_FULL=1 RAMPART_BENCH_OUT="$PWD/results" \
	go test ./propagation/ -run '^TestPropagation$' -count=1 -v -timeout 60m "$@"
