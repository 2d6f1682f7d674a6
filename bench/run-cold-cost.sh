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

if [ "$(id -u)" != 0 ]; then
	echo "run-cold-cost: needs root (network namespaces, BPF)" >&2
	exit 1
fi
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

against=()
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	--against) IFS=, read -ra against <<<"$2"; shift 2 ;;
	*) args+=("$1"); shift ;;
	esac
done

bin=$(mktemp -d /tmp/rp-coldcost-bin-XXXXXX)
trees=()
cleanup() {
	for t in "${trees[@]}"; do git worktree remove --force "$t" >/dev/null 2>&1 || true; done
	rm -rf "$bin"
}
trap cleanup EXIT
go build -o "$bin/" ./cmd/rampartd ./cmd/rampart
(cd bench && go build -o "$bin/" ./cmd/coldcost) # the bench module (bench/go.mod)
builds="head=$bin/rampartd"
for rev in "${against[@]}"; do
	tree="$bin/tree-$rev"
	git worktree add --detach "$tree" "$rev" >/dev/null
	trees+=("$tree")
	(cd "$tree" && go build -o "$bin/rampartd-$rev" ./cmd/rampartd)
	builds="$builds,$rev=$bin/rampartd-$rev"
done
"$bin/coldcost" --builds "$builds" --rampart "$bin/rampart" "${args[@]}"
