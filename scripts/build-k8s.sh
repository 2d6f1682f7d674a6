#!/usr/bin/env bash
# Builds the Kubernetes control plane the cluster tests and scripts/cluster.sh start: etcd
# (go.etcd.io/etcd/server/v3, tools/k8s/etcd), kube-apiserver and kubectl (k8s.io/kubernetes,
# tools/k8s/kube), from the Go module proxy. No package carries kube-apiserver, and Debian's
# etcd and kubectl are years older than the API the agent watches.
#
# The binaries go to $RAMPART_CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION/ (RAMPART_CACHE
# defaults to /var/cache/rampart). Idempotent: when that directory is complete it does nothing;
# a build lands in a temporary directory renamed into place at the end, so an interrupted build
# is never taken for a finished one. The first build takes about 7 minutes on 2 cores.
#
#   scripts/build-k8s.sh          build if missing
#   scripts/build-k8s.sh --dir    print the directory (building nothing)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/build.sh
. "$root/scripts/lib/build.sh"
# shellcheck source=../tools/k8s/versions.env
. "$root/tools/k8s/versions.env"
build_open k8s "$cache/k8s-$K8S_VERSION-etcd-$ETCD_VERSION" "$@"
build_cached etcd kube-apiserver kubectl
build_require k8s/kube k8s.io/kubernetes "$K8S_VERSION"
build_require k8s/etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"

echo "setup: building etcd $ETCD_VERSION, kube-apiserver and kubectl $K8S_VERSION into $dir (about 7 minutes the first time)"
build_begin

# Two packages compiled at a time (-p=2), whatever the core count: some of kube-apiserver's
# packages take several hundred MB each to compile, and CI builds this on a fresh machine.
# CGO off, as upstream builds them.
export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -p=2 -trimpath"
ldflags="$(k8s_ldflags "$K8S_VERSION")"

(cd "$root/tools/k8s/etcd" && go build -ldflags "-s -w" -o "$tmp/etcd" .)
(cd "$root/tools/k8s/kube" && go build -ldflags "$ldflags" -o "$tmp/" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl)

# Read whole, then compared: `| grep -q` can fail with SIGPIPE under pipefail (setup.sh).
v="$("$tmp/kube-apiserver" --version)"
[ "$v" = "Kubernetes $K8S_VERSION" ] ||
	{ echo "build-k8s: kube-apiserver reports $v, want Kubernetes $K8S_VERSION" >&2; exit 1; }
build_finish "$dir"
echo "setup: control plane binaries in $dir"
