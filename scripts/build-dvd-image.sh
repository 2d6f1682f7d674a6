#!/usr/bin/env bash
# Builds the DVD rental demo's image for its cluster form (examples/dvdrental/cluster/),
# without a registry or a container daemon, as scripts/build-image.sh builds Rampart's:
# one image, rampart.io/dvdrental, whose pods each run one subcommand of its entrypoint,
# the dvdrental binary (examples/dvdrental/cmd/dvdrental, static): `db` (PostgreSQL 15,
# Debian's server binaries, its share directory and the extension libraries but LLVM's
# JIT, and /bin/sh for initdb; run as the image's postgres user), `mq` (mosquitto), `serve SERVICE`, `idle`, and
# `monitor` (Suricata 7, configured by internal/monitor/suricata, with the integrity Lua
# script at /usr/share/dvdrental/integrity.lua). Dynamically linked programs bring their
# ldd closure at the paths they were linked to find it. Packed by tools/image
# (go-containerregistry) into a Docker image archive that `ctr -n k8s.io images import`
# loads (scripts/cluster.sh start --image ARCHIVE), tagged rampart.io/dvdrental:<version>
# and rampart.io/dvdrental:latest.
#
# The archive goes to $RAMPART_CACHE/image/dvdrental-<version>-suricata<X.Y.Z>.tar
# (RAMPART_CACHE defaults to /var/cache/rampart), <version> being `git describe --tags
# --always --dirty`. Idempotent: a clean version whose archive exists is not built again;
# a dirty tree is always rebuilt. Needs the host's PostgreSQL 15, mosquitto and Suricata 7
# (scripts/setup.sh, scripts/install-suricata.sh).
#
#   scripts/build-dvd-image.sh          build (if needed) and print the archive's path
#   scripts/build-dvd-image.sh --ref    print the image's name
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export PATH="$PATH:/usr/local/go/bin"
version="$(git -C "$root" describe --tags --always --dirty)"
ref="rampart.io/dvdrental:$version"
if [ "${1:-}" = "--ref" ]; then
	echo "$ref"
	exit 0
fi
pg=/usr/lib/postgresql/15
for f in "$pg/bin/postgres" "$pg/bin/initdb" /usr/share/postgresql/15 /usr/sbin/mosquitto /usr/bin/suricata; do
	[ -e "$f" ] || { echo "build-dvd-image: $f not found (scripts/setup.sh, scripts/install-suricata.sh)" >&2; exit 1; }
done
suricata="$(/usr/bin/suricata -V | sed -n 's/.*version \([0-9.]*\).*/\1/p')"
cache="${RAMPART_CACHE:-/var/cache/rampart}"
out="$cache/image/dvdrental-$version-suricata$suricata.tar"
if [ -s "$out" ] && [[ "$version" != *-dirty ]]; then
	echo "$out"
	exit 0
fi

mkdir -p "$cache/image"
tmp="$(mktemp -d "$cache/image/.dvd-build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
(cd "$root/examples" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/dvdrental" ./dvdrental/cmd/dvdrental)
(cd "$root/tools/image" && CGO_ENABLED=0 go build -trimpath -o "$tmp/image" .)

# The image's users: PostgreSQL refuses root and looks its user up; mosquitto started as
# root drops to its own.
printf '%s\n' 'root:x:0:0:root:/root:/bin/false' 'postgres:x:999:999:PostgreSQL:/tmp:/bin/false' \
	'mosquitto:x:998:998:mosquitto:/tmp:/bin/false' 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >"$tmp/passwd"
printf '%s\n' 'root:x:0:' 'postgres:x:999:' 'mosquitto:x:998:' 'nogroup:x:65534:' >"$tmp/group"

declare -A files=(
	[/usr/local/bin/dvdrental]="$tmp/dvdrental"
	[/usr/share/dvdrental/integrity.lua]="$root/examples/dvdrental/monitor/integrity.lua"
	[/etc/passwd]="$tmp/passwd"
	[/etc/group]="$tmp/group"
	[/usr/sbin/mosquitto]=/usr/sbin/mosquitto
	[/usr/bin/suricata]=/usr/bin/suricata
	[/usr/share/zoneinfo/UTC]="$(readlink -f /usr/share/zoneinfo/UTC)"
	[/usr/share/zoneinfo/Etc/UTC]="$(readlink -f /usr/share/zoneinfo/Etc/UTC)"
)
# initdb runs the server through popen(3): a shell, dash, at /bin/sh.
files[/bin/sh]="$(readlink -f /bin/sh)"
binaries=(/usr/sbin/mosquitto /usr/bin/suricata "$(readlink -f /bin/sh)")
for b in postgres initdb; do
	files["$pg/bin/$b"]="$pg/bin/$b"
	binaries+=("$pg/bin/$b")
done
# The extension libraries (plpgsql, the encoding conversions, ...), not the JIT: it would
# bring LLVM, and the server runs with jit=off.
while read -r f; do
	files["$f"]="$f"
	binaries+=("$f")
done < <(find "$pg/lib" -maxdepth 1 -name '*.so' ! -name 'llvmjit*')
while read -r f; do
	files["$f"]="$(readlink -f "$f")"
done < <(find -L /usr/share/postgresql/15 -type f)
for b in "${binaries[@]}"; do
	while read -r lib; do
		files["$lib"]="$(readlink -f "$lib")"
	done < <(ldd "$b" | awk '/=> \//{print $3} /^\t\/lib/{print $1}')
done

args=()
for dest in "${!files[@]}"; do args+=("$dest=${files[$dest]}"); done
"$tmp/image" build --out "$tmp/dvdrental.tar" --tag "$ref" --tag rampart.io/dvdrental:latest \
	--entrypoint /usr/local/bin/dvdrental --env TZ=UTC --env PGTZ=UTC "${args[@]}" >/dev/null
mv "$tmp/dvdrental.tar" "$out"
echo "$out"
