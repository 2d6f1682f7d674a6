#!/usr/bin/env bash
# Builds the hubble CLI (github.com/cilium/cilium/hubble at $HUBBLE_VERSION,
# tools/hubble/versions.env, from the Go module proxy through tools/hubble/go.mod), static,
# for the tests that run the real `hubble observe` against rampartd --hubble-address
# (cmd/rampartd's TestHubbleCLI).
#
# The binary goes to $RAMPART_CACHE/hubble-$HUBBLE_VERSION/ (RAMPART_CACHE defaults to
# /var/cache/rampart). Idempotent: when it is there it does nothing; a build lands in a
# temporary directory renamed into place at the end.
#
#   scripts/build-hubble.sh          build if missing
#   scripts/build-hubble.sh --dir    print the directory (building nothing)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/build.sh
. "$root/scripts/lib/build.sh"
# shellcheck source=../tools/hubble/versions.env
. "$root/tools/hubble/versions.env"
build_open hubble "$cache/hubble-$HUBBLE_VERSION" "$@"
build_cached hubble
build_require hubble github.com/cilium/cilium "$HUBBLE_VERSION"

echo "setup: building the hubble CLI $HUBBLE_VERSION into $dir (a few minutes the first time)"
build_begin
t0=$SECONDS
# Two packages compiled at a time whatever the core count, as build-node.sh does. The
# version is stamped as cilium's hubble/Makefile does, so `hubble version` names it.
(cd "$root/tools/hubble" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -p=2 -trimpath" \
	go build -ldflags "-s -w -X github.com/cilium/cilium/hubble/pkg.Version=$HUBBLE_VERSION" \
	-o "$tmp/hubble" github.com/cilium/cilium/hubble)
# The binary answers its own version: a broken build fails here, not in the test.
"$tmp/hubble" version | grep -qF "${HUBBLE_VERSION#v}" ||
	{ echo "build-hubble: $tmp/hubble version does not name $HUBBLE_VERSION" >&2; exit 1; }
build_finish "$dir"
echo "setup: hubble built in $((SECONDS - t0)) s, in $dir"
