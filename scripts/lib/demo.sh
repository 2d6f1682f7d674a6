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

# demo_traps CLEANUP NAME: runs the function CLEANUP (under set +e) when the demo ends, also
# on Ctrl-C and SIGTERM, after saying "NAME: interrupted" or "terminated". Messages go to
# fd 3, a copy of the demo's stdout: a trap runs under the redirections of the command it
# interrupted (a probe's >/dev/null). Without the INT and TERM traps bash would go on after
# an interrupted probe and report it as a WRONG outcome.
demo_traps() {
	demo_cleanup="$1"
	demo_name="$2"
	exec 3>&1
	trap demo_exit EXIT
	# The handlers ignore the signal before exiting: otherwise bash 5.2 can take the pending
	# interrupt as a second one and quit in the middle of the EXIT trap, leaving everything.
	trap 'trap "" INT; exit 130' INT
	trap 'trap "" TERM; exit 143' TERM
}

demo_exit() {
	local rc=$?
	set +e
	# By exit status rather than in the INT trap: when the foreground child handles SIGINT
	# and exits 130 itself, bash never runs the INT trap, and set -e ends the script here.
	case $rc in
	130) echo >&3; echo "$demo_name: interrupted; cleaning up" >&3 ;;
	143) echo "$demo_name: terminated; cleaning up" >&3 ;;
	esac
	"$demo_cleanup"
}

# demo_agent_start: starts the demo's agent in the background (rampartd: instance $inst,
# node namespace $node, state in $work, socket $sock, pod range 198.18.0.0/16, its log in
# $work/rampartd.log), sets agent_pid, and waits until it answers.
demo_agent_start() {
	"$BIN/rampartd" --instance "$inst" --state-dir "$work/state" --socket "$sock" --node-netns "$node" \
		--pod-cidr 198.18.0.0/16 2>"$work/rampartd.log" &
	agent_pid=$!
	for _ in $(seq 1 200); do
		"$BIN/rampart" --socket "$sock" status >/dev/null 2>&1 && return 0
		kill -0 "$agent_pid" 2>/dev/null || { cat "$work/rampartd.log"; exit 1; }
		sleep 0.05
	done
}

# demo_agent_stop: stops the agent demo_agent_start started, removes its instance
# (rampartd --uninstall; a failure is reported with its output) and the work directory.
demo_agent_stop() {
	if [ -n "${agent_pid:-}" ]; then kill "$agent_pid" 2>/dev/null; wait "$agent_pid" 2>/dev/null; fi
	if ! "$BIN/rampartd" --instance "$inst" --state-dir "$work/state" --socket "$sock" --node-netns "$node" --uninstall >"$work/uninstall.log" 2>&1; then
		echo "$demo_name: uninstall of instance $inst failed:" >&3
		cat "$work/uninstall.log" >&3
	fi
	rm -rf "$work"
}

# demo_cluster_stop: the cluster demos' cleanup: stops the cluster (scripts/cluster.sh
# stop; a failure is reported with its output) and removes the work directory.
demo_cluster_stop() {
	echo "== stopping the cluster" >&3
	if ! bash scripts/cluster.sh stop >"$work/stop.log" 2>&1; then
		echo "$demo_name: stopping the cluster failed:" >&3
		cat "$work/stop.log" >&3
	fi
	rm -rf "$work"
}
