#!/usr/bin/env bash
# Runs the L7 benchmark (see docs/benchmarks.md): builds rampartd, rampart and the benchmark
# from this checkout and runs it as root. Arguments go to the benchmark:
#   bench/run-l7.sh                         # full run, about five minutes
#   bench/run-l7.sh --quick                 # smoke run, under a minute
#   bench/run-l7.sh --repeats 5 --rate 2000
#   bench/run-l7.sh --cases l4,l7           # some configurations only
# Results: bench/results/l7-<timestamp>.{json,md,png}
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
bench_require run-l7 "network namespaces, BPF" go nsenter taskset
bench_build rp-bench-bin l7bench

bench_fortio run-l7
"$bin/l7bench" --bin-dir "$bin" --fortio "$fortio" "$@"
