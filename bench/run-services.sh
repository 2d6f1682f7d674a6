#!/usr/bin/env bash
# Runs the Service benchmark (see docs/benchmarks.md, "Services"): Rampart's socket-level
# eBPF Service translation (rampartd in Kubernetes mode) against kube-proxy in nftables mode
# and against direct-to-backend, from the same Services and EndpointSlices in a
# kube-apiserver, at 1 and 10,000 Services. Builds the agent, CLI and the benchmark from
# this checkout and runs it as root:
#   bench/run-services.sh                          # full run, about ten minutes
#   bench/run-services.sh --quick                  # smoke run (CI)
#   bench/run-services.sh --counts 1,1000 --rounds 3
# Results: bench/results/services-<timestamp>.{json,md,png}
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
bench_require run-services "network namespaces, cgroups, BPF" go nsenter taskset ip nft
bench_build rp-services-bin svcbench
# The API server and kube-proxy are upstream's, built once per machine and cached.
bash scripts/build-k8s.sh
bash scripts/build-node.sh
"$bin/svcbench" --bin-dir "$bin" --k8s-bin-dir "$(bash scripts/build-k8s.sh --dir)" \
	--kube-proxy "$(bash scripts/build-node.sh --dir)/kube-proxy" "$@"
