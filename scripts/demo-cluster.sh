#!/usr/bin/env bash
# The cluster demo: the digital marketplace of examples/marketplace/ on a two-node
# Kubernetes cluster (scripts/cluster.sh: the API server, scheduler and controller manager;
# containerd, kubelet and kube-proxy on each node), with Rampart installed from its image
# by `kubectl apply -R -f deploy/` and VXLAN between the nodes. Organisations A, B and C
# are namespaces with one pod on each node (agnhost); with no policy and then in each
# sharing scenario, applied with kubectl, it probes every ordered pod pair (30: same node
# and across nodes, each a kubectl exec in the source pod) and compares the matrix with
# examples/marketplace/expected.txt; it traces one denied cross-node pair in both nodes'
# agent pods and shows flows naming the pods of the other node. Exits non-zero if any pair
# differs from the table, 130 when interrupted. The cluster (processes, namespaces, links,
# mounts, cgroups) is removed at the end, also on failure or interruption. Needs root.
# docs/cluster.md, "The marketplace demo".
#
# Environment (used by test/demo; none is needed to run the demo by hand):
#   RAMPART_BIN=DIR     use the clusterctl and marketplace binaries in DIR instead of
#                       building them into bin/
#   DEMO_SKIP_SETUP=1   do not run scripts/setup.sh
#   DEMO_INSTANCE=NAME  the cluster's state directory is /run/rampart-demo-NAME (default
#                       mkt<pid>)
#   DEMO_TUNNEL=MODE    deploy/'s tunnel between the nodes (default vxlan; ipip, native)
set -euo pipefail
# -h, --help: print the comment above and exit (what the README's check of its commands runs).
case "${1:-}" in -h | --help) sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
# shellcheck source=lib/demo.sh
. "$(dirname "$0")/lib/demo.sh"
demo_setup "${DEMO_SKIP_SETUP:-}" "apt packages, Envoy, Go modules"
echo "== Kubernetes' binaries, containerd and runc (scripts/build-k8s.sh, build-cri.sh, build-node.sh: about 20 minutes the first time, cached)"
bash scripts/build-k8s.sh >/dev/null
bash scripts/build-cri.sh >/dev/null
bash scripts/build-node.sh >/dev/null
demo_bin "bin/clusterctl and bin/marketplace" ./test/cluster/clusterctl ./examples/marketplace/cmd/marketplace
export RAMPART_BIN=$BIN
agnhost=$(cat "$(bash scripts/build-node.sh --dir)/agnhost.ref")

name="${DEMO_INSTANCE:-mkt$$}"
tunnel="${DEMO_TUNNEL:-vxlan}"
work=$(mktemp -d /tmp/rampart-demo-cluster.XXXXXX)
export RAMPART_CLUSTER_DIR="/run/rampart-demo-$name"
ex=examples/marketplace

kubectl() { bash scripts/cluster.sh kubectl "$@"; }
rampart() { bash scripts/cluster.sh rampart "$@"; }
marketplace() { "$BIN/marketplace" "$1" -kubeconfig "$RAMPART_CLUSTER_DIR/kubeconfig" -kubectl "$(bash scripts/build-k8s.sh --dir)/kubectl" "${@:2}"; }

demo_traps demo_cluster_stop demo-cluster

echo
echo "== starting a two-node cluster and installing Rampart from its image (kubectl apply -R -f deploy/, tunnel $tunnel; state and logs in $RAMPART_CLUSTER_DIR)"
bash scripts/cluster.sh start --nodes 2 --tunnel "$tunnel" >/dev/null
kubectl get nodes -o wide
kubectl -n kube-system get pods -l app.kubernetes.io/name=rampart -o wide

echo
echo "== the organisations (namespaces org-a, org-b, org-c) and a pod of each on each node"
kubectl apply -f "$ex/00-organisations.yaml"
marketplace pods -image "$agnhost" | kubectl apply -f -
for ns in org-a org-b org-c; do
	kubectl wait --for=condition=Ready pods --all -n "$ns" --timeout=90s >/dev/null
done
kubectl get pods -A -l id.pod -L id.pod -o wide
rampart node-1 remote list

failures=0
# check NAME: probe every pair until the matrix is scenario NAME's or 30 s have passed.
check() {
	if ! marketplace check -expected "$ex/expected.txt" -scenario "$1" -timeout 30s; then
		failures=$((failures + 1))
	fi
}

echo
echo "== no policy: every organisation reaches every other"
check none

prev=""
for f in "$ex"/0[1-9]-scenario-*.yaml; do
	scenario=$(basename "$f" .yaml)
	scenario=${scenario#*-scenario-}
	echo
	echo "== scenario $scenario ($f)"
	grep '^#' "$f" | sed 's/^# \{0,1\}/   /'
	if [ -n "$prev" ]; then
		kubectl delete -f "$prev" --wait
	fi
	kubectl apply -f "$f"
	check "$scenario"
	if [ "$scenario" = b-to-a ]; then
		echo
		echo "== why is a pod of the other node denied? (the policy trace on each node, the destination's flows)"
		marketplace explain -expected "$ex/expected.txt" -scenario "$scenario"
	fi
	prev=$f
done

echo
if [ "$failures" -ne 0 ]; then
	echo "demo-cluster: $failures scenario(s) differ from $ex/expected.txt"
	exit 1
fi
echo "demo-cluster: every pair of every scenario as expected"
