#!/usr/bin/env bash
# Runs the cluster benchmark (see docs/benchmarks.md, "Cluster"): clusters of two real nodes
# (kube-apiserver, etcd, kube-scheduler, kube-controller-manager; per node containerd,
# kubelet and kube-proxy, Rampart as the CNI), one per tunnel mode and a second native one,
# live at once in the host's lab slots (--control-plane k8s: a pod runner in place of
# kubelet and containerd), pod scalability over each tunnel mode, the overlay's cost against
# native routing and the bare fabric, and policy scalability across nodes. Builds the agent,
# CLI, CNI plugin, pod runner and the benchmark from this checkout and runs it as root:
#   bench/run-cluster.sh                                  # full run, 30 to 45 minutes
#   bench/run-cluster.sh --quick                          # smoke run (CI)
#   bench/run-cluster.sh --experiments pods --modes vxlan --pairs 1,40
# Results: bench/results/cluster-<timestamp>.{json,md,png}
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
bench_require run-cluster "network namespaces, BPF" go iperf3 nsenter taskset ip
bench_build rp-cluster-bin clusterbench ./cmd/rampart-cni ./test/rampart-podrunner
# The control plane (--control-plane k8s, the default) and the real nodes' binaries
# (--control-plane nodes): built once per machine and cached (about twenty minutes the
# first time).
bash scripts/build-k8s.sh
bash scripts/build-cri.sh
bash scripts/build-node.sh
"$bin/clusterbench" --bin-dir "$bin" --k8s-bin-dir "$(bash scripts/build-k8s.sh --dir)" "$@"
