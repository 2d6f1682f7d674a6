#!/usr/bin/env bash
# Runs the policy overhead benchmark (see docs/benchmarks.md): builds rampartd, rampart and
# the benchmark from this checkout and runs it as root. Arguments go to the benchmark:
#   bench/run-policy-overhead.sh              # full run, about three minutes
#   bench/run-policy-overhead.sh --quick      # smoke run, under a minute
#   bench/run-policy-overhead.sh --repeats 9 --duration 5s
# Results: bench/results/policy-overhead-<timestamp>.{json,png}
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "run-policy-overhead: needs root (network namespaces, BPF)" >&2
	exit 1
fi
for tool in go iperf3 nsenter taskset; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "run-policy-overhead: $tool not found (scripts/setup.sh installs what is needed)" >&2
		exit 1
	fi
done
# bpffs is not mounted on a fresh machine; the agent pins its maps there.
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

bin=$(mktemp -d /tmp/rp-bench-bin-XXXXXX)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/rampartd ./cmd/rampart
(cd bench && go build -o "$bin/" ./cmd/policyoverhead) # the bench module (bench/go.mod)
# The hubble CLI reads the observed-l4 case's agent over Hubble's flow API (cached build).
bash scripts/build-hubble.sh
hubble="$(bash scripts/build-hubble.sh --dir)/hubble"
"$bin/policyoverhead" --bin-dir "$bin" --hubble "$hubble" "$@"
