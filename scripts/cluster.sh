#!/usr/bin/env bash
# Starts or stops a simulated Kubernetes cluster on this machine for people: etcd and
# kube-apiserver on 127.0.0.1 (free ports), Rampart's CRDs installed, and with
# --nodes N, N nodes: network namespaces joined by a bridged fabric (198.19.254.0/24), each
# with its own rampartd in Kubernetes mode and rampart-podrunner, running in the background.
# State and logs in $RAMPART_CLUSTER_DIR (default /run/rampart-cluster). Builds what it
# needs first (scripts/build-k8s.sh; the Rampart binaries into bin/ unless RAMPART_BIN
# names a directory holding them, and clusterctl too if it is there). Needs root.
# docs/cluster.md, "Starting a cluster here".
#
#   scripts/cluster.sh start [--nodes N] [--tunnel native|vxlan|ipip] [--name NAME]
#                                       start; prints the kubeconfig path last
#   scripts/cluster.sh stop             stop everything and remove the state directory
#   scripts/cluster.sh kubectl ARGS...  the built kubectl with the cluster's kubeconfig
#   scripts/cluster.sh rampart NODE ARGS...   the rampart CLI against NODE's agent (node-1, ...)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${RAMPART_CLUSTER_DIR:-/run/rampart-cluster}"
bin="$("$root/scripts/build-k8s.sh" --dir)"
export PATH="$PATH:/usr/local/go/bin"

clusterctl() { # RAMPART_BIN's build if it has one (the demo's), else built from this tree
	if [ -n "${RAMPART_BIN:-}" ] && [ -x "$RAMPART_BIN/clusterctl" ]; then
		"$RAMPART_BIN/clusterctl" "$@"
	else
		(cd "$root" && go run ./test/cluster/clusterctl "$@")
	fi
}
bin_dir() { # the Rampart binaries the running cluster uses
	python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["binDir"])' "$dir/cluster.json"
}

case "${1:-}" in
start)
	shift
	nodes=0 tunnel="" name=""
	while [ $# -gt 0 ]; do
		case "$1" in
		--nodes) nodes="$2"; shift 2 ;;
		--nodes=*) nodes="${1#*=}"; shift ;;
		--tunnel) tunnel="$2"; shift 2 ;;
		--tunnel=*) tunnel="${1#*=}"; shift ;;
		--name) name="$2"; shift 2 ;;
		--name=*) name="${1#*=}"; shift ;;
		*) echo "cluster.sh start: unknown argument $1" >&2; exit 2 ;;
		esac
	done
	if [ -f "$dir/kube-apiserver.pid" ] || [ -f "$dir/cluster.json" ]; then
		echo "cluster.sh: a cluster runs from $dir already (scripts/cluster.sh stop first)" >&2
		exit 1
	fi
	"$root/scripts/build-k8s.sh"
	rbin=""
	if [ "$nodes" != 0 ]; then
		if [ -n "${RAMPART_BIN:-}" ]; then
			rbin=$(cd "$RAMPART_BIN" && pwd)
		else
			echo "cluster.sh: building bin/rampartd, bin/rampart, bin/rampart-cni, bin/rampart-podrunner" >&2
			(cd "$root" && go build -o bin/ ./cmd/... ./test/rampart-testserver)
			rbin="$root/bin"
		fi
	fi
	rm -rf "$dir"
	clusterctl start -bin "$bin" -dir "$dir" -nodes "$nodes" -tunnel "$tunnel" -name "$name" -rampart-bin "$rbin"
	;;
stop)
	if [ -d "$dir" ]; then
		clusterctl stop -dir "$dir"
		rm -rf "$dir"
	fi
	;;
kubectl)
	shift
	exec "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"
	;;
rampart)
	if [ $# -lt 2 ]; then
		echo "usage: scripts/cluster.sh rampart NODE ARGS..." >&2
		exit 2
	fi
	node="$2"
	shift 2
	if [ ! -S "$dir/nodes/$node/rampart.sock" ]; then
		echo "cluster.sh: no agent socket for node $node in $dir/nodes" >&2
		exit 1
	fi
	exec "$(bin_dir)/rampart" --socket "$dir/nodes/$node/rampart.sock" "$@"
	;;
*)
	echo "usage: scripts/cluster.sh start [--nodes N] [--tunnel native|vxlan|ipip] [--name NAME] | stop | kubectl ARGS... | rampart NODE ARGS..." >&2
	exit 2
	;;
esac
