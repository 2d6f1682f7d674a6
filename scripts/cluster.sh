#!/usr/bin/env bash
# Starts or stops a Kubernetes control plane on this machine for people to use: etcd and
# kube-apiserver on 127.0.0.1 (free ports), Rampart's CRDs installed, state in
# $RAMPART_CLUSTER_DIR (default /run/rampart-cluster). Builds the binaries first if needed
# (scripts/build-k8s.sh). docs/cluster.md.
#
#   scripts/cluster.sh start    start; prints the kubeconfig path
#   scripts/cluster.sh stop     stop and remove the state directory
#   scripts/cluster.sh kubectl ARGS...   the built kubectl with the cluster's kubeconfig
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${RAMPART_CLUSTER_DIR:-/run/rampart-cluster}"
bin="$("$root/scripts/build-k8s.sh" --dir)"

case "${1:-}" in
start)
	if [ -f "$dir/kube-apiserver.pid" ]; then
		echo "cluster.sh: a control plane runs from $dir already (scripts/cluster.sh stop first)" >&2
		exit 1
	fi
	"$root/scripts/build-k8s.sh"
	rm -rf "$dir"
	(cd "$root" && go run ./test/cluster/clusterctl start -bin "$bin" -dir "$dir")
	;;
stop)
	if [ -d "$dir" ]; then
		(cd "$root" && go run ./test/cluster/clusterctl stop -dir "$dir")
		rm -rf "$dir"
	fi
	;;
kubectl)
	shift
	exec "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"
	;;
*)
	echo "usage: scripts/cluster.sh start|stop|kubectl ARGS..." >&2
	exit 2
	;;
esac
