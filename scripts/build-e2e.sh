#!/usr/bin/env bash
# Builds upstream Kubernetes' NetworkPolicy end-to-end specs into e2e.test (tools/k8s/e2e:
# the netpol package of k8s.io/kubernetes/test/e2e at $K8S_VERSION, from the Go module
# proxy), the binary scripts/conformance.sh runs against a Rampart cluster.
#
# The binary goes to $RAMPART_CACHE/e2e-$K8S_VERSION/ (RAMPART_CACHE defaults to
# /var/cache/rampart). Idempotent: when it is there it does nothing; a build lands in a
# temporary directory renamed into place at the end. The first build takes a few minutes on
# 2 cores.
#
#   scripts/build-e2e.sh          build if missing
#   scripts/build-e2e.sh --dir    print the directory (building nothing)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../tools/k8s/versions.env
. "$root/tools/k8s/versions.env"
cache="${RAMPART_CACHE:-/var/cache/rampart}"
dir="$cache/e2e-$K8S_VERSION"

if [ "${1:-}" = "--dir" ]; then
	echo "$dir"
	exit 0
fi
if [ -x "$dir/e2e.test" ]; then
	exit 0
fi
ver="$(cd "$root/tools/k8s/e2e" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
[ "$ver" = "$K8S_VERSION" ] ||
	{ echo "build-e2e: tools/k8s/e2e/go.mod requires k8s.io/kubernetes $ver, want $K8S_VERSION" >&2; exit 1; }

echo "setup: building the NetworkPolicy e2e specs $K8S_VERSION into $dir (a few minutes the first time)"
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.e2e-build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -p=2 -trimpath"
minor="${K8S_VERSION#v1.}"
minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
(cd "$root/tools/k8s/e2e" && go test -c -ldflags "$ldflags" -o "$tmp/e2e.test" .)

v="$("$tmp/e2e.test" --version)"
case "$v" in
"$K8S_VERSION"*) ;;
*) echo "build-e2e: e2e.test reports $v, want $K8S_VERSION" >&2; exit 1 ;;
esac
rm -rf "$dir"
mv "$tmp" "$dir"
chmod 755 "$dir"
trap - EXIT
echo "setup: NetworkPolicy e2e specs in $dir"
