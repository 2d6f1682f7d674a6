#!/usr/bin/env bash
# Builds what a real node runs (internal/testenv/nodetest, test/realcluster): kubelet,
# kube-proxy, kube-scheduler and kube-controller-manager (k8s.io/kubernetes, tools/k8s/kube,
# as build-k8s.sh builds the API server), containerd with its runc shim and ctr (the module
# proxy; Debian's containerd 1.6 is too old for kubelet 1.37), runc (cgo with seccomp: without
# it every sandbox fails) and the agnhost test image (upstream's e2e image, packed here as
# registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION since no registry is reachable).
#
# The results go to $RAMPART_CACHE/node-$K8S_VERSION-containerd-$CONTAINERD_VERSION-runc-
# $RUNC_VERSION-agnhost-$AGNHOST_VERSION/ (RAMPART_CACHE defaults to /var/cache/rampart):
# the binaries, agnhost.tar and agnhost.ref. Idempotent: when that directory is complete it
# does nothing. From an empty Go build cache it takes about 12 minutes on 2 cores.
#
#   scripts/build-node.sh          build if missing
#   scripts/build-node.sh --dir    print the directory (building nothing)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/build.sh
. "$root/scripts/lib/build.sh"
# shellcheck source=../tools/k8s/versions.env
. "$root/tools/k8s/versions.env"
# shellcheck source=../tools/node/versions.env
. "$root/tools/node/versions.env"
build_open node "$cache/node-$K8S_VERSION-containerd-$CONTAINERD_VERSION-runc-$RUNC_VERSION-agnhost-$AGNHOST_VERSION" "$@"
build_cached kubelet kube-proxy kube-scheduler kube-controller-manager containerd containerd-shim-runc-v2 ctr runc \
	agnhost agnhost.tar agnhost.ref
build_require k8s/kube k8s.io/kubernetes "$K8S_VERSION"
# runc's seccomp support links libseccomp.
if [ ! -e /usr/include/seccomp.h ]; then
	echo "setup: installing libseccomp-dev (runc's seccomp support)"
	build_apt libseccomp-dev pkg-config
fi

echo "setup: building kubelet, kube-proxy, kube-scheduler, kube-controller-manager $K8S_VERSION, containerd $CONTAINERD_VERSION, runc $RUNC_VERSION and agnhost into $dir (about 12 minutes the first time)"
build_begin
t0=$SECONDS
lap() { echo "setup: $1 built in $((SECONDS - t0)) s"; t0=$SECONDS; }

# Two packages compiled at a time whatever the core count (kubelet peaks at 2 GB).
export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -p=2 -trimpath"
(cd "$root/tools/k8s/kube" && go build -ldflags "$(k8s_ldflags "$K8S_VERSION")" -o "$tmp/" \
	k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
	k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager)
lap "kubelet, kube-proxy, kube-scheduler and kube-controller-manager"
(cd "$root/tools/k8s/kube" && go build -ldflags "-s -w" -o "$tmp/agnhost" k8s.io/kubernetes/test/images/agnhost)
pack_image "$tmp/agnhost" "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION" "$tmp/agnhost.tar"
echo "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION" >"$tmp/agnhost.ref"
lap agnhost

# containerd reports its version to the kubelet (the Node's containerRuntimeVersion): stamp
# the release's, without the "+unknown" a build outside its repository carries.
cver="${CONTAINERD_VERSION#v}"
GOBIN="$tmp" go install -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$cver" \
	"github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
	"github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
lap containerd
CGO_ENABLED=1 GOBIN="$tmp" go install -tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" \
	"github.com/opencontainers/runc@$RUNC_VERSION"
lap runc

v="$("$tmp/kubelet" --version)"
[ "$v" = "Kubernetes $K8S_VERSION" ] ||
	{ echo "build-node: kubelet reports $v, want Kubernetes $K8S_VERSION" >&2; exit 1; }
# Read whole, then compared: `| grep -q` can fail with SIGPIPE under pipefail.
v="$("$tmp/containerd" --version)"
case "$v" in *" $cver "*) ;; *) echo "build-node: containerd reports $v, want $cver" >&2; exit 1 ;; esac
"$tmp/runc" --version >/dev/null
build_finish "$dir"
echo "setup: node binaries and the agnhost image in $dir"
