package watcher

import (
	"context"
	"encoding/json"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	"github.com/rampartnet/rampart/internal/agent"
)

// publishAck writes, after view v was applied, this node's part of the address quarantine
// on its Node object (the agent's quarantine.go): the acknowledgement its quarantined
// addresses wait for from the others (agent.PodsWantAnnotation), and its own
// acknowledgement (agent.PodsAckAnnotation: v.PodsRV, which the applied view reflects).
// The acknowledgement is written when the Node has none yet and when another node waits
// for more than the one written, not on every pod event: the Node writes cost every node
// a sync. A failed write is logged; the next sync writes again (the quarantine only
// waits longer).
func (w *Watcher) publishAck(ctx context.Context, v agent.ClusterView, res agent.SyncResult) {
	c := w.cur.Load()
	own, err := c.nodes.Get(w.opts.NodeName)
	if err != nil {
		return
	}
	ann := map[string]any{}
	if want := own.Annotations[agent.PodsWantAnnotation]; want != res.WantAck {
		if res.WantAck == "" {
			ann[agent.PodsWantAnnotation] = nil // a merge patch's null removes it
		} else {
			ann[agent.PodsWantAnnotation] = res.WantAck
		}
	}
	if ack, written := v.PodsRV, own.Annotations[agent.PodsAckAnnotation]; ack != "" && ack != written {
		publish := written == "" || !rvBefore(ack, written) && w.othersWant(written)
		if publish {
			ann[agent.PodsAckAnnotation] = ack
		}
	}
	if len(ann) == 0 {
		return
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := w.client.CoreV1().Nodes().Patch(pctx, w.opts.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		w.log.Warn("publishing the pods acknowledgement on this node's Node", "error", err)
	}
}

// othersWant says whether another Node's quarantine waits for an acknowledgement past
// written.
func (w *Watcher) othersWant(written string) bool {
	nodes, err := w.cur.Load().nodes.List(k8slabels.Everything())
	if err != nil {
		return true
	}
	for _, n := range nodes {
		if n.Name == w.opts.NodeName {
			continue
		}
		if want := n.Annotations[agent.PodsWantAnnotation]; want != "" && rvBefore(written, want) {
			return true
		}
	}
	return false
}

// rvBefore says whether resourceVersion a is before b; malformed ones are before
// everything.
func rvBefore(a, b string) bool {
	cmp, err := resourceversion.CompareResourceVersion(a, b)
	return err != nil || cmp < 0
}
