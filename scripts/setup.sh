#!/usr/bin/env bash
# Installs everything Rampart's build, tests, demo and benchmarks need. Idempotent: safe to
# run again; skips what is already there. Needs root (apt, bpffs).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
for p in clang llvm libbpf-dev bpftool iperf3 iproute2 util-linux ethtool; do
	dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
	echo "setup: installing ${need_pkgs[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1; then
	echo "setup: Go toolchain not found on PATH (expected /usr/local/go/bin/go)" >&2
	exit 1
fi
go mod download

# bpffs is not mounted on a fresh machine; the agent pins its maps there.
if ! mountpoint -q /sys/fs/bpf; then
	mount -t bpf bpf /sys/fs/bpf
fi
mkdir -p /run/netns

# --- Star Wars demo (scripts/demo-starwars.sh, test/starwars): its two storage servers are
# real FTP servers, pyftpdlib (PyPI; Debian's python3-pyftpdlib if pip cannot install).
if ! python3 -c 'import pyftpdlib' >/dev/null 2>&1; then
	echo "setup: installing pyftpdlib"
	python3 -m pip install --quiet pyftpdlib==2.2.0 >/dev/null 2>&1 ||
		python3 -m pip install --quiet --break-system-packages pyftpdlib==2.2.0 >/dev/null 2>&1 ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pyftpdlib >/dev/null; }
	python3 -c 'import pyftpdlib' || { echo "setup: pyftpdlib did not install" >&2; exit 1; }
fi
