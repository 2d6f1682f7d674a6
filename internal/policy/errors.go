package policy

import (
	"fmt"
	"strings"

	"github.com/rampartnet/rampart/internal/labels"
)

// Reasons shared by many errors, so that callers and tests can tell the classes apart.
const (
	// ReasonUnknownField: the field is not part of the manifest schema (a typo, or a field
	// of another kind or version).
	ReasonUnknownField = "unknown field"
	// ReasonNotSupported: the field is valid in its schema but Rampart does not implement
	// it; it is refused rather than ignored, so a policy is never half-applied.
	ReasonNotSupported = "not supported yet"
	// ReasonRequired: a required field is missing.
	ReasonRequired = "required field missing"
)

// ParseError is an error in one manifest document: it names the file, the document, the
// policy (as far as it is known) and the field.
type ParseError struct {
	Source    string // file name, or "-" for stdin
	Document  int    // 1-based document index within Source; 0 if not known
	Kind      Kind   // as written in the document, possibly invalid; "" if not known
	Namespace string
	Name      string
	Field     string // full path, e.g. spec.ingress[0].from[1].podSelector.matchLabelz
	Line      int    // 1-based; 0 if not known
	Reason    string
}

// Error renders e.g.
//
//	policies.yaml: document 2 (NetworkPolicy x/allow-web): spec.ingress[0].fromm (line 14): unknown field
func (e *ParseError) Error() string {
	var b strings.Builder
	b.WriteString(e.Source)
	if e.Document > 0 {
		fmt.Fprintf(&b, ": document %d", e.Document)
	}
	if e.Kind != "" {
		b.WriteString(" (")
		b.WriteString(string(e.Kind))
		if id := policyID(labels.Shorten(e.Namespace), labels.Shorten(e.Name)); id != "" {
			b.WriteString(" ")
			b.WriteString(id)
		}
		b.WriteString(")")
	}
	if e.Field != "" {
		b.WriteString(": ")
		// A path holds the keys of the document, which may be long; real paths are short.
		if len(e.Field) > 512 {
			b.WriteString(labels.Shorten(e.Field))
		} else {
			b.WriteString(e.Field)
		}
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, " (line %d)", e.Line)
	}
	b.WriteString(":")
	b.WriteString(" ")
	b.WriteString(e.Reason)
	return b.String()
}

// policyID renders namespace/name, or name alone for clusterwide policies.
func policyID(namespace, name string) string {
	switch {
	case name == "":
		return ""
	case namespace == "":
		return name
	}
	return namespace + "/" + name
}
