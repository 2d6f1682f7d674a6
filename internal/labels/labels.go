package labels

import (
	"fmt"
	"sort"
	"strings"
)

// Well-known label keys. Every endpoint's full label set (what identities are made of and
// what selectors are matched against) carries its own labels plus these, so that Kubernetes
// namespace scoping and Cilium's special selector keys become plain label matching.
const (
	// KeyNamespace holds the endpoint's namespace name (Cilium: io.kubernetes.pod.namespace).
	KeyNamespace = "io.kubernetes.pod.namespace"
	// KeyNamespaceLabelPrefix + k holds the value of the namespace's label k.
	KeyNamespaceLabelPrefix = "io.cilium.k8s.namespace.labels."
	// KeyServiceAccount holds the endpoint's service account, when it has one.
	KeyServiceAccount = "io.cilium.k8s.policy.serviceaccount"
	// KeyCluster holds the cluster name (clustermesh selectors).
	KeyCluster = "io.cilium.k8s.policy.cluster"
	// KeyNamespaceName is the label Kubernetes puts on every namespace.
	KeyNamespaceName = "kubernetes.io/metadata.name"
)

// Labels is a set of key=value labels. Keys are stored without the "k8s:" or "any:"
// source prefix.
type Labels map[string]string

// String renders labels sorted, as k=v,k=v.
func (l Labels) String() string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(l[k])
	}
	return b.String()
}

// Equal reports whether two label sets are the same.
func (l Labels) Equal(o Labels) bool {
	if len(l) != len(o) {
		return false
	}
	for k, v := range l {
		if ov, ok := o[k]; !ok || ov != v {
			return false
		}
	}
	return true
}

// Parse reads "k=v,k2=v2" (as given on the command line). An empty string is no labels.
func Parse(s string) (Labels, error) {
	out := Labels{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q: want key=value", Shorten(part))
		}
		k = NormalizeKey(k)
		if err := ValidateKey(k); err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// NormalizeKey strips the Cilium source prefixes that mean "a Kubernetes label" or "any
// source" ("k8s:", "any:"). Other prefixes (e.g. "reserved:") are kept.
func NormalizeKey(k string) string {
	for _, p := range []string{"k8s:", "any:"} {
		if strings.HasPrefix(k, p) {
			return k[len(p):]
		}
	}
	return k
}

// maxKeyLen is the longest key of a full label set: a Kubernetes key (253 + '/' + 63) under
// KeyNamespaceLabelPrefix, which is how namespace labels are carried.
var maxKeyLen = len(KeyNamespaceLabelPrefix) + maxKeyPrefixLen + 1 + maxNameLen

// ValidateKey checks a (normalised) label key: what the label set representation needs
// (non-empty, bounded, no separators). Manifests are checked more strictly with
// ValidateQualifiedKey.
func ValidateKey(k string) error {
	if k == "" {
		return fmt.Errorf("empty label key")
	}
	if len(k) > maxKeyLen || strings.ContainsAny(k, " \t\n,=") {
		return fmt.Errorf("invalid label key %q", Shorten(k))
	}
	return nil
}
