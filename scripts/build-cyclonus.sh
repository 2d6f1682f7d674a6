#!/usr/bin/env bash
# Builds cyclonus, the NetworkPolicy test generator (github.com/mattfenwick/cyclonus at
# $CYCLONUS_VERSION, tools/cyclonus/versions.env, from the Go module proxy), static, for
# test/conformance's TestCyclonus and TestCyclonusSubset (scripts/conformance.sh --cyclonus).
#
# The binary goes to $RAMPART_CACHE/cyclonus-$CYCLONUS_VERSION/ (RAMPART_CACHE defaults to
# /var/cache/rampart). Idempotent: when it is there it does nothing; a build lands in a
# temporary directory renamed into place at the end. From an empty Go build cache it takes
# about 2 min 30 s on 2 cores (docs/conformance.md); the binary is 40 MB.
#
#   scripts/build-cyclonus.sh          build if missing
#   scripts/build-cyclonus.sh --dir    print the directory (building nothing)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/build.sh
. "$root/scripts/lib/build.sh"
# shellcheck source=../tools/cyclonus/versions.env
. "$root/tools/cyclonus/versions.env"
build_open cyclonus "$cache/cyclonus-$CYCLONUS_VERSION" "$@"
build_cached cyclonus

echo "setup: building cyclonus $CYCLONUS_VERSION into $dir (a few minutes the first time)"
build_begin
t0=$SECONDS
build_install "github.com/mattfenwick/cyclonus/cmd/cyclonus@$CYCLONUS_VERSION"
# The binary answers its own help: a broken build fails here, not in the test.
"$tmp/cyclonus" generate --help >/dev/null
build_finish "$dir"
echo "setup: cyclonus built in $((SECONDS - t0)) s, in $dir"
