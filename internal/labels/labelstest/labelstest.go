// Package labelstest builds the label sets and selectors tests of policy state work with.
package labelstest

import (
	"testing"

	"github.com/rampartnet/rampart/internal/labels"
)

// Full is an endpoint's full label set as the agent builds it (docs/architecture.md):
// its namespace's, the cluster's, and the key, value pairs kv.
func Full(ns string, kv ...string) labels.Labels {
	l := labels.Labels{
		labels.KeyNamespace: ns,
		labels.KeyNamespaceLabelPrefix + labels.KeyNamespaceName: ns,
		labels.KeyCluster: "default",
	}
	for i := 0; i+1 < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return l
}

// Match is the selector requiring each of the key, value pairs kv.
func Match(t testing.TB, kv ...string) labels.Selector {
	t.Helper()
	var s labels.Selector
	for i := 0; i+1 < len(kv); i += 2 {
		r, err := labels.NewRequirement(kv[i], "In", []string{kv[i+1]})
		if err != nil {
			t.Fatal(err)
		}
		s = s.With(r)
	}
	return s
}
