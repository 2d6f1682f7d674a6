# shellcheck shell=bash
# Shared by the build scripts (build-k8s.sh, build-cri.sh, build-node.sh, build-e2e.sh), sourced: each
# builds into a directory of $RAMPART_CACHE (default /var/cache/rampart) named after its
# versions, through a temporary directory renamed into place at the end, so an interrupted
# build is never taken for a finished one.

cache="${RAMPART_CACHE:-/var/cache/rampart}"

# build_complete DIR FILE...: every FILE is a non-empty file in DIR.
build_complete() {
	local dir="$1" f
	shift
	for f in "$@"; do [ -s "$dir/$f" ] || return 1; done
}

# build_begin PREFIX: makes the temporary directory ($tmp) removed if the script fails.
build_begin() {
	mkdir -p "$cache"
	tmp="$(mktemp -d "$cache/.$1-build.XXXXXX")"
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
