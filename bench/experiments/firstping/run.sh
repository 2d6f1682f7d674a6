#!/usr/bin/env bash
# What the first packet of a new flow pays for the agent reading its flow event: starts a
# rampartd of its own with one endpoint, then runs short pings (each ping process is a new
# ICMP flow, so its first echo takes the new-flow path and sends a flow event) from the
# endpoint to its router, pinned to CPU 0, with the agent running and with it stopped
# (SIGSTOP: the event is written but nobody reads it). Prints the median round trip of
# the first echo and of the others, for each. Needs root; removes everything it made.
#   bench/experiments/firstping/run.sh [ROUNDS] [PINGS-PER-ROUND]
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds=${1:-60}
pings=${2:-4}
if [ "$(id -u)" != 0 ]; then
	echo "firstping: needs root" >&2
	exit 1
fi
inst=fp$(od -An -N2 -tx2 /dev/urandom | tr -d ' ')
work=$(mktemp -d /tmp/rp-firstping-XXXXXX)
args=(--instance "$inst" --state-dir "$work/state" --socket "$work/s.sock" --bpf-dir "/sys/fs/bpf/rampart/$inst"
	--node-netns "rp-$inst-node" --pod-cidr 198.18.77.0/24)
pid=
cleanup() {
	[ -n "$pid" ] && kill -CONT "$pid" 2>/dev/null && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
	"$work/rampartd" "${args[@]}" --uninstall >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/" ./cmd/rampartd ./cmd/rampart
"$work/rampartd" "${args[@]}" >"$work/agent.log" 2>&1 &
pid=$!
for _ in $(seq 300); do "$work/rampart" --socket "$work/s.sock" status >/dev/null 2>&1 && break; sleep 0.1; done
netns=$("$work/rampart" --socket "$work/s.sock" endpoint add firstping/client --labels app=firstping \
	--ip 198.18.77.10 -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["netns"])')

measure() {
	local first=() rest=() out j us
	for _ in $(seq "$rounds"); do
		out=$(nsenter --net="$netns" -- taskset -c 0 ping -n -c "$pings" -i 0.002 198.18.77.1 | grep -o 'time=[0-9.]*' | cut -d= -f2)
		j=0
		for v in $out; do
			us=$(awk -v v="$v" 'BEGIN{printf "%d", v*1000}')
			if [ $j -eq 0 ]; then first+=("$us"); else rest+=("$us"); fi
			j=$((j + 1))
		done
	done
	med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
	echo "$1: first echo median $(med "${first[@]}") us, others $(med "${rest[@]}") us ($rounds flows)"
}
for r in 1 2; do
	measure "round $r, agent running"
	kill -STOP "$pid"
	measure "round $r, agent stopped"
	kill -CONT "$pid"
done
