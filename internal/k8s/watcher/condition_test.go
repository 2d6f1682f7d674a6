package watcher

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/rampartnet/rampart/internal/agent"
)

// The Node's condition follows each sync (True only for a view applied whole; a failed
// sync is never shown as synced) beside the kubelet's conditions, and a pod whose
// identity is unresolved gets one Warning Event per node and message.
func TestSyncConditionAndUnresolvedEvents(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	client := fake.NewClientset(node)
	w := &Watcher{opts: Options{NodeName: "node-2"}, client: client, log: slog.New(slog.DiscardHandler),
		reported: map[string]string{}, unresolved: map[string]string{}}
	ctx := context.Background()
	cond := func() (ready, synced *corev1.NodeCondition) {
		t.Helper()
		n, err := client.CoreV1().Nodes().Get(ctx, "node-2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range n.Status.Conditions {
			switch c.Type {
			case corev1.NodeReady:
				ready = &n.Status.Conditions[i]
			case ConditionPolicySynced:
				synced = &n.Status.Conditions[i]
			}
		}
		return ready, synced
	}
	unresolved := agent.SyncResult{Unresolved: map[string]string{"nc/client-bad": "identity 300 of labels ... disagrees"}}
	for _, tc := range []struct {
		res            agent.SyncResult
		err            error
		status, reason string
	}{
		{agent.SyncResult{}, nil, "True", ReasonViewApplied},
		{agent.SyncResult{}, errors.New("endpoint nc/client-bad: no"), "False", ReasonSyncFailed},
		{unresolved, nil, "False", ReasonObjectsNotApplied},
		{agent.SyncResult{Refused: map[string]string{"k": "toFQDNs"}}, nil, "False", ReasonObjectsNotApplied},
		{agent.SyncResult{}, nil, "True", ReasonViewApplied},
	} {
		w.setCondition(ctx, syncCondition(agent.ClusterView{}, tc.res, tc.err))
		ready, synced := cond()
		if synced == nil || string(synced.Status) != tc.status || synced.Reason != tc.reason {
			t.Errorf("after a sync with %+v, %v: condition %+v, want %s %s", tc.res, tc.err, synced, tc.status, tc.reason)
		}
		if ready == nil || ready.Status != corev1.ConditionTrue {
			t.Errorf("the kubelet's Ready condition changed: %+v", ready)
		}
	}

	w.reportUnresolved(ctx, unresolved)
	w.reportUnresolved(ctx, unresolved) // the same again: no second Event
	evs, err := client.CoreV1().Events("nc").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 1 {
		t.Fatalf("%d events, want 1: %+v", len(evs.Items), evs.Items)
	}
	e := evs.Items[0]
	if e.Reason != "IdentityUnresolved" || e.Type != corev1.EventTypeWarning || e.InvolvedObject.Kind != "Pod" ||
		e.InvolvedObject.Name != "client-bad" || !strings.Contains(e.Message, "node-2") {
		t.Errorf("event %+v", e)
	}
}
