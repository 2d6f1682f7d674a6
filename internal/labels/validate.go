package labels

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Kubernetes limits for label keys and values (k8s.io/apimachinery validation). Policy
// manifests are checked against them so that a selector Kubernetes would refuse is refused
// here too, instead of silently matching nothing.
const (
	maxNameLen      = 63  // the name part of a key, and a value
	maxKeyPrefixLen = 253 // the optional DNS subdomain prefix of a key
)

// ValidateQualifiedKey checks k as Kubernetes checks a label key written by a user: an
// optional DNS subdomain prefix and a slash, then a name of at most 63 characters made of
// alphanumerics, '-', '_' and '.', starting and ending with an alphanumeric.
//
// It is stricter than ValidateKey, which only checks what the label set representation
// needs; use it on keys as written in manifests, before any prefix is added.
func ValidateQualifiedKey(k string) error {
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		prefix, name = "", k
	}
	if hasPrefix {
		if prefix == "" {
			return fmt.Errorf("invalid label key %q: empty prefix before '/'", Shorten(k))
		}
		if len(prefix) > maxKeyPrefixLen || !isDNSSubdomain(prefix) {
			return fmt.Errorf("invalid label key %q: prefix must be a lowercase DNS subdomain of at most %d characters", Shorten(k), maxKeyPrefixLen)
		}
	}
	if name == "" {
		return fmt.Errorf("invalid label key %q: empty name", Shorten(k))
	}
	if len(name) > maxNameLen || !isLabelName(name) {
		return fmt.Errorf("invalid label key %q: name must be at most %d characters of [A-Za-z0-9-_.], starting and ending with an alphanumeric", Shorten(k), maxNameLen)
	}
	return nil
}

// ValidateValue checks v as Kubernetes checks a label value: empty, or at most 63
// characters of alphanumerics, '-', '_' and '.', starting and ending with an alphanumeric.
func ValidateValue(v string) error {
	if v == "" {
		return nil
	}
	if len(v) > maxNameLen || !isLabelName(v) {
		return fmt.Errorf("invalid label value %q: must be empty or at most %d characters of [A-Za-z0-9-_.], starting and ending with an alphanumeric", Shorten(v), maxNameLen)
	}
	return nil
}

// Shorten returns s for a message: unchanged when short, else its first 64 bytes and its
// size. Names and labels arrive from users and programs and may be megabytes long; a
// message must not repeat them.
func Shorten(s string) string {
	const keep = 64
	if len(s) <= 2*keep {
		return s
	}
	cut := keep
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:cut], len(s))
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// isLabelName reports whether s matches ([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9].
func isLabelName(s string) bool {
	if s == "" || !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

// isDNSSubdomain reports whether s is dot-separated lowercase DNS labels.
func isDNSSubdomain(s string) bool {
	for _, part := range strings.Split(s, ".") {
		if !isDNSLabel(part) {
			return false
		}
	}
	return true
}

// isDNSLabel reports whether s matches [a-z0-9]([-a-z0-9]*[a-z0-9])? with at most 63
// characters.
func isDNSLabel(s string) bool {
	if s == "" || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		lowerAlnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !lowerAlnum && (c != '-' || i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}
