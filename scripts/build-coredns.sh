#!/usr/bin/env bash
# Builds CoreDNS, the real-node cluster's DNS (internal/testenv/nodetest, test/realcluster):
# github.com/coredns/coredns at $COREDNS_VERSION (tools/node/versions.env) from the Go module
# proxy, static, packed as registry.k8s.io/coredns/coredns:$COREDNS_VERSION (the name
# kubeadm's manifests use; no registry is reachable here) the way build-node.sh packs
# agnhost.
#
# The results go to $RAMPART_CACHE/coredns-$COREDNS_VERSION/ (RAMPART_CACHE defaults to
# /var/cache/rampart): coredns, coredns.tar and coredns.ref. Idempotent: when that directory
# is complete it does nothing. From an empty Go build cache it takes about 4 min 45 s on 2
# cores; the binary is 79 MB, its image archive as much again.
#
#   scripts/build-coredns.sh          build if missing
#   scripts/build-coredns.sh --dir    print the directory (building nothing)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/build.sh
. "$root/scripts/lib/build.sh"
# shellcheck source=../tools/node/versions.env
. "$root/tools/node/versions.env"
ref="registry.k8s.io/coredns/coredns:$COREDNS_VERSION"
build_open coredns "$cache/coredns-$COREDNS_VERSION" "$@"
build_cached coredns coredns.tar coredns.ref

echo "setup: building CoreDNS $COREDNS_VERSION into $dir (about 5 minutes the first time)"
build_begin
t0=$SECONDS
build_install "github.com/coredns/coredns@$COREDNS_VERSION"
pack_image "$tmp/coredns" "$ref" "$tmp/coredns.tar"
echo "$ref" >"$tmp/coredns.ref"
# Read whole, then compared: `| grep -q` can fail with SIGPIPE under pipefail.
v="$("$tmp/coredns" -version)"
case "$v" in *"CoreDNS-${COREDNS_VERSION#v}"*) ;; *) echo "build-coredns: coredns reports $v, want ${COREDNS_VERSION#v}" >&2; exit 1 ;; esac
build_finish "$dir"
echo "setup: CoreDNS built in $((SECONDS - t0)) s, image in $dir"
