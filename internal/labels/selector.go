package labels

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Operator of a match expression, spelled as Kubernetes does.
type Operator string

const (
	OpIn           Operator = "In"
	OpNotIn        Operator = "NotIn"
	OpExists       Operator = "Exists"
	OpDoesNotExist Operator = "DoesNotExist"
)

// Requirement is one matchExpressions entry (or one matchLabels pair, as In with one value).
type Requirement struct {
	Key      string   `json:"key"`
	Operator Operator `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// Selector is a Kubernetes label selector: all requirements must hold. The zero Selector
// (no requirements) selects everything; use None to select nothing.
type Selector struct {
	Requirements []Requirement
	none         bool
}

// None returns a selector that matches nothing.
func None() Selector { return Selector{none: true} }

// IsNone reports whether the selector matches nothing by construction.
func (s Selector) IsNone() bool { return s.none }

// NewRequirement validates and builds a requirement. Operators are case-insensitive on
// input (Cilium examples write "in"), stored canonical.
func NewRequirement(key string, op string, values []string) (Requirement, error) {
	key = NormalizeKey(key)
	if err := ValidateKey(key); err != nil {
		return Requirement{}, err
	}
	var o Operator
	switch strings.ToLower(op) {
	case "in":
		o = OpIn
	case "notin":
		o = OpNotIn
	case "exists":
		o = OpExists
	case "doesnotexist":
		o = OpDoesNotExist
	default:
		return Requirement{}, fmt.Errorf("unknown operator %q (want In, NotIn, Exists or DoesNotExist)", op)
	}
	switch o {
	case OpIn, OpNotIn:
		if len(values) == 0 {
			return Requirement{}, fmt.Errorf("operator %s needs at least one value", o)
		}
	case OpExists, OpDoesNotExist:
		if len(values) != 0 {
			return Requirement{}, fmt.Errorf("operator %s takes no values", o)
		}
	}
	vs := append([]string(nil), values...)
	sort.Strings(vs)
	return Requirement{Key: key, Operator: o, Values: vs}, nil
}

// Matches reports whether the requirement holds for l.
func (r Requirement) Matches(l Labels) bool {
	v, ok := l[r.Key]
	switch r.Operator {
	case OpIn:
		return ok && contains(r.Values, v)
	case OpNotIn:
		return !ok || !contains(r.Values, v)
	case OpExists:
		return ok
	case OpDoesNotExist:
		return !ok
	}
	return false
}

func contains(vs []string, v string) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}

// And returns a selector requiring both s and o.
func (s Selector) And(o Selector) Selector {
	if s.none || o.none {
		return None()
	}
	return Selector{Requirements: append(append([]Requirement(nil), s.Requirements...), o.Requirements...)}
}

// With returns s with one more requirement.
func (s Selector) With(r Requirement) Selector {
	if s.none {
		return s
	}
	return Selector{Requirements: append(append([]Requirement(nil), s.Requirements...), r)}
}

// Matches reports whether every requirement holds for l.
func (s Selector) Matches(l Labels) bool {
	if s.none {
		return false
	}
	for _, r := range s.Requirements {
		if !r.Matches(l) {
			return false
		}
	}
	return true
}

// String renders the selector for explanations, e.g. "app=web,tier in (a,b)".
func (s Selector) String() string {
	if s.none {
		return "<none>"
	}
	if len(s.Requirements) == 0 {
		return "<all>"
	}
	parts := make([]string, 0, len(s.Requirements))
	for _, r := range s.Requirements {
		switch r.Operator {
		case OpIn:
			if len(r.Values) == 1 {
				parts = append(parts, r.Key+"="+r.Values[0])
			} else {
				parts = append(parts, r.Key+" in ("+strings.Join(r.Values, ",")+")")
			}
		case OpNotIn:
			parts = append(parts, r.Key+" notin ("+strings.Join(r.Values, ",")+")")
		case OpExists:
			parts = append(parts, r.Key)
		case OpDoesNotExist:
			parts = append(parts, "!"+r.Key)
		}
	}
	return strings.Join(parts, ",")
}

// selectorJSON is the persisted form of a Selector. The "none" flag must survive a round
// trip: without it a selector that matches nothing would come back as one that matches
// everything.
type selectorJSON struct {
	Requirements []Requirement `json:"requirements,omitempty"`
	None         bool          `json:"none,omitempty"`
}

// MarshalJSON encodes the selector including whether it matches nothing.
func (s Selector) MarshalJSON() ([]byte, error) {
	return json.Marshal(selectorJSON{Requirements: s.Requirements, None: s.none})
}

// UnmarshalJSON decodes and validates a selector written by MarshalJSON.
func (s *Selector) UnmarshalJSON(b []byte) error {
	var sj selectorJSON
	if err := json.Unmarshal(b, &sj); err != nil {
		return err
	}
	if sj.None {
		*s = None()
		return nil
	}
	out := Selector{}
	for _, r := range sj.Requirements {
		nr, err := NewRequirement(r.Key, string(r.Operator), r.Values)
		if err != nil {
			return fmt.Errorf("decoding selector: %w", err)
		}
		out.Requirements = append(out.Requirements, nr)
	}
	*s = out
	return nil
}
