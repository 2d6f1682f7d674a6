package watcher

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/agent"
)

// ConditionPolicySynced is the type of the condition the agent keeps on its Node, as a
// CNI keeps NetworkUnavailable: True when the node applied the whole view of the cluster,
// False when it could not apply it at all (reason SyncFailed: the dataplane enforces the
// last view applied) or applied it without some objects (reason ObjectsNotApplied:
// refused policies, pods and nodes left out, pods whose identity is unresolved, each in
// `rampart status` and an Event on the object).
const ConditionPolicySynced corev1.NodeConditionType = "RampartPolicySynced"

// Reasons of ConditionPolicySynced.
const (
	ReasonViewApplied       = "ViewApplied"
	ReasonObjectsNotApplied = "ObjectsNotApplied"
	ReasonSyncFailed        = "SyncFailed"
)

// syncCondition is the condition a sync of view v leaves: res and err are what the agent
// answered (err may be the view's own).
func syncCondition(v agent.ClusterView, res agent.SyncResult, err error) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: ConditionPolicySynced, Status: corev1.ConditionTrue, Reason: ReasonViewApplied,
		Message: "the node applied the whole view of the cluster"}
	switch {
	case err != nil:
		c.Status, c.Reason = corev1.ConditionFalse, ReasonSyncFailed
		c.Message = truncate("the view of the cluster cannot be applied; the dataplane enforces the last one applied: "+err.Error(), 1024)
	case !res.Clean() || len(v.Problems) > 0:
		c.Status, c.Reason = corev1.ConditionFalse, ReasonObjectsNotApplied
		var parts []string
		if n := len(res.Refused); n > 0 {
			parts = append(parts, fmt.Sprintf("%d policy objects refused", n))
		}
		if n := len(res.Problems) + len(v.Problems); n > 0 {
			parts = append(parts, fmt.Sprintf("%d objects left out", n))
		}
		if n := len(res.Unresolved); n > 0 {
			parts = append(parts, fmt.Sprintf("%d pods with an unresolved identity (denied or left out)", n))
		}
		c.Message = "the node applied the view without " + strings.Join(parts, ", ") + "; see rampart status and the objects' Events"
	}
	return c
}

// setCondition writes c on this node's Node unless it is what was written last. Best
// effort: a failure is logged and the next sync writes it again.
func (w *Watcher) setCondition(ctx context.Context, c corev1.NodeCondition) {
	w.mu.Lock()
	last := w.condition
	w.mu.Unlock()
	if last != nil && last.Status == c.Status && last.Reason == c.Reason && last.Message == c.Message {
		return
	}
	now := metav1.NewTime(time.Now())
	c.LastHeartbeatTime = now
	c.LastTransitionTime = now
	if last != nil && last.Status == c.Status {
		c.LastTransitionTime = last.LastTransitionTime
	}
	// Conditions merge by type (strategic merge patch): the kubelet's stay.
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{c}}})
	if err != nil {
		w.log.Warn("node condition", "error", err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := w.client.CoreV1().Nodes().PatchStatus(ctx, w.opts.NodeName, patch); err != nil {
		w.log.Warn("writing the node's condition", "condition", string(c.Type), "error", err)
		return
	}
	w.mu.Lock()
	w.condition = &c
	w.mu.Unlock()
}
