#!/usr/bin/env bash
# Measures what Rampart's tc programs cost a packet when the machine idles between packets
# (a ping every millisecond), from the kernel's BPF run-time statistics (see
# docs/benchmarks.md). Builds rampartd from this checkout and, with --against, from other
# revisions, and lets the builds take turns on one endpoint:
#   bench/run-cold-cost.sh                          # this checkout only
#   bench/run-cold-cost.sh --against 5d67fca        # this checkout against a revision
#   bench/run-cold-cost.sh --rounds 12 --pings 3000 # more samples (other flags go to the tool)
# Results: bench/results/cold-cost-<timestamp>.{json,md,png}
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
bench_require run-cold-cost "network namespaces, BPF"
bench_against "$@"

bench_build rp-coldcost-bin coldcost
trees=()
cleanup() {
	for t in "${trees[@]}"; do git worktree remove --force "$t" >/dev/null 2>&1 || true; done
	rm -rf "$bin"
}
trap cleanup EXIT
builds="head=$bin/rampartd"
for rev in "${against[@]}"; do
	tree="$bin/tree-$rev"
	git worktree add --detach "$tree" "$rev" >/dev/null
	trees+=("$tree")
	(cd "$tree" && go build -o "$bin/rampartd-$rev" ./cmd/rampartd)
	builds="$builds,$rev=$bin/rampartd-$rev"
done
"$bin/coldcost" --builds "$builds" --rampart "$bin/rampart" "${args[@]}"
