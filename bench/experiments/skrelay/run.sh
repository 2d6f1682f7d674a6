#!/bin/bash
# Runs the skrelay experiment (see doc.go): builds it and its BPF objects into a temporary
# directory, then measures each path in closed loop.
# Usage (root): bench/experiments/skrelay/run.sh [--rounds N] [--seconds S] [--paths LIST]
set -euo pipefail
cd "$(dirname "$0")/../../.."
[ "$(id -u)" = 0 ] || { echo "skrelay: needs root (BPF)" >&2; exit 1; }
fortio=$(command -v fortio || echo "$(go env GOPATH | cut -d: -f1)/bin/fortio")
[ -x "$fortio" ] || { echo "skrelay: fortio not found (scripts/setup.sh installs it)" >&2; exit 1; }
bin=$(mktemp -d /tmp/rp-skrelay-XXXXXX)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./bench/experiments/skrelay
for o in relay msg; do
	clang -O2 -g -target bpf -I"/usr/include/$(uname -m)-linux-gnu" \
		-c "bench/experiments/skrelay/bpf/$o.bpf.c" -o "$bin/$o.bpf.o"
done
"$bin/skrelay" bench --bpf "$bin" --fortio "$fortio" "$@"
