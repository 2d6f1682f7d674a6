#!/usr/bin/env bash
# The DVD rental store of the security-as-a-service paper (seeds/002, Fig. 1b) on one node:
# contract-update, user-update, user-create, dvd-update, shipping and dvd-return as real
# services (examples/dvdrental/cmd/dvdrental) in their own endpoints, with a real
# PostgreSQL and a real MQTT broker (mosquitto). It plays a rental and the paper's attacks
# under its monitor policies, checks every outcome and exits non-zero if one differs.
# Everything it creates (agent, namespaces, pins, processes, files) is removed at the end,
# also on failure or interruption. Needs root.
#
# --cluster: the same store and story on a two-node Kubernetes cluster (scripts/cluster.sh
# start --nodes 2 --dns, Rampart installed from its image): every part a pod of one image
# (scripts/build-dvd-image.sh, imported into the nodes), the manifests of
# examples/dvdrental/cluster/, the connection policy applied with kubectl, monitor pods
# running Suricata on the tap interfaces the CNI gives them, the tap policies applied in
# each node's agent pod, and every request, attack and check a kubectl exec in a pod
# (`dvdrental cluster`). The cluster is removed at the end, also on failure or
# interruption (exit 130). docs/taps.md, "The DVD rental demo".
#
# Environment (used by the tests; none is needed to run the demo by hand):
#   RAMPART_BIN=DIR       use the rampart, rampartd and dvdrental binaries in DIR (with
#                          --cluster: clusterctl and dvdrental)
#   DEMO_SKIP_SETUP=1      do not run scripts/setup.sh
#   DEMO_INSTANCE=NAME     agent instance name (default dvd<pid>); with --cluster, the
#                          cluster's state directory is /run/rampart-demo-NAME
#   DEMO_CLUSTER=1         the same as --cluster
set -euo pipefail
# -h, --help: print the comment above and exit (what the README's check of its commands runs).
case "${1:-}" in -h | --help) sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
# shellcheck source=lib/demo.sh
. "$(dirname "$0")/lib/demo.sh"
demo_setup "${DEMO_SKIP_SETUP:-}" "apt packages, Go modules"
if [ "${1:-}" = --cluster ] || [ "${DEMO_CLUSTER:-}" = 1 ]; then
	exec bash scripts/lib/dvdrental-cluster.sh
fi
demo_bin "bin/rampart, bin/rampartd, bin/dvdrental" ./cmd/rampart ./cmd/rampartd ./examples/dvdrental/cmd/dvdrental
for tool in mosquitto /usr/lib/postgresql/15/bin/postgres runuser nsenter; do
	command -v "$tool" >/dev/null || { echo "demo-dvdrental: $tool not found (scripts/setup.sh installs it)" >&2; exit 1; }
done

inst="${DEMO_INSTANCE:-dvd$$}"
work=$(mktemp -d /tmp/rampart-dvd.XXXXXX)
sock="$work/rampart.sock"
node="rp-$inst-node"
agent_pid=""
driver_pid=""

cleanup() {
	if [ -n "$driver_pid" ]; then kill "$driver_pid" 2>/dev/null; wait "$driver_pid" 2>/dev/null; fi
	demo_agent_stop
}
demo_traps cleanup demo-dvdrental

echo "== starting the agent (instance $inst, node namespace $node)"
demo_agent_start

# The driver runs in the background so that a TERM reaches this script's trap at once.
"$BIN/dvdrental" demo --socket "$sock" --work "$work" --examples examples/dvdrental &
driver_pid=$!
wait "$driver_pid"
