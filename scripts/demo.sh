#!/usr/bin/env bash
# The Rampart demo: an agent, three endpoints in two namespaces, policies from
# examples/demo/, allowed and denied connections checked one by one, the explanation of a
# verdict, and the flows that show it. Exits non-zero if any outcome differs from the
# expected one, 130 when interrupted. Everything it creates (agent, namespaces, links,
# pins, state) is removed at the end, also on failure or interruption. Needs root.
#
# Environment (used by test/demo; none is needed to run the demo by hand):
#   RAMPART_BIN=DIR     use the rampart, rampartd and rampart-testserver binaries in DIR
#                       instead of building them into bin/
#   DEMO_SKIP_SETUP=1   do not run scripts/setup.sh
#   DEMO_INSTANCE=NAME  agent instance name (default demo<pid>)
set -euo pipefail
# shellcheck source=lib/demo.sh
. "$(dirname "$0")/lib/demo.sh"
demo_setup "${DEMO_SKIP_SETUP:-}" "apt packages, Envoy, Go modules"
demo_bin "bin/rampart, bin/rampartd (about a minute on a fresh machine)" ./cmd/... ./test/rampart-testserver

inst="${DEMO_INSTANCE:-demo$$}"
work=$(mktemp -d /tmp/rampart-demo.XXXXXX)
sock="$work/rampart.sock"
node="rp-$inst-node"
agent_pid=""
servers=()

rampart() { "$BIN/rampart" --socket "$sock" "$@"; }

cleanup() {
	for p in "${servers[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${servers[@]}"; do wait "$p" 2>/dev/null; done
	demo_agent_stop
}
# Ctrl-C or SIGTERM: stop here and clean up (lib/demo.sh).
demo_traps cleanup demo

echo "== starting the agent (instance $inst, node namespace $node, pod range 198.18.0.0/16)"
demo_agent_start
rampart status

echo
echo "== endpoints: shop/web, shop/db, guests/visitor"
rampart namespace label shop team=shop
rampart namespace label guests team=guests
rampart endpoint add shop/web --labels app=web --port http=80/TCP
rampart endpoint add shop/db --labels app=db,tier=data --port postgres=5432/TCP
rampart endpoint add guests/visitor --labels app=visitor
rampart endpoint list
rampart identity list

# Each endpoint serves TCP on 80 and 5432 (a small echo server; started directly, not
# through the shell function, so $! is its PID), so every probe below
# reaches a listening socket unless policy drops it.
for ep in shop/web shop/db guests/visitor; do
	"$BIN/rampart" --socket "$sock" endpoint exec "$ep" -- "$BIN/rampart-testserver" serve --tcp 80,5432 >>"$work/servers.log" 2>&1 &
	servers+=($!)
done

ip_of() { rampart endpoint get "$1" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ip"])'; }
WEB=$(ip_of shop/web); DB=$(ip_of shop/db)

failures=0
check() { # check FROM TO_NAME TO_IP PORT expected(allowed|denied)
	local from=$1 name=$2 ip=$3 port=$4 want=$5 got
	# Wait for the servers to listen before the first probe (they start asynchronously).
	if rampart endpoint exec "$from" -- "$BIN/rampart-testserver" probe --tcp "$ip:$port" --timeout 1s >/dev/null 2>&1; then
		got=allowed
	else
		got=denied
	fi
	if [ "$got" = "$want" ]; then
		printf '  ok    %-15s -> %-9s :%-5s %s\n' "$from" "$name" "$port" "$got"
	else
		printf '  WRONG %-15s -> %-9s :%-5s %s (expected %s)\n' "$from" "$name" "$port" "$got" "$want"
		failures=$((failures + 1))
	fi
}
wait_listening() {
	for _ in $(seq 1 200); do
		rampart endpoint exec shop/web -- "$BIN/rampart-testserver" probe --tcp "$DB:5432" --timeout 200ms >/dev/null 2>&1 &&
			rampart endpoint exec shop/db -- "$BIN/rampart-testserver" probe --tcp "$WEB:80" --timeout 200ms >/dev/null 2>&1 && return 0
		sleep 0.05
	done
	echo "servers did not start" >&2
	return 1
}
wait_listening

echo
echo "== no policy: everything is reachable"
check guests/visitor web "$WEB" 80 allowed
check guests/visitor db "$DB" 5432 allowed
check shop/web db "$DB" 5432 allowed
check shop/web db "$DB" 80 allowed

echo
echo "== applying examples/demo/*.yaml"
for f in examples/demo/*.yaml; do echo "--- $f"; grep -v '^#' "$f"; done
rampart apply -f examples/demo/
rampart get policies

echo
echo "== with policy"
check guests/visitor web "$WEB" 80 allowed
check guests/visitor web "$WEB" 5432 denied
check guests/visitor db "$DB" 5432 denied
check shop/web db "$DB" 5432 allowed
check shop/web db "$DB" 80 denied
check shop/db web "$WEB" 80 allowed

echo
echo "== why can't the visitor reach the database?"
rampart policy trace --from guests/visitor --to shop/db --port 5432/TCP
echo
echo "== why can the web tier?"
rampart policy trace --from shop/web --to shop/db --port 5432/TCP

echo
echo "== the flows (rampart observe --last 12)"
rampart observe --last 12

echo
echo "== counters of shop/db"
rampart endpoint get shop/db

echo
if [ "$failures" -ne 0 ]; then
	echo "demo: $failures outcome(s) differ from the expected ones"
	exit 1
fi
echo "demo: every outcome as expected"
