#!/usr/bin/env bash
# Builds upstream Kubernetes' NetworkPolicy end-to-end specs into e2e.test (tools/k8s/e2e:
# the netpol package of k8s.io/kubernetes/test/e2e at $K8S_VERSION, from the Go module
# proxy), the binary scripts/conformance.sh runs against a Rampart cluster, and the ginkgo
# CLI of the version those specs require (github.com/onsi/ginkgo/v2 in tools/k8s/e2e/go.mod),
# which runs them in parallel.
#
# Both go to $RAMPART_CACHE/e2e-$K8S_VERSION/ (RAMPART_CACHE defaults to
# /var/cache/rampart). Idempotent: when both are there it does nothing, and one that is there
# is kept rather than built again; a build lands in a temporary directory renamed into place
# at the end. The first build takes a few minutes on 2 cores.
#
#   scripts/build-e2e.sh          build if missing
#   scripts/build-e2e.sh --dir    print the directory (building nothing)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../tools/k8s/versions.env
. "$root/tools/k8s/versions.env"
# shellcheck source=lib/build.sh
. "$root/scripts/lib/build.sh"
build_open e2e "$cache/e2e-$K8S_VERSION" "$@"
build_cached e2e.test ginkgo
build_require k8s/e2e k8s.io/kubernetes "$K8S_VERSION"

build_begin
export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -p=2 -trimpath"
if [ -s "$dir/e2e.test" ]; then
	cp "$dir/e2e.test" "$tmp/e2e.test"
else
	echo "setup: building the NetworkPolicy e2e specs $K8S_VERSION into $dir (a few minutes the first time)"
	(cd "$root/tools/k8s/e2e" && go test -c -ldflags "$(k8s_ldflags "$K8S_VERSION")" -o "$tmp/e2e.test" .)
fi
v="$("$tmp/e2e.test" --version)"
case "$v" in
"$K8S_VERSION"*) ;;
*) echo "build-e2e: e2e.test reports $v, want $K8S_VERSION" >&2; exit 1 ;;
esac

if [ -s "$dir/ginkgo" ]; then
	cp "$dir/ginkgo" "$tmp/ginkgo"
else
	gv="$(cd "$root/tools/k8s/e2e" && go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)"
	echo "setup: building the ginkgo CLI $gv into $dir"
	(cd "$root/tools/k8s/e2e" && go build -ldflags "-s -w" -o "$tmp/ginkgo" github.com/onsi/ginkgo/v2/ginkgo)
fi
build_finish "$dir"
echo "setup: NetworkPolicy e2e specs in $dir"
