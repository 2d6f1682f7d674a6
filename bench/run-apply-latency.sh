#!/usr/bin/env bash
# Measures how long a policy of 100, 1,000 and 10,000 rules takes from the apply call to
# enforcement seen in packets on one node (see docs/benchmarks.md, "Apply to enforcement").
# Builds rampartd and rampart from this checkout and, with --against, from other revisions
# or trees, and measures the builds in turns:
#   bench/run-apply-latency.sh                              # this checkout, about 3 minutes
#   bench/run-apply-latency.sh --against main               # against a revision (or A,B)
#   bench/run-apply-latency.sh --against /tmp/old-tree      # against another work tree
#   bench/run-apply-latency.sh --sizes 10000 --rounds 20    # other flags go to the tool
# Results: bench/results/apply-latency-<timestamp>.{json,md,png}
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/lib.sh
bench_require run-apply-latency "network namespaces, BPF"
bench_against "$@"

instance="al$$"
bin=$(mktemp -d /tmp/rp-applylat-bin-XXXXXX)
trees=()
names=()
cleanup() {
	# The tool cleans up after itself, also on Ctrl-C; this catches a tool that was killed
	# outright. Only this run's instances (one per build) are touched.
	for i in "${!names[@]}"; do
		inst="$instance$i"
		if [ -d "/sys/fs/bpf/rampart/$inst" ] || [ -e "/run/netns/rp-$inst-node" ]; then
			"$bin/${names[$i]}/rampartd" --instance "$inst" --state-dir "$bin/work/${names[$i]}/state" \
				--socket "$bin/work/${names[$i]}/rampart.sock" --bpf-dir "/sys/fs/bpf/rampart/$inst" \
				--node-netns "rp-$inst-node" --uninstall || true
		fi
	done
	for t in "${trees[@]}"; do git worktree remove --force "$t" >/dev/null 2>&1 || true; done
	rm -rf "$bin"
}
trap cleanup EXIT
mkdir -p "$bin/head"
go build -o "$bin/head/" ./cmd/rampartd ./cmd/rampart
(cd bench && go build -o "$bin/" ./cmd/applylatency) # the bench module (bench/go.mod)
builds="head=$bin/head"
names+=(head)
for rev in "${against[@]}"; do
	name=$(basename "$rev")
	if [ -d "$rev" ]; then
		tree="$rev"
	else
		tree="$bin/tree-$name"
		git worktree add -q --detach "$tree" "$rev"
		trees+=("$tree")
	fi
	mkdir -p "$bin/$name"
	(cd "$tree" && go build -o "$bin/$name/" ./cmd/rampartd ./cmd/rampart)
	builds="$builds,$name=$bin/$name"
	names+=("$name")
done
"$bin/applylatency" --builds "$builds" --instance "$instance" --work-dir "$bin/work" "${args[@]}"
