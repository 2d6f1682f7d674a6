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

source bench/lib.sh
bench_require run-dns "network namespaces, BPF" go nsenter taskset
bench_build rp-dns-bin dnsbench
"$bin/dnsbench" --bin-dir "$bin" "$@"
