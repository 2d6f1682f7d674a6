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

if [ "$(id -u)" != 0 ]; then
	echo "run-services: needs root (network namespaces, cgroups, BPF)" >&2
	exit 1
fi
for tool in go nsenter taskset ip nft; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "run-services: $tool not found (scripts/setup.sh installs what is needed)" >&2
		exit 1
	fi
done
# bpffs is not mounted on a fresh machine; the agent pins its maps there.
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

bin=$(mktemp -d /tmp/rp-services-bin-XXXXXX)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/rampartd ./cmd/rampart
(cd bench && go build -o "$bin/" ./cmd/svcbench) # the bench module (bench/go.mod)
# The API server and kube-proxy are upstream's, built once per machine and cached.
bash scripts/build-k8s.sh
bash scripts/build-node.sh
"$bin/svcbench" --bin-dir "$bin" --k8s-bin-dir "$(bash scripts/build-k8s.sh --dir)" \
	--kube-proxy "$(bash scripts/build-node.sh --dir)/kube-proxy" "$@"
