#!/usr/bin/env bash
# Runs the flow tap benchmark (see docs/benchmarks.md): builds rampartd, rampart and the
# benchmark from this checkout and runs it as root. Arguments go to the benchmark:
#   bench/run-taps.sh              # full run, about eight minutes
#   bench/run-taps.sh --quick      # smoke run, about a minute and a half
#   bench/run-taps.sh --repeats 9 --duration 3s
# Results: bench/results/taps-<timestamp>.{json,md,png}
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
bench_tools_hint="scripts/setup.sh and scripts/install-suricata.sh install what is needed"
bench_require run-taps "network namespaces, BPF" go iperf3 nsenter taskset suricata
bench_build rp-bench-bin tapbench

bench_fortio run-taps
"$bin/tapbench" --bin-dir "$bin" --fortio "$fortio" "$@"
