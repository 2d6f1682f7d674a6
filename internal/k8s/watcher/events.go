package watcher

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/agent"
)

// reportRefused posts a Warning Event on each policy object the agent refused, once per
// resourceVersion, so that `kubectl describe` and `kubectl get events` show why it is not
// enforced. Posting is best effort: the refusal is in the agent's status and log anyway.
func (w *Watcher) reportRefused(ctx context.Context, v agent.ClusterView, res agent.SyncResult) {
	w.mu.Lock()
	var post []agent.PolicyObject
	var msgs []string
	for key, msg := range res.Refused {
		o := v.Objects[key]
		if w.reported[key] == o.ResourceVersion {
			continue
		}
		w.reported[key] = o.ResourceVersion
		post = append(post, o)
		msgs = append(msgs, msg)
	}
	for key := range w.reported {
		if _, ok := res.Refused[key]; !ok {
			delete(w.reported, key)
		}
	}
	w.mu.Unlock()
	for i, o := range post {
		ns := o.Namespace
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		apiVersion := "cilium.io/v2"
		if o.Kind == "NetworkPolicy" {
			apiVersion = "networking.k8s.io/v1"
		}
		now := metav1.NewTime(time.Now())
		ev := &corev1.Event{
			ObjectMeta: metav1.ObjectMeta{GenerateName: o.Name + ".", Namespace: ns},
			InvolvedObject: corev1.ObjectReference{APIVersion: apiVersion, Kind: o.Kind, Namespace: o.Namespace,
				Name: o.Name, ResourceVersion: o.ResourceVersion},
			Reason:         "PolicyRefused",
			Message:        truncate(msgs[i], 1024),
			Type:           corev1.EventTypeWarning,
			Source:         corev1.EventSource{Component: "rampartd", Host: w.opts.NodeName},
			FirstTimestamp: now,
			LastTimestamp:  now,
			Count:          1,
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := w.client.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{})
		cancel()
		if err != nil {
			w.log.Warn("posting an event on a refused policy", "object", o.Kind+" "+o.Namespace+"/"+o.Name, "error", err)
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
