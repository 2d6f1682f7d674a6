#!/usr/bin/env bash
# Builds what the containerd test (test/containerd) needs besides containerd itself: crictl
# (sigs.k8s.io/cri-tools, tools/cri/crictl), the CNI loopback plugin containerd's CRI plugin
# runs for every pod's lo (github.com/containernetworking/plugins, tools/cri/plugins), and
# the sandbox ("pause") image: tools/cri/pause built static and packed here into a Docker
# image archive that `ctr images import` loads, since no image registry is reachable. Debian
# has containerd (1.6) but no cri-tools package; containerd is installed from apt when
# missing.
#
# The results go to $RAMPART_CACHE/cri-crictl-$CRICTL_VERSION-plugins-$CNI_PLUGINS_VERSION-
# pause-$PAUSE_VERSION/ (RAMPART_CACHE defaults to /var/cache/rampart): crictl, loopback,
# pause and pause.tar, whose image is named in pause.ref. Idempotent: when that directory is
# complete it does nothing; a build lands in a temporary directory renamed into place at the
# end, so an interrupted build is never taken for a finished one.
#
#   scripts/build-cri.sh          install and build what is missing
#   scripts/build-cri.sh --dir    print the directory (building nothing)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/build.sh
. "$root/scripts/lib/build.sh"
# shellcheck source=../tools/cri/versions.env
. "$root/tools/cri/versions.env"
build_open cri "$cache/cri-crictl-$CRICTL_VERSION-plugins-$CNI_PLUGINS_VERSION-pause-$PAUSE_VERSION" "$@"

# containerd brings runc and the runc shim with it. The package's service is not started
# here: the test runs a containerd of its own.
if ! command -v containerd >/dev/null 2>&1 || ! command -v ctr >/dev/null 2>&1; then
	echo "setup: installing containerd"
	build_apt containerd
fi

build_cached crictl loopback pause pause.tar pause.ref
build_require cri/crictl sigs.k8s.io/cri-tools "$CRICTL_VERSION"
build_require cri/plugins github.com/containernetworking/plugins "$CNI_PLUGINS_VERSION"

echo "setup: building crictl $CRICTL_VERSION, loopback $CNI_PLUGINS_VERSION and the pause image into $dir"
build_begin

export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath"
(cd "$root/tools/cri/crictl" && go build -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
	-o "$tmp/crictl" sigs.k8s.io/cri-tools/cmd/crictl)
(cd "$root/tools/cri/plugins" && go build -ldflags "-s -w" -o "$tmp/loopback" \
	github.com/containernetworking/plugins/plugins/main/loopback)
(cd "$root/tools/cri/pause" && go build -ldflags "-s -w" -o "$tmp/pause" .)

# The .invalid domain says the image comes from no registry.
ref="rampart.invalid/pause:$PAUSE_VERSION"
pack_image "$tmp/pause" "$ref" "$tmp/pause.tar"
echo "$ref" >"$tmp/pause.ref"

"$tmp/crictl" --version >/dev/null
build_finish "$dir"
echo "setup: crictl, loopback and the pause image ($ref) in $dir"
