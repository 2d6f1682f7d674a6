#!/usr/bin/env bash
# Starts or stops a Kubernetes cluster on this machine for people: etcd and kube-apiserver,
# kube-scheduler and kube-controller-manager, and N real nodes (network namespaces on a
# bridged fabric, 198.19.254.0/24 in lab slot 0), each running containerd, kubelet and kube-proxy, with
# Rampart installed on them as users install it: `kubectl apply -R -f deploy/`, its image
# built from this tree (scripts/build-image.sh) and imported into every node. The same
# cluster the real-node tests start (internal/testenv/nodetest), held in the background by
# a process of test/cluster/clusterctl until `stop`. State and logs in
# $RAMPART_CLUSTER_DIR (default /run/rampart-cluster; clusterctl.log says what happened).
# Builds what it needs first (cached by version: a few minutes the first time, about ten
# for the control plane). The cluster takes one of the host's four lab slots, as a
# real-node test's cluster does; one cluster per state directory. Needs root.
# docs/cluster.md, "Starting a cluster here".
#
#   scripts/cluster.sh start [--nodes N] [--tunnel native|vxlan|ipip] [--dns] [--image ARCHIVE]...
#                                       start (2 nodes by default; --nodes 0: the control
#                                       plane alone); prints the kubeconfig path last;
#                                       --image: another image archive imported into every
#                                       node (scripts/build-dvd-image.sh's, say)
#   scripts/cluster.sh stop             stop everything and remove the state directory
#   scripts/cluster.sh kubectl ARGS...  the built kubectl with the cluster's kubeconfig
#   scripts/cluster.sh rampart NODE ARGS...   the rampart CLI in NODE's agent pod (node-1, ...)
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set /s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(realpath -m "${RAMPART_CLUSTER_DIR:-/run/rampart-cluster}")"
export PATH="$PATH:/usr/local/go/bin"

kubectl() { "$("$root/scripts/build-k8s.sh" --dir)/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
clusterctl() { # RAMPART_BIN's build if it has one (the demo's), else built from this tree
	if [ -n "${RAMPART_BIN:-}" ] && [ -x "$RAMPART_BIN/clusterctl" ]; then
		(cd "$root" && "$RAMPART_BIN/clusterctl" "$@")
	else
		mkdir -p "$root/bin"
		(cd "$root" && go build -o bin/clusterctl ./test/cluster/clusterctl)
		# From the repository: the cluster's holder finds the build scripts' caches there.
		(cd "$root" && "$root/bin/clusterctl" "$@")
	fi
}

case "${1:-}" in
start)
	shift
	nodes=2 tunnel="" dns=() extra=()
	while [ $# -gt 0 ]; do
		case "$1" in
		--nodes) nodes="$2"; shift 2 ;;
		--nodes=*) nodes="${1#*=}"; shift ;;
		--tunnel) tunnel="$2"; shift 2 ;;
		--tunnel=*) tunnel="${1#*=}"; shift ;;
		--dns) dns=(-dns); shift ;;
		--image) extra+=(-extra-image "$(realpath "$2")"); shift 2 ;;
		--image=*) extra+=(-extra-image "$(realpath "${1#*=}")"); shift ;;
		*) echo "cluster.sh start: unknown argument $1" >&2; exit 2 ;;
		esac
	done
	if [ -f "$dir/cluster.json" ]; then
		echo "cluster.sh: a cluster runs from $dir already (scripts/cluster.sh stop first)" >&2
		exit 1
	fi
	"$root/scripts/build-k8s.sh" >&2
	image=""
	if [ "$nodes" != 0 ]; then
		"$root/scripts/build-cri.sh" >&2
		"$root/scripts/build-node.sh" >&2
		if [ ${#dns[@]} -gt 0 ]; then "$root/scripts/build-coredns.sh" >&2; fi
		echo "cluster.sh: Rampart's image (scripts/build-image.sh)" >&2
		image="$("$root/scripts/build-image.sh")"
	fi
	rm -rf "$dir"
	clusterctl start -dir "$dir" -nodes "$nodes" -tunnel "$tunnel" -image "$image" "${dns[@]}" "${extra[@]}"
	;;
stop)
	if [ -d "$dir" ]; then
		clusterctl stop -dir "$dir"
		rm -rf "$dir"
	fi
	;;
kubectl)
	shift
	kubectl "$@"
	;;
rampart)
	if [ $# -lt 2 ]; then
		echo "usage: scripts/cluster.sh rampart NODE ARGS..." >&2
		exit 2
	fi
	node="$2"
	shift 2
	pod="$(kubectl -n kube-system get pods -l app.kubernetes.io/name=rampart --field-selector "spec.nodeName=$node" -o name)"
	if [ -z "$pod" ]; then
		echo "cluster.sh: no Rampart agent pod on node $node" >&2
		exit 1
	fi
	kubectl -n kube-system exec "$pod" -c rampartd -- /usr/local/bin/rampart "$@"
	;;
*)
	echo "usage: scripts/cluster.sh start [--nodes N] [--tunnel native|vxlan|ipip] [--dns] [--image ARCHIVE]... | stop | kubectl ARGS... | rampart NODE ARGS..." >&2
	exit 2
	;;
esac
