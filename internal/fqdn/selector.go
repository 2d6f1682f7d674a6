package fqdn

import (
	"fmt"
	"regexp"
	"strings"
)

// MaxNameLength is the longest DNS name in presentation form without the final dot
// (RFC 1035: 255 octets on the wire, so 253 characters).
const MaxNameLength = 253

// Selector is one entry of toFQDNs or rules.dns: exactly one of MatchName (a whole
// name) or MatchPattern (a name with wildcards) is set, both in canonical form
// (lowercase, no final dot).
//
// Pattern wildcards, as in Cilium:
//   - "*" alone matches every name;
//   - "*" inside a label matches zero or more of the characters a label may hold
//     (letters, digits, '-' and '_'), never a dot: "*.example.com" matches
//     "a.example.com" but neither "example.com" nor "a.b.example.com";
//   - a leading "**." matches one or more whole labels: "**.example.com" matches
//     "a.example.com" and "a.b.example.com" but not "example.com".
type Selector struct {
	MatchName    string
	MatchPattern string
	re           *regexp.Regexp // MatchPattern compiled; nil for MatchName
}

// Canonical gives a DNS name's canonical form: lowercase, without the final dot.
func Canonical(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// NewSelector validates and compiles one selector. Exactly one of name and pattern must be
// non-empty. Names and patterns may hold letters, digits, '-', '_' and '.' (patterns also
// '*'), have no empty label, and be at most MaxNameLength characters long.
func NewSelector(name, pattern string) (Selector, error) {
	switch {
	case name != "" && pattern != "":
		return Selector{}, fmt.Errorf("matchName and matchPattern cannot both be set in one selector")
	case name == "" && pattern == "":
		return Selector{}, fmt.Errorf("one of matchName and matchPattern must be set")
	case name != "":
		n := Canonical(name)
		if err := checkName(n, false); err != nil {
			return Selector{}, fmt.Errorf("matchName %q: %w", name, err)
		}
		return Selector{MatchName: n}, nil
	}
	p := Canonical(pattern)
	if err := checkName(p, true); err != nil {
		return Selector{}, fmt.Errorf("matchPattern %q: %w", pattern, err)
	}
	re, err := compilePattern(p)
	if err != nil {
		return Selector{}, fmt.Errorf("matchPattern %q: %w", pattern, err)
	}
	return Selector{MatchPattern: p, re: re}, nil
}

// checkName checks the characters and labels of a canonical name or pattern.
func checkName(n string, pattern bool) error {
	if len(n) > MaxNameLength {
		return fmt.Errorf("longer than %d characters", MaxNameLength)
	}
	if pattern && n == "*" {
		return nil
	}
	rest := n
	if pattern && strings.HasPrefix(rest, "**.") {
		rest = rest[3:]
	}
	for _, label := range strings.Split(rest, ".") {
		if label == "" {
			return fmt.Errorf("empty label")
		}
		if strings.Contains(label, "**") {
			return fmt.Errorf("\"**\" is only allowed as the first label (\"**.\")")
		}
		if len(label) > 63 {
			return fmt.Errorf("label %q longer than 63 characters", label)
		}
		for _, c := range label {
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			case c == '*' && pattern:
			default:
				return fmt.Errorf("character %q is not allowed in a DNS name", c)
			}
		}
	}
	return nil
}

// compilePattern turns a canonical, checked pattern into an anchored regular expression.
func compilePattern(p string) (*regexp.Regexp, error) {
	if p == "*" {
		return regexp.Compile(`^.*$`)
	}
	var b strings.Builder
	b.WriteString("^")
	if strings.HasPrefix(p, "**.") {
		b.WriteString(`(?:[-a-z0-9_]+\.)+`)
		p = p[3:]
	}
	for _, c := range p {
		switch c {
		case '*':
			b.WriteString(`[-a-z0-9_]*`)
		case '.':
			b.WriteString(`\.`)
		default:
			b.WriteRune(c)
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// MatchAll is the selector that matches every name (matchPattern "*").
var MatchAll = Selector{MatchPattern: "*", re: regexp.MustCompile(`^.*$`)}

// MatchesAll says whether the selector matches every name.
func (s Selector) MatchesAll() bool { return s.MatchPattern == "*" }

// Matches says whether the selector matches name (in any case, with or without the final
// dot).
func (s Selector) Matches(name string) bool {
	n := Canonical(name)
	if s.MatchName != "" {
		return n == s.MatchName
	}
	if s.re == nil {
		return false
	}
	return s.re.MatchString(n)
}

// String is the selector as a policy writes it; it also serves as the selector's key.
func (s Selector) String() string {
	if s.MatchName != "" {
		return "matchName:" + s.MatchName
	}
	return "matchPattern:" + s.MatchPattern
}
