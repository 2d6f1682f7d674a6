#!/usr/bin/env bash
# Measures endpoint churn (see docs/benchmarks.md, "Endpoint churn"): `endpoint add` and
# `endpoint delete` through the API and the CLI with 1, 100 and 1,000 endpoints present,
# beside a plain netlink baseline and its A/A control, and the idle agent's memory and CPU.
# Builds rampartd, rampart and the benchmark from this checkout and runs them as root:
#   bench/run-churn.sh                              # full run, a few minutes
#   bench/run-churn.sh --sizes 1,100 --rounds 10    # quicker (other flags go to the tool)
# Results: bench/results/churn-<timestamp>.{json,md,png}
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
bench_require run-churn "network namespaces, BPF"

instance="ch$$"
bench_build rp-churn-bin churn
cleanup() {
	# The tool cleans up after itself, also on Ctrl-C; this catches a tool that was killed
	# outright. Only this run's instance and its baseline's namespaces are touched.
	if [ -d "/sys/fs/bpf/rampart/$instance" ] || [ -e "/run/netns/rp-$instance-node" ]; then
		"$bin/rampartd" --instance "$instance" --state-dir "$bin/work/state" --socket "$bin/work/rampart.sock" \
			--bpf-dir "/sys/fs/bpf/rampart/$instance" --node-netns "rp-$instance-node" --uninstall || true
	fi
	for ns in /run/netns/rpb-"$instance"-*; do
		[ -e "$ns" ] || continue
		umount -l "$ns" 2>/dev/null || true
		rm -f "$ns"
	done
	rm -rf "$bin"
}
trap cleanup EXIT
"$bin/churn" --bin-dir "$bin" --instance "$instance" --work-dir "$bin/work" "$@"
