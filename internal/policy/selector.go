package policy

import (
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/labels"
)

// selectorSyntax tells how a label selector is written.
type selectorSyntax struct {
	// cilium: keys may carry Cilium's source prefixes (k8s:, any:) and operators are
	// case-insensitive, as Cilium accepts them. Kubernetes selectors are exact.
	cilium bool
	// keyPrefix is put in front of every key: a NetworkPolicy namespaceSelector selects on
	// namespace labels, which endpoints carry under labels.KeyNamespaceLabelPrefix.
	keyPrefix string
}

// selector parses a label selector (matchLabels and matchExpressions; all must hold). A
// null or empty selector selects everything.
func (d *docParser) selector(n *yaml.Node, path string, syn selectorSyntax) (labels.Selector, error) {
	sel := labels.Selector{}
	entries, err := d.mapping(n, path)
	if err != nil {
		return sel, err
	}
	for _, e := range entries {
		switch e.name {
		case "matchLabels":
			pairs, err := d.mapping(e.val, e.path)
			if err != nil {
				return sel, err
			}
			for _, pe := range pairs {
				key, err := d.labelKey(pe.key, pe.name, pe.path, syn)
				if err != nil {
					return sel, err
				}
				value := ""
				if !isNull(pe.val) { // null is "" in Kubernetes' map[string]string
					if value, err = d.str(pe.val, pe.path); err != nil {
						return sel, err
					}
				}
				if err := labels.ValidateValue(value); err != nil {
					return sel, d.fail(pe.val, pe.path, "%v", err)
				}
				r, err := labels.NewRequirement(syn.keyPrefix+key, string(labels.OpIn), []string{value})
				if err != nil {
					return sel, d.fail(pe.key, pe.path, "%v", err)
				}
				sel = sel.With(r)
			}
		case "matchExpressions":
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return sel, err
			}
			for i, item := range items {
				r, err := d.requirement(item, indexPath(e.path, i), syn)
				if err != nil {
					return sel, err
				}
				sel = sel.With(r)
			}
		default:
			return sel, d.unknown(e)
		}
	}
	return sel, nil
}

// requirement parses one matchExpressions entry.
func (d *docParser) requirement(n *yaml.Node, path string, syn selectorSyntax) (labels.Requirement, error) {
	var r labels.Requirement
	entries, err := d.mapping(n, path)
	if err != nil {
		return r, err
	}
	var key, op string
	var values []string
	var keyE, opE, valuesE *entry
	for i, e := range entries {
		switch e.name {
		case "key":
			s, err := d.str(e.val, e.path)
			if err != nil {
				return r, err
			}
			if key, err = d.labelKey(e.val, s, e.path, syn); err != nil {
				return r, err
			}
			keyE = &entries[i]
		case "operator":
			if op, err = d.str(e.val, e.path); err != nil {
				return r, err
			}
			opE = &entries[i]
		case "values":
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return r, err
			}
			for j, it := range items {
				v, err := d.str(it, indexPath(e.path, j))
				if err != nil {
					return r, err
				}
				if err := labels.ValidateValue(v); err != nil {
					return r, d.fail(it, indexPath(e.path, j), "%v", err)
				}
				values = append(values, v)
			}
			valuesE = &entries[i]
		default:
			return r, d.unknown(e)
		}
	}
	if keyE == nil {
		return r, d.fail(n, fieldPath(path, "key"), ReasonRequired)
	}
	if opE == nil {
		return r, d.fail(n, fieldPath(path, "operator"), ReasonRequired)
	}
	canonical := map[string]labels.Operator{
		"in": labels.OpIn, "notin": labels.OpNotIn, "exists": labels.OpExists, "doesnotexist": labels.OpDoesNotExist,
	}
	o, ok := canonical[strings.ToLower(op)]
	if !ok || (!syn.cilium && string(o) != op) {
		return r, d.fail(opE.val, opE.path, "unknown operator %q (want In, NotIn, Exists or DoesNotExist)", op)
	}
	switch o {
	case labels.OpIn, labels.OpNotIn:
		if len(values) == 0 {
			at, p := n, fieldPath(path, "values")
			if valuesE != nil {
				at = valuesE.val
			}
			return r, d.fail(at, p, "operator %s needs at least one value", o)
		}
	default:
		if len(values) != 0 {
			return r, d.fail(valuesE.val, valuesE.path, "operator %s takes no values", o)
		}
	}
	r, err = labels.NewRequirement(syn.keyPrefix+key, string(o), values)
	if err != nil {
		return r, d.fail(n, path, "%v", err)
	}
	return r, nil
}

// labelKey checks a label key as written and returns it normalised (without Cilium's
// k8s:/any: source prefixes).
func (d *docParser) labelKey(at *yaml.Node, key, path string, syn selectorSyntax) (string, error) {
	if syn.cilium {
		key = labels.NormalizeKey(key)
		if source, _, ok := strings.Cut(key, ":"); ok {
			if source == "reserved" {
				// Reserved identities are selected with fromEntities/toEntities.
				return "", d.fail(at, path, "label source %q %s (use fromEntities/toEntities)", source, ReasonNotSupported)
			}
			return "", d.fail(at, path, "label source %q %s", source, ReasonNotSupported)
		}
	}
	if err := labels.ValidateQualifiedKey(key); err != nil {
		return "", d.fail(at, path, "%v", err)
	}
	return key, nil
}

// hasKey reports whether the selector constrains key.
func hasKey(s labels.Selector, key string) bool {
	for _, r := range s.Requirements {
		if r.Key == key {
			return true
		}
	}
	return false
}

func mustRequirement(key string, op labels.Operator, values ...string) labels.Requirement {
	r, err := labels.NewRequirement(key, string(op), values)
	if err != nil {
		panic(err) // only called with constant operators and keys
	}
	return r
}

// inNamespace restricts a selector to endpoints of namespace ns.
func inNamespace(s labels.Selector, ns string) labels.Selector {
	return s.With(mustRequirement(labels.KeyNamespace, labels.OpIn, ns))
}

// inAnyNamespace restricts a selector to endpoints that have a namespace, that is to
// endpoints (pods) as opposed to reserved identities such as host or world.
func inAnyNamespace(s labels.Selector) labels.Selector {
	return s.With(mustRequirement(labels.KeyNamespace, labels.OpExists))
}
