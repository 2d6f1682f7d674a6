#!/usr/bin/env bash
# Runs the egress filtering benchmark (see docs/benchmarks.md): builds rampartd, rampart and
# the benchmark from this checkout and runs it as root. Arguments go to the benchmark:
#   bench/run-egress.sh                                  # full run, 10 to 10M prefixes, about an hour
#   bench/run-egress.sh --quick                          # smoke run, about two minutes
#   bench/run-egress.sh --counts 1k,1M --filters ipset,rampart
#   bench/run-egress.sh --budget 20m --mem-limit 16G     # let slow or large peers run
#   bench/run-egress.sh --ipv6                           # every filter over IPv6, 10 to 1M prefixes
# Results: bench/results/egress-<timestamp>.{json,md,png}
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "run-egress: needs root (network namespaces, BPF, iptables)" >&2
	exit 1
fi
for tool in go iperf3 nsenter taskset ping ipset nft iptables-legacy iptables-legacy-restore; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "run-egress: $tool not found (scripts/setup.sh installs what is needed)" >&2
		exit 1
	fi
done
# bpffs is not mounted on a fresh machine; the agent pins its maps there.
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

bin=$(mktemp -d /tmp/rp-bench-bin-XXXXXX)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/rampartd ./cmd/rampart
(cd bench && go build -o "$bin/" ./cmd/egressbench) # the bench module (bench/go.mod)
"$bin/egressbench" --bin-dir "$bin" "$@"
