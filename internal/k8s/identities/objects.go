package identities

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
)

// Group and Version of both kinds.
const (
	Group   = "rampart.io"
	Version = "v1alpha1"
)

var (
	// IdentityResource is the SecurityIdentity resource: one object per label set.
	IdentityResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "securityidentities"}
	// ClaimResource is the SecurityIdentityClaim resource: one object per number taken.
	ClaimResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "securityidentityclaims"}
)

// UnusedSinceAnnotation marks a SecurityIdentity that the collector found unused, with the
// time (RFC 3339, with nanoseconds) it first did. Allocate and the collector remove it when the identity is in
// use again; the collector deletes the identity when the mark is older than its grace.
const UnusedSinceAnnotation = "rampart.io/unused-since"

// lastEndpoint is the last number of the endpoint range: numbers fit the 24-bit VNI.
const lastEndpoint = identity.FirstCIDR - 1

// SetName returns the name of the SecurityIdentity of the label set with key
// identity.LabelsKey: the first 128 bits of its SHA-256 in hex. A name collision would be
// found (the object holds the full set) and refused, never merged.
func SetName(labelsKey string) string {
	sum := sha256.Sum256([]byte(labelsKey))
	return hex.EncodeToString(sum[:16])
}

// ClaimName returns the name of the claim of number id.
func ClaimName(id identity.Identity) string { return strconv.FormatUint(uint64(id), 10) }

// setObj is a parsed SecurityIdentity.
type setObj struct {
	name, uid, rv string
	key           string // identity.LabelsKey(labels)
	labels        labels.Labels
	id            identity.Identity
	unusedSince   time.Time // zero: not marked
	marked        bool      // the annotation is present (even if unparsable)
}

// claimObj is a parsed SecurityIdentityClaim.
type claimObj struct {
	name, uid, rv string
	id            identity.Identity
	setName       string
	setUID        string
}

// parseSet reads a SecurityIdentity. It refuses what Allocate would not have written: a
// number outside the endpoint range, labels that are not strings, a name that is not the
// set's SetName.
func parseSet(u *unstructured.Unstructured) (*setObj, error) {
	s := &setObj{name: u.GetName(), uid: string(u.GetUID()), rv: u.GetResourceVersion()}
	spec, ok := u.Object["spec"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("SecurityIdentity %s: no spec", s.name)
	}
	id, err := number(spec["identity"])
	if err != nil {
		return nil, fmt.Errorf("SecurityIdentity %s: spec.identity: %w", s.name, err)
	}
	s.id = id
	raw, ok := spec["labels"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("SecurityIdentity %s: spec.labels is not a map", s.name)
	}
	s.labels = make(labels.Labels, len(raw))
	for k, v := range raw {
		str, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("SecurityIdentity %s: label %q is not a string", s.name, k)
		}
		s.labels[k] = str
	}
	s.key = identity.LabelsKey(s.labels)
	if want := SetName(s.key); s.name != want {
		return nil, fmt.Errorf("SecurityIdentity %s: its labels %s make the name %s", s.name, s.labels, want)
	}
	if v, ok := u.GetAnnotations()[UnusedSinceAnnotation]; ok {
		s.marked = true
		// An unparsable mark counts as made now: the collector rewrites it, so a bad
		// value delays collection rather than hastening it.
		s.unusedSince, _ = time.Parse(time.RFC3339Nano, v)
	}
	return s, nil
}

// parseClaim reads a SecurityIdentityClaim: named by a number of the endpoint range in
// canonical decimal, naming a SecurityIdentity by name and UID.
func parseClaim(u *unstructured.Unstructured) (*claimObj, error) {
	c := &claimObj{name: u.GetName(), uid: string(u.GetUID()), rv: u.GetResourceVersion()}
	n, err := strconv.ParseUint(c.name, 10, 32)
	if err != nil || ClaimName(identity.Identity(n)) != c.name || !inRange(identity.Identity(n)) {
		return nil, fmt.Errorf("SecurityIdentityClaim %s: the name is not a number from %d to %d", c.name, identity.FirstEndpoint, lastEndpoint)
	}
	c.id = identity.Identity(n)
	c.setName, _, _ = unstructured.NestedString(u.Object, "spec", "securityIdentity", "name")
	c.setUID, _, _ = unstructured.NestedString(u.Object, "spec", "securityIdentity", "uid")
	if c.setName == "" || c.setUID == "" {
		return nil, fmt.Errorf("SecurityIdentityClaim %s: spec.securityIdentity needs a name and a uid", c.name)
	}
	return c, nil
}

func inRange(id identity.Identity) bool { return id >= identity.FirstEndpoint && id <= lastEndpoint }

// number reads a JSON number of the endpoint range (int64 or float64 as decoded).
func number(v any) (identity.Identity, error) {
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case float64:
		if x != float64(int64(x)) {
			return 0, fmt.Errorf("%v is not an integer", x)
		}
		n = int64(x)
	default:
		return 0, fmt.Errorf("%v is not a number", v)
	}
	if n < int64(identity.FirstEndpoint) || n > int64(lastEndpoint) {
		return 0, fmt.Errorf("%d is outside %d to %d", n, identity.FirstEndpoint, lastEndpoint)
	}
	return identity.Identity(n), nil
}

// newSet is the SecurityIdentity of label set l with number id.
func newSet(l labels.Labels, id identity.Identity) *unstructured.Unstructured {
	lm := make(map[string]any, len(l))
	for k, v := range l {
		lm[k] = v
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version,
		"kind":       "SecurityIdentity",
		"spec": map[string]any{
			"identity": int64(id),
			"labels":   lm,
		},
	}}
	u.SetName(SetName(identity.LabelsKey(l)))
	return u
}

// newClaim is the claim of number id for the SecurityIdentity setName with UID setUID.
func newClaim(id identity.Identity, setName string, setUID types.UID) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version,
		"kind":       "SecurityIdentityClaim",
		"spec": map[string]any{
			"securityIdentity": map[string]any{"name": setName, "uid": string(setUID)},
		},
	}}
	u.SetName(ClaimName(id))
	return u
}
