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

source bench/lib.sh
bench_require run-egress "network namespaces, BPF, iptables" go iperf3 nsenter taskset ping ipset nft iptables-legacy iptables-legacy-restore
bench_build rp-bench-bin egressbench
"$bin/egressbench" --bin-dir "$bin" "$@"
