package watcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/agent"
)

// reportRefused posts a Warning Event on each policy object (and tap contract) the agent refused, once per
// resourceVersion, so that `kubectl describe` and `kubectl get events` show why it is not
// enforced. Every node refuses the same object for the same reason (one parser), so the
// Event's name is derived from the object's version: the first node to post creates it and
// the others find it there, and users see one Event per refusal, not one per node. Posting
// is best effort: the refusal is in the agent's status and log anyway.
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
		w.postWarning(ctx, refusedEventName(o), ns, corev1.ObjectReference{APIVersion: apiVersionOf(o.Kind), Kind: o.Kind,
			Namespace: o.Namespace, Name: o.Name, ResourceVersion: o.ResourceVersion}, "PolicyRefused", msgs[i])
	}
}

// postWarning posts a Warning Event of this node's agent named name in namespace ns on
// object obj; one of that name posted already (by another node) is no error. Best
// effort: a failure is logged.
func (w *Watcher) postWarning(ctx context.Context, name, ns string, obj corev1.ObjectReference, reason, msg string) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: ns},
		InvolvedObject: obj,
		Reason:         reason,
		Message:        truncate(msg, 1024),
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "rampartd", Host: w.opts.NodeName},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := w.client.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		w.log.Warn("posting an event", "reason", reason, "object", obj.Kind+" "+obj.Namespace+"/"+obj.Name, "error", err)
	}
}

// refusedEventName names the Event on the refusal of o at its resourceVersion: the
// object's name (cut so the whole stays a valid name) and a hash of kind, namespace, name
// and version.
func refusedEventName(o agent.PolicyObject) string {
	sum := sha256.Sum256([]byte(o.Kind + "/" + o.Namespace + "/" + o.Name + "@" + o.ResourceVersion))
	name := o.Name
	if len(name) > 200 {
		name = name[:200]
	}
	return name + ".refused-" + hex.EncodeToString(sum[:8])
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// reportUnresolved posts a Warning Event (IdentityUnresolved) on each pod whose identity
// the agent could not resolve, once per message: on its own node the pod is denied all
// traffic, on the others it is left out, so each node posts its own (the name holds the
// node). Best effort, as reportRefused.
func (w *Watcher) reportUnresolved(ctx context.Context, res agent.SyncResult) {
	w.mu.Lock()
	post := map[string]string{}
	for key, msg := range res.Unresolved {
		if w.unresolved[key] != msg {
			w.unresolved[key] = msg
			post[key] = msg
		}
	}
	for key := range w.unresolved {
		if _, ok := res.Unresolved[key]; !ok {
			delete(w.unresolved, key)
		}
	}
	w.mu.Unlock()
	for key, msg := range post {
		ns, name, _ := strings.Cut(key, "/")
		sum := sha256.Sum256([]byte(key + "@" + w.opts.NodeName + ":" + msg))
		evName := name
		if len(evName) > 200 {
			evName = evName[:200]
		}
		w.postWarning(ctx, evName+".unresolved-"+hex.EncodeToString(sum[:8]), ns,
			corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: ns, Name: name}, "IdentityUnresolved", "node "+w.opts.NodeName+": "+msg)
	}
}
