package policy

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/fqdn"
)

// This file holds the L7 (HTTP) part of Cilium's toPorts: rules.http, its validation, and
// the checks shared with programs that build rules without the parser (HTTPRule.Validate,
// PortRule.CheckL7).

// l7Parsed is what toPorts[].rules holds: HTTP rules or DNS selectors (never both), and
// the entry each came from (nil when absent).
type l7Parsed struct {
	http  []HTTPRule
	httpE *entry
	dns   []fqdn.Selector
	dnsE  *entry
}

// l7Rules parses toPorts[].rules (rules null or {}: nothing). kafka, l7proto and l7 are
// refused as not supported yet.
func (d *docParser) l7Rules(e entry) (l7Parsed, error) {
	var out l7Parsed
	entries, err := d.mapping(e.val, e.path)
	if err != nil {
		return out, err
	}
	for i, le := range entries {
		switch le.name {
		case "http", "HTTP":
			// "HTTP" is how some published examples spell it (Cilium's JSON rule import
			// ignores case, as Go's encoding/json does); it is the same L7 rule.
			if out.httpE != nil {
				return out, d.fail(le.key, le.path, "duplicate field (%s and %s are the same field)", out.httpE.name, le.name)
			}
			out.httpE = &entries[i]
			if out.http, err = d.httpRules(le); err != nil {
				return out, err
			}
		case "dns":
			out.dnsE = &entries[i]
			if out.dns, err = d.fqdnSelectors(le); err != nil {
				return out, err
			}
			if len(out.dns) == 0 {
				return out, d.fail(le.val, le.path, "an empty list is ambiguous (write [{matchPattern: \"*\"}] to allow every query through the DNS proxy, or remove rules)")
			}
		case "kafka", "l7proto", "l7":
			return out, d.unsupported(le)
		default:
			switch strings.ToLower(le.name) {
			case "http", "kafka", "dns", "l7proto", "l7":
				return out, d.fail(le.key, le.path, "%s (field names are case-sensitive; write %s)", ReasonUnknownField, strings.ToLower(le.name))
			}
			return out, d.unknown(le)
		}
	}
	if out.httpE != nil && out.dnsE != nil {
		later := out.dnsE
		if out.httpE.key.Line > later.key.Line {
			later = out.httpE
		}
		return out, d.fail(later.key, later.path, "http and dns rules cannot be combined on one port (write two toPorts entries)")
	}
	return out, nil
}

// httpRules parses the list under rules.http. A null or empty list is refused: Cilium
// would read the first as "no L7 rules" and the second as "every request, through the
// proxy", and neither is what a reader of the manifest would guess.
func (d *docParser) httpRules(e entry) ([]HTTPRule, error) {
	if isNull(e.val) {
		return nil, d.fail(e.val, e.path, "must be a list of HTTP rules (write [{}] to allow every request through the proxy, or remove rules)")
	}
	items, err := d.sequence(e.val, e.path)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, d.fail(e.val, e.path, "an empty list is ambiguous (write [{}] to allow every request through the proxy, or remove rules)")
	}
	out := make([]HTTPRule, 0, len(items))
	for i, it := range items {
		h, err := d.httpRule(it, indexPath(e.path, i))
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

// httpRule parses one HTTP rule: method, path and host regular expressions, headers and
// headerMatches.
func (d *docParser) httpRule(n *yaml.Node, path string) (HTTPRule, error) {
	var h HTTPRule
	if isNull(n) {
		return h, d.fail(n, path, "must be an HTTP rule (write {} to match every request)")
	}
	entries, err := d.mapping(n, path)
	if err != nil {
		return h, err
	}
	for _, e := range entries {
		switch e.name {
		case "method", "path", "host":
			if isNull(e.val) {
				continue
			}
			s, err := d.str(e.val, e.path)
			if err != nil {
				return h, err
			}
			if err := checkRegex(s); err != nil {
				return h, d.fail(e.val, e.path, "%v", err)
			}
			switch e.name {
			case "method":
				h.Method = s
			case "path":
				h.Path = s
			default:
				h.Host = s
			}
		case "headers":
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return h, err
			}
			for i, it := range items {
				p := indexPath(e.path, i)
				s, err := d.str(it, p)
				if err != nil {
					return h, err
				}
				hm, err := ParseHeaderString(s)
				if err != nil {
					return h, d.fail(it, p, "%v", err)
				}
				h.Headers = append(h.Headers, hm)
			}
		case "headerMatches":
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return h, err
			}
			for i, it := range items {
				hm, err := d.headerMatch(it, indexPath(e.path, i))
				if err != nil {
					return h, err
				}
				h.Headers = append(h.Headers, hm)
			}
		default:
			return h, d.unknown(e)
		}
	}
	return h, nil
}

// headerMatch parses one headerMatches entry: {name, value}. Cilium's secret (the value
// comes from a Kubernetes Secret) and mismatch (log, add, delete or replace the header
// instead of refusing the request) are refused.
func (d *docParser) headerMatch(n *yaml.Node, path string) (HeaderMatch, error) {
	var hm HeaderMatch
	if isNull(n) {
		return hm, d.fail(n, path, "must be a header match, not null")
	}
	entries, err := d.mapping(n, path)
	if err != nil {
		return hm, err
	}
	var nameE, valueE *entry
	for i, e := range entries {
		switch e.name {
		case "name":
			nameE = &entries[i]
		case "value":
			valueE = &entries[i]
		case "secret", "mismatch":
			if isNull(e.val) {
				continue
			}
			return hm, d.unsupported(e)
		default:
			return hm, d.unknown(e)
		}
	}
	if nameE == nil || isNull(nameE.val) {
		return hm, d.fail(n, fieldPath(path, "name"), ReasonRequired)
	}
	name, err := d.str(nameE.val, nameE.path)
	if err != nil {
		return hm, err
	}
	if err := checkHeaderName(name); err != nil {
		return hm, d.fail(nameE.val, nameE.path, "%v", err)
	}
	hm.Name = strings.ToLower(name)
	if valueE != nil && !isNull(valueE.val) {
		if hm.Value, err = d.str(valueE.val, valueE.path); err != nil {
			return hm, err
		}
		if err := checkHeaderValue(hm.Value); err != nil {
			return hm, d.fail(valueE.val, valueE.path, "%v", err)
		}
	}
	return hm, nil
}

// checkL7Ports checks that every port of a toPorts entry with HTTP rules can carry them:
// TCP (explicitly: Cilium refuses ANY, which is also the default, with "L7 rules can only
// apply to TCP"), one port (not 0, which means every port, and not a range).
func (d *docParser) checkL7Ports(ports []PortRule, nodes []*yaml.Node, paths []string) error {
	for i, pr := range ports {
		n, p := nodes[i], paths[i]
		field := func(key string) (*yaml.Node, string) { return childField(n, p, key) }
		switch {
		case pr.Protocol != ProtoTCP:
			at, ap := field("protocol")
			what := "is " + ProtocolName(pr.Protocol)
			if at == n {
				what = "defaults to ANY"
			}
			return d.fail(at, ap, "L7 rules apply only to TCP, and the protocol %s (write protocol: TCP; Cilium refuses this too)", what)
		case pr.Port == 0 && pr.Name == "":
			at, ap := field("port")
			return d.fail(at, ap, "L7 rules need a port: no port or port 0 means every port (Cilium refuses this too)")
		case pr.EndPort != 0:
			at, ap := field("endPort")
			return d.fail(at, ap, "L7 rules on a port range are %s", ReasonNotSupported)
		}
	}
	return nil
}

// ParseHeaderString reads an entry of Cilium's headers list, as Cilium does: "Name" requires
// the header to be present, "Name: value" (split at the first space, the colon dropped)
// requires that exact value. It is stricter than Cilium where Cilium would build a rule
// that can never match: the name must be a valid header name (so "Name:value" without the
// space is refused rather than read as a header named "Name:value"), and the value must
// not start or end with white space (HTTP strips it, so it could never match). The name is
// returned in lower case: header names are case-insensitive.
func ParseHeaderString(s string) (HeaderMatch, error) {
	if s == "" {
		return HeaderMatch{}, errors.New(`empty header (write "Name" or "Name: value")`)
	}
	name, value, _ := strings.Cut(s, " ")
	name = strings.TrimRight(name, ":")
	if err := checkHeaderName(name); err != nil {
		return HeaderMatch{}, fmt.Errorf(`%w (write "Name" or "Name: value", with a space after the colon)`, err)
	}
	if err := checkHeaderValue(value); err != nil {
		return HeaderMatch{}, err
	}
	return HeaderMatch{Name: strings.ToLower(name), Value: value}, nil
}

// checkRegex compiles an L7 regular expression. Go's regexp implements RE2 syntax, which is
// what Envoy's safe_regex (google_re2) uses, so what compiles here compiles there.
func checkRegex(s string) error {
	if _, err := regexp.Compile(s); err != nil {
		return fmt.Errorf("invalid regular expression %q (RE2 syntax): %w", s, err)
	}
	return nil
}

// isTokenChar reports whether c may appear in an HTTP token (RFC 9110 tchar): a header
// name.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func checkHeaderName(s string) error {
	if s == "" {
		return errors.New("empty header name")
	}
	for i := 0; i < len(s); i++ {
		if !isTokenChar(s[i]) {
			return fmt.Errorf("invalid header name %q: only letters, digits and !#$%%&'*+-.^_`|~ are allowed", s)
		}
	}
	return nil
}

// checkHeaderValue refuses what no request header value can be: control characters (CR
// and LF would split the header) and white space at either end (HTTP strips it).
func checkHeaderValue(s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return fmt.Errorf("invalid header value %q: control characters are not allowed", s)
		}
	}
	if strings.TrimSpace(s) != s {
		return fmt.Errorf("invalid header value %q: white space at either end cannot match (HTTP strips it)", s)
	}
	return nil
}

// Validate checks an HTTP rule built without the parser: regular expressions that
// compile, valid header names (in lower case, as the parser stores them) and values.
func (h HTTPRule) Validate() error {
	for _, f := range []struct{ name, re string }{{"method", h.Method}, {"path", h.Path}, {"host", h.Host}} {
		if err := checkRegex(f.re); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	for _, hm := range h.Headers {
		if err := checkHeaderName(hm.Name); err != nil {
			return err
		}
		if hm.Name != strings.ToLower(hm.Name) {
			return fmt.Errorf("header name %q is not in lower case", hm.Name)
		}
		if err := checkHeaderValue(hm.Value); err != nil {
			return err
		}
	}
	return nil
}

// CheckL7 reports whether a port rule built without the parser can carry its HTTP rules:
// nil when it has none, else an error unless it is one TCP port (a number or a name) with
// at least one valid HTTP rule. The parser only produces port rules that pass.
func (pr PortRule) CheckL7() error {
	if pr.DNS != nil {
		return pr.checkDNS()
	}
	if pr.HTTP == nil {
		return nil
	}
	switch {
	case pr.Protocol != ProtoTCP || pr.ICMPType:
		return fmt.Errorf("L7 rules on %s: only TCP can carry them", FormatPort(pr))
	case pr.Name == "" && pr.Port == 0:
		return fmt.Errorf("L7 rules on %s: they need one port", FormatPort(pr))
	case pr.Name == "" && pr.EndPort > pr.Port:
		return fmt.Errorf("L7 rules on the port range %s: not supported", FormatPort(pr))
	case len(pr.HTTP) == 0:
		return fmt.Errorf("L7 port %s has no HTTP rule (one empty rule allows every request)", FormatPort(pr))
	}
	for i, h := range pr.HTTP {
		if err := h.Validate(); err != nil {
			return fmt.Errorf("L7 port %s, HTTP rule %d: %w", FormatPort(pr), i, err)
		}
	}
	return nil
}

// MatchesAll reports whether the rule matches every request (no field set).
func (h HTTPRule) MatchesAll() bool {
	return h.Method == "" && h.Path == "" && h.Host == "" && len(h.Headers) == 0
}

// Equal reports whether two HTTP rules are the same (headers in the same order).
func (h HTTPRule) Equal(o HTTPRule) bool {
	return h.Method == o.Method && h.Path == o.Path && h.Host == o.Host && slices.Equal(h.Headers, o.Headers)
}
