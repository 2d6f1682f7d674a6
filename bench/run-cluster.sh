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

if [ "$(id -u)" != 0 ]; then
	echo "run-cluster: needs root (network namespaces, BPF)" >&2
	exit 1
fi
for tool in go iperf3 nsenter taskset ip; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "run-cluster: $tool not found (scripts/setup.sh installs what is needed)" >&2
		exit 1
	fi
done
# bpffs is not mounted on a fresh machine; the agents pin their maps there.
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

bin=$(mktemp -d /tmp/rp-cluster-bin-XXXXXX)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/rampartd ./cmd/rampart ./cmd/rampart-cni ./test/rampart-podrunner
(cd bench && go build -o "$bin/" ./cmd/clusterbench) # the bench module (bench/go.mod)
# The control plane (--control-plane k8s, the default) and the real nodes' binaries
# (--control-plane nodes): built once per machine and cached (about twenty minutes the
# first time).
bash scripts/build-k8s.sh
bash scripts/build-cri.sh
bash scripts/build-node.sh
"$bin/clusterbench" --bin-dir "$bin" --k8s-bin-dir "$(bash scripts/build-k8s.sh --dir)" "$@"
