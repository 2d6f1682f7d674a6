#!/usr/bin/env bash
# Runs the policy overhead benchmark (see docs/benchmarks.md): builds rampartd, rampart and
# the benchmark from this checkout and runs it as root. Arguments go to the benchmark:
#   bench/run-policy-overhead.sh              # full run, about three minutes
#   bench/run-policy-overhead.sh --quick      # smoke run, under a minute
#   bench/run-policy-overhead.sh --repeats 9 --duration 5s
# Results: bench/results/policy-overhead-<timestamp>.{json,png}
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
bench_require run-policy-overhead "network namespaces, BPF" go iperf3 nsenter taskset
bench_build rp-bench-bin policyoverhead
# The hubble CLI reads the observed-l4 case's agent over Hubble's flow API (cached build).
bash scripts/build-hubble.sh
hubble="$(bash scripts/build-hubble.sh --dir)/hubble"
"$bin/policyoverhead" --bin-dir "$bin" --hubble "$hubble" "$@"
