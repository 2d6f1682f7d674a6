#!/usr/bin/env bash
# Runs the DNS-aware egress benchmark (see docs/benchmarks.md, "DNS-aware egress"): DNS
# query latency and rate through the agent's DNS proxy against direct, and the time from a
# new name's answer to its address being open (toFQDNs) against toCIDR. Builds rampartd,
# rampart and the benchmark from this checkout and runs it as root:
#   bench/run-dns.sh                 # full run, about five minutes
#   bench/run-dns.sh --quick         # smoke run (CI), under a minute
#   bench/run-dns.sh --rounds 11 --many 5000
# Results: bench/results/dns-<timestamp>.{json,md,png}
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "run-dns: needs root (network namespaces, BPF)" >&2
	exit 1
fi
for tool in go nsenter taskset; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "run-dns: $tool not found (scripts/setup.sh installs what is needed)" >&2
		exit 1
	fi
done
# bpffs is not mounted on a fresh machine; the agent pins its maps there.
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

bin=$(mktemp -d /tmp/rp-dns-bin-XXXXXX)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/rampartd ./cmd/rampart
(cd bench && go build -o "$bin/" ./cmd/dnsbench) # the bench module (bench/go.mod)
"$bin/dnsbench" --bin-dir "$bin" "$@"
