# shellcheck shell=bash
# Shared by bench/run-*.sh, sourced after they cd to the repository root: the common head of
# a benchmark run (root, the tools it needs, bpffs) and building its binaries.

# bench_require NAME WHY [TOOL...]: exits unless run as root (WHY says what needs it) and
# every TOOL is on PATH ($bench_tools_hint says what installs them); mounts bpffs, which a
# fresh machine does not have and the agents pin their maps in.
bench_require() {
	local name="$1" why="$2" tool
	shift 2
	if [ "$(id -u)" != 0 ]; then
		echo "$name: needs root ($why)" >&2
		exit 1
	fi
	for tool in "$@"; do
		if ! command -v "$tool" >/dev/null 2>&1; then
			echo "$name: $tool not found (${bench_tools_hint:-scripts/setup.sh installs what is needed})" >&2
			exit 1
		fi
	done
	mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
}

# bench_build PREFIX COMMAND [PACKAGE...]: builds rampartd, rampart and the product's PACKAGEs
# from this checkout and the bench module's cmd/COMMAND into a new directory $bin
# (/tmp/PREFIX-XXXXXX), removed when the script exits.
bench_build() {
	local prefix="$1" command="$2"
	shift 2
	bin=$(mktemp -d "/tmp/$prefix-XXXXXX")
	trap 'rm -rf "$bin"' EXIT
	go build -o "$bin/" ./cmd/rampartd ./cmd/rampart "$@"
	(cd bench && go build -o "$bin/" "./cmd/$command") # the bench module (bench/go.mod)
}

# bench_fortio NAME: sets $fortio to fortio on PATH, or where scripts/setup.sh installs it;
# else to one built into $bin for this run.
bench_fortio() {
	local gobin
	fortio=$(command -v fortio || true)
	gobin="$(go env GOPATH | cut -d: -f1)/bin"
	[ -n "$fortio" ] || { [ -x "$gobin/fortio" ] && fortio="$gobin/fortio"; } || true
	if [ -z "$fortio" ]; then
		echo "$1: fortio not installed; building fortio 1.68.2 for this run"
		(cd / && GOBIN="$bin" GOFLAGS=-mod=mod go install fortio.org/fortio@v1.68.2)
		fortio="$bin/fortio"
	fi
}

# bench_against ARG...: splits the arguments into --against's comma-separated revisions
# ($against) and the rest, which go to the tool ($args).
bench_against() {
	against=()
	args=()
	while [ $# -gt 0 ]; do
		case "$1" in
		--against) IFS=, read -ra against <<<"$2"; shift 2 ;;
		*) args+=("$1"); shift ;;
		esac
	done
}
