# shellcheck shell=bash
# The demos' common opening (scripts/demo*.sh and lib/dvdrental-cluster.sh source it): the
# working directory is the repository's root and Go is on PATH; demo_setup sets the
# machine up, demo_bin finds or builds the binaries the demo runs.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PATH="$PATH:/usr/local/go/bin"

# demo_setup SKIP WHAT: runs scripts/setup.sh (WHAT: what it installs that the demo needs)
# unless SKIP is 1 (the demo's *_SKIP_SETUP variable).
demo_setup() {
	if [ "${1:-}" != 1 ]; then
		echo "== setting up this machine (scripts/setup.sh: $2; a few minutes on a fresh machine)"
		bash scripts/setup.sh
	fi
}

# go_build OUT PKG...: builds the packages (paths from the repository's root) into the
# directory OUT: the product's in the root module, those under ./examples/ in the
# examples module (examples/go.mod, a module of its own).
go_build() {
	local out="$1" p product=() examples=()
	shift
	for p in "$@"; do
		case "$p" in
		./examples/*) examples+=("./${p#./examples/}") ;;
		*) product+=("$p") ;;
		esac
	done
	mkdir -p "$out"
	out="$(cd "$out" && pwd)"
	if [ "${#product[@]}" -gt 0 ]; then go build -o "$out/" "${product[@]}"; fi
	if [ "${#examples[@]}" -gt 0 ]; then go -C examples build -o "$out/" "${examples[@]}"; fi
}

# demo_bin WHAT PKG...: sets BIN, the directory of the demo's binaries: RAMPART_BIN if set,
# else bin/ with PKG... built into it (WHAT: what the message says is built).
demo_bin() {
	if [ -n "${RAMPART_BIN:-}" ]; then
		BIN="$(cd "$RAMPART_BIN" && pwd)"
	else
		echo "== building $1"
		shift
		go_build bin "$@"
		BIN="$(pwd)/bin"
	fi
}
