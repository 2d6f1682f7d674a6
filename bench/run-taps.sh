#!/usr/bin/env bash
# Runs the flow tap benchmark (see docs/benchmarks.md): builds rampartd, rampart and the
# benchmark from this checkout and runs it as root. Arguments go to the benchmark:
#   bench/run-taps.sh              # full run, about eight minutes
#   bench/run-taps.sh --quick      # smoke run, about a minute and a half
#   bench/run-taps.sh --repeats 9 --duration 3s
# Results: bench/results/taps-<timestamp>.{json,md,png}
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "run-taps: needs root (network namespaces, BPF)" >&2
	exit 1
fi
for tool in go iperf3 nsenter taskset suricata; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "run-taps: $tool not found (scripts/setup.sh and scripts/install-suricata.sh install what is needed)" >&2
		exit 1
	fi
done
# bpffs is not mounted on a fresh machine; the agent pins its maps there.
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

bin=$(mktemp -d /tmp/rp-bench-bin-XXXXXX)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/rampartd ./cmd/rampart
(cd bench && go build -o "$bin/" ./cmd/tapbench) # the bench module (bench/go.mod)

# fortio: on PATH, or where scripts/setup.sh installs it; else built here for this run.
fortio=$(command -v fortio || true)
gobin="$(go env GOPATH | cut -d: -f1)/bin"
[ -n "$fortio" ] || { [ -x "$gobin/fortio" ] && fortio="$gobin/fortio"; } || true
if [ -z "$fortio" ]; then
	echo "run-taps: fortio not installed; building fortio 1.68.2 for this run"
	(cd / && GOBIN="$bin" GOFLAGS=-mod=mod go install fortio.org/fortio@v1.68.2)
	fortio="$bin/fortio"
fi
"$bin/tapbench" --bin-dir "$bin" --fortio "$fortio" "$@"
