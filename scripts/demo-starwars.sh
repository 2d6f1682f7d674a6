#!/usr/bin/env bash
# The Star Wars demo (Cilium's, extended as in the paper on Cilium API filtering): the
# Empire's deathstar, a tiefighter, the rebels' xwing and two real FTP servers that store
# the deathstar's API log. It plays the attack with no policy, then each defence from
# examples/starwars/ (L3/L4 ingress, L3/L4 egress, L7 HTTP), checks every outcome, shows
# the flows that explain it, and exits non-zero if any outcome differs from the expected
# one. Everything it creates (agent, namespaces, links, pins, processes, files) is removed
# at the end, also on failure or interruption. Needs root.
#
# Environment (used by test/starwars; none is needed to run the demo by hand):
#   RAMPART_BIN=DIR        use the rampart, rampartd and starwars binaries in DIR instead of
#                          building them into bin/
#   STARWARS_SKIP_SETUP=1  do not run scripts/setup.sh
#   STARWARS_INSTANCE=NAME agent instance name (default sw<pid>)
#   STARWARS_WORK=DIR      work directory (state, logs, stored files; default a new one
#                          under /tmp); removed at the end like everything else
set -euo pipefail
# -h, --help: print the comment above and exit (what the README's check of its commands runs).
case "${1:-}" in -h | --help) sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
# shellcheck source=lib/demo.sh
. "$(dirname "$0")/lib/demo.sh"
demo_setup "${STARWARS_SKIP_SETUP:-}" "apt packages, Envoy, FTP server, Go modules"
demo_bin "bin/rampart, bin/rampartd, bin/starwars (about a minute on a fresh machine)" ./cmd/... ./examples/starwars/cmd/starwars
if ! python3 -c 'import pyftpdlib' 2>/dev/null; then
	echo "demo-starwars: the FTP servers need pyftpdlib (scripts/setup.sh installs it)" >&2
	exit 1
fi

inst="${STARWARS_INSTANCE:-sw$$}"
if [ -n "${STARWARS_WORK:-}" ]; then
	work=$STARWARS_WORK
	mkdir -p "$work"
else
	work=$(mktemp -d /tmp/rampart-starwars.XXXXXX)
fi
sock="$work/rampart.sock"
node="rp-$inst-node"
ftp_pass="tk421-$RANDOM$RANDOM"
agent_pid=""
ds_pid=""
ds_run=0
bg_pids=()

rampart() { "$BIN/rampart" --socket "$sock" "$@"; }
# inep EP CMD...: run a starwars command in endpoint default/EP.
inep() { local ep=$1; shift; "$BIN/rampart" --socket "$sock" endpoint exec "default/$ep" -- "$BIN/starwars" "$@"; }

cleanup() {
	[ -n "$ds_pid" ] && bg_pids+=("$ds_pid")
	# The rampart CLI forwards SIGTERM to the command it runs in the endpoint.
	for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${bg_pids[@]}"; do wait "$p" 2>/dev/null; done
	demo_agent_stop
}
# SIGTERM and SIGINT run the cleanup too (the test harness stops the demo with SIGTERM).
demo_traps cleanup demo-starwars

# ---- outcome bookkeeping -------------------------------------------------------------
results=()
failures=0
# check ID WHAT GOT WANT: WANT is a |-separated list of acceptable outcomes.
check() {
	local id=$1 what=$2 got=$3 want=$4
	if [[ "|$want|" == *"|$got|"* ]]; then
		printf '  ok    [%s] %s: %s\n' "$id" "$what" "$got"
		results+=("ok    $id")
	else
		printf '  WRONG [%s] %s: %s (expected %s)\n' "$id" "$what" "$got" "$want"
		results+=("WRONG $id")
		failures=$((failures + 1))
	fi
}
skip() { # skip ID WHY
	printf '  SKIP  [%s] %s\n' "$1" "$2"
	results+=("SKIP  $1")
}

# ship FROM METHOD PATH [TIMEOUT]: one HTTP request from a ship to the deathstar. Sets OUT
# (the whole answer) and GOT (its first word: the status code, timeout, refused or closed).
# Requests expected to be dropped pass a short TIMEOUT: a dropped SYN never gets an answer,
# while an allowed one is answered in milliseconds; the others get a generous one, so that
# a busy machine does not turn a slow answer into a wrong outcome.
ship() {
	local from=$1 method=$2 path=$3 timeout=${4:-5s}
	echo "  > $from: $method http://deathstar$path"
	OUT=$(inep "$from" ship --name "$from" --timeout "$timeout" "$method" "http://$DS$path" 2>&1) || true
	GOT=$(head -n 1 <<<"$OUT" | awk '{print $1}')
	sed 's/^/    /' <<<"$OUT"
}

# ftp_read FROM URL: read a file over FTP from an endpoint. Sets OUT and GOT (read or
# failed).
ftp_read() {
	local from=$1 url=$2
	echo "  > $from: FTP read $url"
	if OUT=$(inep "$from" ftp-get --timeout 5s "$url" 2>&1); then GOT=read; else GOT=failed; fi
}

# wait_upload RUN N NAME: the deathstar's report on shipping a log that covers at least
# request #N to storage NAME (polled from its output). Sets OUT (the report line) and GOT
# (ok, failed, or none if no report came).
wait_upload() {
	local file="$work/deathstar.$1.log" n=$2 name=$3
	OUT=""
	for _ in $(seq 1 150); do
		OUT=$(awk -v n="$n" -v name="$name:" \
			'$1 == "upload" && $3 == name && substr($2, 2) + 0 >= n { print; exit }' "$file")
		[ -n "$OUT" ] && break
		sleep 0.1
	done
	if [ -z "$OUT" ]; then GOT=none; OUT="(no upload report for #$n in 15s)"; else GOT=$(awk '{ sub(/:$/, "", $4); print $4 }' <<<"$OUT"); fi
	echo "    deathstar: $OUT"
}

start_deathstar() {
	# One deathstar at a time: if an earlier check went wrong it may still be running.
	if [ -n "$ds_pid" ]; then
		kill "$ds_pid" 2>/dev/null || true
		wait "$ds_pid" 2>/dev/null || true
	fi
	ds_run=$((ds_run + 1))
	"$BIN/rampart" --socket "$sock" endpoint exec default/deathstar -- "$BIN/starwars" deathstar \
		--listen :80 --upload-timeout 3s \
		--storage "storage-secure=ftp://deathstar:$ftp_pass@$SECURE/deathstar-api.log" \
		--storage "storage-legacy=ftp://deathstar:$ftp_pass@$LEGACY/deathstar-api.log" \
		>"$work/deathstar.$ds_run.log" 2>&1 &
	ds_pid=$!
	# Wait from inside its own namespace, so that readiness probes are not flows.
	inep deathstar wait-tcp --timeout 10s 127.0.0.1:80
	# The start-up log (with the APIs it registered) is shipped at once.
	wait_upload "$ds_run" 0 storage-secure >/dev/null
	wait_upload "$ds_run" 0 storage-legacy >/dev/null
	echo "  deathstar started (run $ds_run)"
}

# deathstar_down: waits (up to 5 s) for the deathstar process to end. Sets GOT to
# "exited-N" (N: its exit status) or "running".
deathstar_down() {
	for _ in $(seq 1 50); do
		kill -0 "$ds_pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$ds_pid" 2>/dev/null; then
		GOT=running
	else
		local rc=0
		wait "$ds_pid" || rc=$?
		GOT="exited-$rc"
		ds_pid=""
	fi
	echo "    deathstar process: $GOT"
	sed 's/^/    | /' <(tail -n 2 "$work/deathstar.$ds_run.log")
}

flows() { # flows TITLE ARGS...: the flows that explain a step; sets FLOWS
	local title=$1; shift
	echo "  flows (rampart observe $*): $title"
	FLOWS=$(rampart observe "$@" 2>&1) || true
	sed 's/^/    /' <<<"$FLOWS"
}
# flow_shown ERE: whether a line of the last flows printed matches (sets GOT).
flow_shown() { if grep -q -E -- "$1" <<<"$FLOWS"; then GOT=shown; else GOT=missing; fi; }

show_manifest() {
	echo "  --- $1"
	grep -v '^#' "$1" | sed 's/^/  | /'
}

# ---- the galaxy ----------------------------------------------------------------------
echo "== starting the agent (instance $inst, node namespace $node, pod range 198.18.0.0/16)"
demo_agent_start
rampart status

echo
echo "== endpoints"
rampart endpoint add default/deathstar --labels org=empire,class=deathstar --port http=80/TCP
rampart endpoint add default/tiefighter --labels org=empire,class=tiefighter
rampart endpoint add default/xwing --labels org=alliance,class=xwing
rampart endpoint add default/storage-secure --labels app=storage,name=storage-secure,status=updated --port ftp=21/TCP
rampart endpoint add default/storage-legacy --labels app=storage,name=storage-legacy,status=maintenance --port ftp=21/TCP
rampart endpoint list

ip_of() { rampart endpoint get "default/$1" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ip"])'; }
DS=$(ip_of deathstar)
SECURE=$(ip_of storage-secure)
LEGACY=$(ip_of storage-legacy)
TIE=$(ip_of tiefighter)

echo
echo "== storage: two real FTP servers (pyftpdlib, examples/starwars/ftp-storage.py)"
mkdir -p "$work/storage-secure" "$work/storage-legacy"
"$BIN/rampart" --socket "$sock" endpoint exec default/storage-secure -- python3 examples/starwars/ftp-storage.py \
	--name storage-secure --root "$work/storage-secure" --user "deathstar:$ftp_pass" >"$work/storage-secure.log" 2>&1 &
bg_pids+=($!)
"$BIN/rampart" --socket "$sock" endpoint exec default/storage-legacy -- python3 examples/starwars/ftp-storage.py \
	--name storage-legacy --root "$work/storage-legacy" --user "deathstar:$ftp_pass" --anonymous-read >"$work/storage-legacy.log" 2>&1 &
bg_pids+=($!)
inep storage-secure wait-tcp --timeout 15s 127.0.0.1:21
inep storage-legacy wait-tcp --timeout 15s 127.0.0.1:21
echo "  storage-secure  $SECURE:21  status=updated      accounts: deathstar"
echo "  storage-legacy  $LEGACY:21  status=maintenance  accounts: deathstar, anonymous (read-only)"

# ---- step 1 --------------------------------------------------------------------------
echo
echo "== step 1: no policy. The rebels attack."
start_deathstar
ship xwing POST /v1/request-landing
check 1.xwing-lands "the xwing requests landing" "$GOT" 200
ship tiefighter GET /v1
if grep -q exhaust-port <<<"$OUT"; then GOT=listed; else GOT=hidden; fi
check 1.api-hides-exhaust-port "GET /v1 lists the public APIs only" "$GOT" hidden
echo "  The deathstar ships its API log to both storage servers; the legacy one lets anyone read."
ftp_read xwing "ftp://$LEGACY/deathstar-api.log"
grep exhaust-port <<<"$OUT" | sed 's/^/    leaked: /' || true
if [ "$GOT" = read ] && grep -q 'PUT /v1/exhaust-port' <<<"$OUT"; then GOT=leaked; else GOT="not-leaked($GOT)"; fi
check 1.legacy-leaks "anonymous read of the log on storage-legacy" "$GOT" leaked
ftp_read xwing "ftp://$SECURE/deathstar-api.log"
sed 's/^/    /' <<<"$OUT" | head -n 3
check 1.secure-refuses-anonymous "anonymous read of the log on storage-secure" "$GOT" failed
echo "  Armed with the leaked API, the xwing fires at the exhaust port."
ship xwing PUT /v1/exhaust-port
check 1.exhaust-port-hit "the xwing's PUT /v1/exhaust-port" "$GOT" "500|closed"
deathstar_down
check 1.deathstar-destroyed "the deathstar process" "$GOT" exited-2
ship tiefighter GET /v1
check 1.deathstar-unreachable "the tiefighter's GET /v1 after the attack" "$GOT" refused
flows "the xwing reached the deathstar and the deathstar reached both storage servers" --last 12 --endpoint default/deathstar
echo "  The Empire rebuilds the deathstar."
start_deathstar

# ---- step 2 --------------------------------------------------------------------------
echo
echo "== step 2: L3/L4 ingress. Only the Empire may reach the deathstar."
show_manifest examples/starwars/02-sw-l3-l4-policy.yaml
rampart apply -f examples/starwars/02-sw-l3-l4-policy.yaml
ship xwing POST /v1/request-landing 2s
check 2.xwing-refused "the xwing requests landing" "$GOT" timeout
ship tiefighter POST /v1/request-landing
check 2.tiefighter-lands "the tiefighter requests landing" "$GOT" 200
flows "rule1 selects the deathstar, so its ingress now admits only what a rule allows: the xwing's SYN matches no rule and is dropped by default deny (reason=policy-default-deny); the tiefighter's connection is allowed by rule1" --last 8 --endpoint default/deathstar --port 80
flow_shown "default/xwing .* -> default/deathstar .*:80 ingress DROPPED .*reason=policy-default-deny"
check 2.flow-xwing-dropped "a flow of the xwing dropped at the deathstar's ingress by default deny" "$GOT" shown
flow_shown "default/tiefighter .* -> default/deathstar .*:80 ingress FORWARDED rule=CiliumNetworkPolicy/default/rule1"
check 2.flow-tiefighter-allowed-by-rule1 "a flow of the tiefighter allowed by rule1" "$GOT" shown
echo "  But ports cannot tell API calls apart: a tiefighter (or a rebel who took one) can still fire."
ship tiefighter PUT /v1/exhaust-port
check 2.l4-cannot-stop-exhaust-port "the tiefighter's PUT /v1/exhaust-port" "$GOT" "500|closed"
deathstar_down
check 2.deathstar-destroyed-again "the deathstar process" "$GOT" exited-2
echo "  The Empire rebuilds the deathstar."
start_deathstar

# ---- step 3 --------------------------------------------------------------------------
echo
echo "== step 3: L3/L4 egress. The deathstar may ship its log only to storage with status=updated."
show_manifest examples/starwars/03-deathstar-egress.yaml
rampart apply -f examples/starwars/03-deathstar-egress.yaml
ship tiefighter POST /v1/request-landing
check 3.tiefighter-lands "the tiefighter requests landing" "$GOT" 200
n=$(sed -n 's/.*\[request #\([0-9]*\)\].*/\1/p' <<<"$OUT" | head -n 1)
n=${n:-1}
logline=$(grep -m 1 " #$n POST /v1/request-landing " "$work/deathstar.$ds_run.log" || true)
echo "  The deathstar logged: $logline"
wait_upload "$ds_run" "$n" storage-secure
check 3.upload-secure-ok "shipping the log to storage-secure" "$GOT" ok
wait_upload "$ds_run" "$n" storage-legacy
check 3.upload-legacy-fails "shipping the log to storage-legacy" "$GOT" failed
if [ -n "$logline" ] && grep -qF -- "$logline" "$work/storage-secure/deathstar-api.log"; then GOT=present; else GOT=absent; fi
check 3.secure-has-new-log "request #$n in the log stored on storage-secure" "$GOT" present
ftp_read xwing "ftp://$LEGACY/deathstar-api.log"
if [ "$GOT" != read ]; then
	GOT="unreadable($OUT)"
elif [ -n "$logline" ] && grep -qF -- "$logline" <<<"$OUT"; then
	GOT=leaked
else
	GOT=stale
fi
check 3.legacy-gets-nothing-new "request #$n in the log the rebels read from storage-legacy" "$GOT" stale
flows "deathstar-egress makes the deathstar's egress default deny: its connections to storage-legacy match no rule and are dropped (reason=policy-default-deny), to storage-secure (21 and a passive port) allowed by the policy" \
	--last 10 --endpoint default/deathstar --protocol tcp
flow_shown "default/deathstar .* -> default/storage-legacy .*:21 egress DROPPED .*reason=policy-default-deny"
check 3.flow-legacy-dropped "a flow of the deathstar dropped on its way to storage-legacy" "$GOT" shown
flow_shown "default/deathstar .* -> default/storage-secure .*:21 egress FORWARDED rule=CiliumNetworkPolicy/default/deathstar-egress"
check 3.flow-secure-allowed "a flow of the deathstar to storage-secure allowed by deathstar-egress" "$GOT" shown

# ---- step 4 --------------------------------------------------------------------------
echo
echo "== step 4: L7. Only GET /v1 and POST /v1/request-landing reach the deathstar."
show_manifest examples/starwars/04-sw-l3-l4-l7-policy.yaml
l7_ids=(4.get-v1-allowed 4.tiefighter-lands 4.source-address-kept 4.exhaust-port-denied
	4.exhaust-port-never-reaches-deathstar 4.deathstar-stays-up 4.xwing-still-refused 4.flow-exhaust-port-denied)
skip_reason=""
# L7 rules need the agent's L7 proxy (Envoy, which scripts/setup.sh installs). The agent
# refuses L7 policy it could not enforce; then the steps below are skipped, saying why,
# rather than pretended.
proxy_line=$(rampart status 2>&1 | grep -i -E '^[[:space:]]*L7 proxy:' || true)
if [ -z "$proxy_line" ]; then
	skip_reason="this build of rampart has no L7 proxy ('rampart status' reports none)"
elif ! apply_out=$(rampart apply -f examples/starwars/04-sw-l3-l4-l7-policy.yaml 2>&1); then
	echo "$apply_out" | sed 's/^/  | /'
	if grep -q 'rules.http' <<<"$apply_out" && grep -q 'not supported' <<<"$apply_out"; then
		skip_reason="this build of rampart does not support L7 (HTTP) rules: rampart apply refuses rules.http"
	elif grep -q 'L7 (HTTP) rules, but' <<<"$apply_out"; then
		skip_reason="the agent cannot run its L7 proxy here (is Envoy installed? scripts/setup.sh installs it): $(tail -n 1 <<<"$apply_out")"
	else
		check 4.apply "rampart apply -f 04-sw-l3-l4-l7-policy.yaml" failed ok
		skip_reason="the L7 policy could not be applied (see above)"
	fi
else
	echo "$apply_out"
	# The first L7 rule starts Envoy; until it runs with this configuration, connections
	# that need L7 checks are refused (fail closed). Wait for it, as a user would.
	for _ in $(seq 1 150); do
		proxy_line=$(rampart status 2>&1 | grep -i -E '^[[:space:]]*L7 proxy:' || true)
		grep -q 'running .* applied,' <<<"$proxy_line" && break
		sleep 0.1
	done
	echo "  $proxy_line"
fi
if [ -n "$skip_reason" ]; then
	for id in "${l7_ids[@]}"; do skip "$id" "$skip_reason"; done
else
	ship tiefighter GET /v1
	check 4.get-v1-allowed "the tiefighter's GET /v1" "$GOT" 200
	ship tiefighter POST /v1/request-landing
	check 4.tiefighter-lands "the tiefighter requests landing" "$GOT" 200
	# Through the proxy, the deathstar still sees the tiefighter's own address.
	n=$(sed -n 's/.*\[request #\([0-9]*\)\].*/\1/p' <<<"$OUT" | head -n 1)
	logline=$(grep -m 1 " #${n:-0} POST /v1/request-landing " "$work/deathstar.$ds_run.log" || true)
	echo "  The deathstar logged: $logline"
	if [ -z "$logline" ]; then GOT=not-logged; elif grep -qF " from $TIE " <<<"$logline"; then GOT=kept; else GOT=changed; fi
	check 4.source-address-kept "the client address the deathstar saw (the tiefighter is $TIE)" "$GOT" kept
	ship tiefighter PUT /v1/exhaust-port
	check 4.exhaust-port-denied "the tiefighter's PUT /v1/exhaust-port" "$GOT" 403
	if grep -q ' PUT /v1/exhaust-port from ' "$work/deathstar.$ds_run.log"; then GOT=reached; else GOT=never-reached; fi
	check 4.exhaust-port-never-reaches-deathstar "the PUT in the deathstar's own log" "$GOT" never-reached
	ship tiefighter GET /v1
	if [ "$GOT" = 200 ] && [ -n "$ds_pid" ] && kill -0 "$ds_pid" 2>/dev/null; then GOT=up; else GOT="down($GOT)"; fi
	check 4.deathstar-stays-up "the deathstar after the attempt" "$GOT" up
	ship xwing POST /v1/request-landing 2s
	check 4.xwing-still-refused "the xwing requests landing" "$GOT" timeout
	flows "each HTTP request with its L7 verdict" --last 6 --type l7
	flow_shown "PUT.*/v1/exhaust-port.*(403|DENIED|DROPPED|denied|dropped)"
	check 4.flow-exhaust-port-denied "an L7 flow of the PUT /v1/exhaust-port, denied" "$GOT" shown
	flows "the connections at L3/L4: the tiefighter's redirected to the proxy, which connects with the tiefighter's address; the xwing's dropped" --last 8 --type l3l4 --endpoint default/deathstar --port 80
fi

# ---- summary -------------------------------------------------------------------------
echo
echo "== summary"
n_ok=0 n_skip=0
for r in "${results[@]}"; do
	echo "  $r"
	case $r in ok*) n_ok=$((n_ok + 1)) ;; SKIP*) n_skip=$((n_skip + 1)) ;; esac
done
echo
if [ -n "$skip_reason" ]; then
	echo "demo-starwars: step 4 (L7) was NOT run: $skip_reason."
fi
if [ "$failures" -ne 0 ]; then
	echo "demo-starwars: $failures outcome(s) differ from the expected ones ($n_ok as expected, $n_skip skipped)"
	exit 1
fi
echo "demo-starwars: all $n_ok checked outcomes as expected ($n_skip skipped)"
