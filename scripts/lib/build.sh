# shellcheck shell=bash
# The build routine of the build scripts (build-NAME.sh: k8s, cri, node, e2e, hubble,
# cyclonus, coredns), sourced after they set $root: each builds one component into a
# directory of $RAMPART_CACHE (default /var/cache/rampart) named after its name and
# versions, through a temporary directory renamed into place at the end, so an interrupted
# build is never taken for a finished one. A script runs, in this order: build_open NAME
# DIR "$@" (--dir prints DIR), build_cached FILE... (nothing to do when DIR holds them),
# its checks (build_require), build_begin, its builds into $tmp, build_finish.

cache="${RAMPART_CACHE:-/var/cache/rampart}"

# build_open NAME DIR [ARG]: the component is NAME (build-NAME.sh) and builds into DIR
# (sets $name and $dir); with ARG --dir, prints DIR and exits, building nothing.
build_open() {
	name="$1"
	dir="$2"
	if [ "${3:-}" = "--dir" ]; then
		echo "$dir"
		exit 0
	fi
}

# build_cached FILE...: exits, with nothing to do, when every FILE is in $dir: this version
# is built.
build_cached() {
	if build_complete "$dir" "$@"; then
		exit 0
	fi
}

# build_require MODDIR MODULE VERSION: fails unless tools/MODDIR/go.mod requires MODULE at
# VERSION. The go.mod files are what is built; the versions.env files are what the
# directories are named after and what the tests look for: they must agree.
build_require() {
	local v
	v="$(cd "$root/tools/$1" && go list -m -f '{{.Version}}' "$2")"
	[ "$v" = "$3" ] ||
		{ echo "build-$name: tools/$1/go.mod requires $2 $v, want $3" >&2; exit 1; }
}

# build_apt PACKAGE...: installs the Debian packages (quietly, without recommends).
build_apt() {
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# build_install PKG@VERSION...: go install of released commands into $tmp, static and
# stripped, two packages compiled at a time whatever the core count (some take more than a
# GB each to compile).
build_install() {
	CGO_ENABLED=0 GOFLAGS="-buildvcs=false -p=2 -trimpath" GOBIN="$tmp" go install -ldflags "-s -w" "$@"
}

# build_complete DIR FILE...: every FILE is a non-empty file in DIR.
build_complete() {
	local dir="$1" f
	shift
	for f in "$@"; do [ -s "$dir/$f" ] || return 1; done
}

# build_begin: makes the temporary directory ($tmp) removed if the script fails.
build_begin() {
	mkdir -p "$cache"
	tmp="$(mktemp -d "$cache/.$name-build.XXXXXX")"
	trap 'rm -rf "$tmp"' EXIT
}

# build_finish DIR: puts the finished $tmp in place as DIR.
build_finish() {
	rm -rf "$1"
	mv "$tmp" "$1"
	chmod 755 "$1"
	trap - EXIT
}

# k8s_ldflags VERSION: the version Kubernetes' release build stamps in (hack/lib/version.sh):
# without it a component reports v0.0.0-master, which kubectl cannot parse and a Node shows
# as its kubelet's version.
k8s_ldflags() {
	local minor="${1#v1.}" pkg flags="-s -w"
	minor="${minor%%.*}"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $pkg.gitVersion=$1 -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
		flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	echo "$flags"
}

# pack_image BINARY REF OUT: writes OUT, a Docker image archive (what `ctr images import`
# loads, no registry needed) of one layer holding BINARY as /NAME, NAME its entrypoint,
# tagged REF.
pack_image() {
	local bin="$1" ref="$2" out="$3" name img layer config arch
	name="$(basename "$bin")"
	arch="$(go env GOARCH)"
	img="$(mktemp -d)"
	mkdir -p "$img/rootfs"
	cp "$bin" "$img/rootfs/$name"
	chmod 755 "$img/rootfs/$name"
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$img/rootfs" -cf "$img/layer.tar" "$name"
	layer="$(sha256sum "$img/layer.tar" | cut -d' ' -f1)"
	mkdir "$img/$layer"
	mv "$img/layer.tar" "$img/$layer/layer.tar"
	printf '{"architecture":"%s","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Entrypoint":["/%s"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
		"$arch" "$name" "$layer" >"$img/config.json"
	config="$(sha256sum "$img/config.json" | cut -d' ' -f1)"
	mv "$img/config.json" "$img/$config.json"
	printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$config" "$ref" "$layer" >"$img/manifest.json"
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$img" -cf "$out" \
		manifest.json "$config.json" "$layer"
	rm -rf "$img"
}
