#!/usr/bin/env bash
# scripts/demo-dvdrental.sh --cluster (see there): the DVD rental store on a two-node
# cluster. Run from the repository's root by demo-dvdrental.sh, after its setup.
set -euo pipefail
# shellcheck source=demo.sh
. "$(dirname "$0")/demo.sh"
echo "== Kubernetes' binaries, containerd, runc, CoreDNS (scripts/build-k8s.sh, build-cri.sh, build-node.sh, build-coredns.sh: cached)"
bash scripts/build-k8s.sh >/dev/null
bash scripts/build-cri.sh >/dev/null
bash scripts/build-node.sh >/dev/null
bash scripts/build-coredns.sh >/dev/null
echo "== the store's image (scripts/build-dvd-image.sh: PostgreSQL 15, mosquitto, Suricata 7, dvdrental)"
image="$(bash scripts/build-dvd-image.sh)"
echo "   $image ($(du -m "$image" | cut -f1) MB)"
demo_bin "bin/clusterctl and bin/dvdrental" ./test/cluster/clusterctl ./examples/dvdrental/cmd/dvdrental
export RAMPART_BIN=$BIN
name="${DEMO_INSTANCE:-dvd$$}"
work=$(mktemp -d /tmp/rampart-dvd-cluster.XXXXXX)
export RAMPART_CLUSTER_DIR="/run/rampart-demo-$name"
kubectl() { bash scripts/cluster.sh kubectl "$@"; }

demo_traps demo_cluster_stop demo-dvdrental

echo
echo "== starting a two-node cluster with CoreDNS, Rampart installed from its image, the store's image imported (state and logs in $RAMPART_CLUSTER_DIR)"
start=$SECONDS
bash scripts/cluster.sh start --nodes 2 --dns --image "$image" >/dev/null
echo "   ready in $((SECONDS - start)) s"

echo
echo "== the store (examples/dvdrental/cluster/store.yaml) and its monitors (monitors.yaml)"
start=$SECONDS
kubectl apply -f examples/dvdrental/cluster/store.yaml -f examples/dvdrental/cluster/monitors.yaml
for ns in dvd customers; do
	kubectl wait --for=condition=Ready pods --all -n "$ns" --timeout=120s >/dev/null
done
echo "   every pod ready in $((SECONDS - start)) s"

start=$SECONDS
"$BIN/dvdrental" cluster --kubeconfig "$RAMPART_CLUSTER_DIR/kubeconfig" \
	--kubectl "$(bash scripts/build-k8s.sh --dir)/kubectl" --examples examples/dvdrental
echo "   the story played in $((SECONDS - start)) s"
