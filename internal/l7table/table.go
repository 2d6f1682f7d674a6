package l7table

import (
	"fmt"
	"math/bits"
	"net/netip"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"

	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/policy"
)

// Limits of the kernel's tables; bpf/include/sockverdict.h has the same numbers.
const (
	PathMax        = 128 // bytes of a request path the kernel compares
	HostMax        = 64  // bytes of a Host value the kernel compares
	MaxRules       = 64  // rules per side (one bit each in a mask)
	HeaderNameMax  = 48  // bytes of a header name the kernel compares
	HeaderValueMax = 64  // bytes of a header value the kernel compares
	MaxHeaderReqs  = 64  // header requirements per side (one bit each)
)

// Methods are the methods the kernel's request parser takes, in the order of their index
// in Header.Method. They are the fast path's (internal/proxy/http1): a request with
// another method is outside the kernel's subset.
var Methods = [...]string{"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"}

// Sides of a connection: the client's egress rules and the server's ingress rules. A
// request passes only if both sides let it.
const (
	Egress  = 0
	Ingress = 1
)

// Masks holds one bit per rule for each side.
type Masks [2]uint64

func (m *Masks) or(o Masks) {
	m[0] |= o[0]
	m[1] |= o[1]
}

// Header is the fixed part of a table (struct sv_table in C).
type Header struct {
	// Pass has a side's bit 0 set when that side lets every request through: it has no L7
	// rules for this connection (plain L3/L4 allow), or a grant without HTTP rules.
	Pass Masks
	// AnyPath and AnyHost: the rules that do not restrict the path, or the host.
	AnyPath, AnyHost Masks
	// Method[i]: the rules whose method expression matches Methods[i].
	Method [len(Methods)]Masks
	// HeaderRules: the rules with header requirements (checked against RuleReqs).
	HeaderRules Masks
}

// PathEntry is one entry of the path trie. Key is an exact path followed by a NUL byte
// (the kernel pads a request's path with NULs), or the literal prefix of a "prefix.*"
// rule. Masks holds the rules of this entry and of every shorter entry that is a prefix of
// it, so that the kernel's longest-prefix lookup returns every rule the path matches.
type PathEntry struct {
	Key   string
	Masks Masks
}

// HostEntry is one exact Host value and the rules that require it.
type HostEntry struct {
	Host  string
	Masks Masks
}

// HeaderEntry is what one request header line can satisfy: for Name alone (Value ""
// and Presence), the requirements that the header be present; for Name with Value, the
// requirements that it have that exact value. A name sent more than once must have the
// value in every line (as the proxy matches): the name's own entry holds, in ValueReqs,
// the value requirements of the name, which a line with another value breaks.
type HeaderEntry struct {
	Name      string // lower case
	Value     string
	Presence  bool  // the entry for the name itself
	Reqs      Masks // requirement bits, per side
	ValueReqs Masks // on the name's entry: its names' value requirements
}

// Rule names one rule of a table, for flow events: the grant it came from.
type Rule struct {
	Grant  string
	RuleID uint32
	HTTP   policy.HTTPRule
}

// Table is everything the kernel needs for one connection's requests.
type Table struct {
	Header  Header
	Paths   []PathEntry   // sorted by Key
	Hosts   []HostEntry   // sorted by Host
	Headers []HeaderEntry // sorted by Name, then Value (the name's own entry first)
	// RuleReqs[side][bit] holds the header requirements of that rule (0: none). A rule
	// matches a request's headers when all of them were satisfied.
	RuleReqs [2][]uint64
	// Rules[side][bit] describes the rule of that bit.
	Rules [2][]Rule
}

// Compile builds the table for connections from src to dst on port, under the plan. It
// returns an error, saying why, when the kernel could not decide exactly as the plan does;
// such connections stay on the proxy. A connection the plan has no chain for gets an error
// too (the proxy closes those).
func Compile(p *l7plan.Plan, src, dst netip.Addr, port uint16) (*Table, error) {
	c := p.Chain(src, dst, port)
	if c == nil || (c.Egress == nil && c.Ingress == nil) {
		return nil, fmt.Errorf("no proxy chain for %s -> %s port %d", src, dst, port)
	}
	t := &Table{}
	for side, z := range []*l7plan.Authz{c.Egress, c.Ingress} {
		if z == nil {
			t.Header.Pass[side] = 1
			continue
		}
		peer := src
		if side == Egress {
			peer = dst
		}
		var rules []Rule
		for _, g := range z.Grants {
			if !g.Peers.Contains(peer) {
				continue
			}
			if g.HTTP == nil {
				t.Header.Pass[side] = 1
				rules = nil
				break
			}
			for _, h := range g.HTTP {
				rules = append(rules, Rule{Grant: g.Name, RuleID: g.RuleID, HTTP: h})
			}
		}
		if t.Header.Pass[side] != 0 {
			continue
		}
		if len(rules) > MaxRules {
			return nil, fmt.Errorf("%s side: %d HTTP rules, the kernel takes at most %d", sideName(side), len(rules), MaxRules)
		}
		for bit, r := range rules {
			if err := t.add(side, bit, r.HTTP); err != nil {
				return nil, fmt.Errorf("%s side, grant %s: %w", sideName(side), r.Grant, err)
			}
		}
		t.Rules[side] = rules
	}
	t.finish()
	return t, nil
}

func sideName(side int) string {
	if side == Egress {
		return "egress"
	}
	return "ingress"
}

// add encodes one rule as bit of side.
func (t *Table) add(side, bit int, h policy.HTTPRule) error {
	m := Masks{}
	if err := t.addHeaders(side, bit, h.Headers); err != nil {
		return fmt.Errorf("rule %s: %w", policy.FormatHTTPRule(h), err)
	}
	m[side] = 1 << bit
	for i, meth := range Methods {
		if fullMatch(h.Method, meth) {
			t.Header.Method[i].or(m)
		}
	}
	path, prefix, err := literal(h.Path)
	switch {
	case err != nil:
		return fmt.Errorf("path %q: %w", h.Path, err)
	case prefix && path == "":
		t.Header.AnyPath.or(m)
	case prefix && len(path) > PathMax:
		return fmt.Errorf("path %q: its literal prefix is longer than %d bytes", h.Path, PathMax)
	case prefix:
		t.addPath(path, m)
	case len(path) >= PathMax:
		return fmt.Errorf("path %q: longer than %d bytes", h.Path, PathMax-1)
	default:
		t.addPath(path+"\x00", m)
	}
	host, hostPrefix, err := literal(h.Host)
	switch {
	case err != nil:
		return fmt.Errorf("host %q: %w", h.Host, err)
	case hostPrefix && host == "":
		t.Header.AnyHost.or(m)
	case hostPrefix:
		return fmt.Errorf("host %q: only exact host names are matched in the kernel", h.Host)
	case len(host) >= HostMax:
		return fmt.Errorf("host %q: longer than %d bytes", h.Host, HostMax-1)
	default:
		i := slices.IndexFunc(t.Hosts, func(e HostEntry) bool { return e.Host == host })
		if i < 0 {
			t.Hosts = append(t.Hosts, HostEntry{Host: host})
			i = len(t.Hosts) - 1
		}
		t.Hosts[i].Masks.or(m)
	}
	return nil
}

// addHeaders gives each header match of rule bit of side a requirement bit, on the entry
// of its name (presence) or of its name and value.
func (t *Table) addHeaders(side, bit int, hs []policy.HeaderMatch) error {
	if len(hs) == 0 {
		return nil
	}
	if t.RuleReqs[side] == nil {
		t.RuleReqs[side] = make([]uint64, MaxRules)
	}
	for _, hm := range hs {
		name := strings.ToLower(hm.Name)
		if len(name) >= HeaderNameMax || len(hm.Value) >= HeaderValueMax {
			return fmt.Errorf("header %q: longer than the kernel compares (%d bytes of name, %d of value)", hm.Name, HeaderNameMax-1, HeaderValueMax-1)
		}
		nameEntry := t.headerEntry(name, "", true)
		req := t.reqCount(side)
		if req >= MaxHeaderReqs {
			return fmt.Errorf("more than %d header matches on one side", MaxHeaderReqs)
		}
		if hm.Value == "" {
			nameEntry.Reqs[side] |= 1 << req
		} else {
			nameEntry.ValueReqs[side] |= 1 << req
			// After nameEntry's last use: adding an entry may move the slice.
			t.headerEntry(name, hm.Value, false).Reqs[side] |= 1 << req
		}
		t.RuleReqs[side][bit] |= 1 << req
	}
	t.Header.HeaderRules[side] |= 1 << bit
	return nil
}

// reqCount is how many requirement bits side has given out.
func (t *Table) reqCount(side int) int {
	var all uint64
	for _, r := range t.RuleReqs[side] {
		all |= r
	}
	return 64 - bits.LeadingZeros64(all)
}

// headerEntry finds or adds the entry for name (presence) or name and value.
func (t *Table) headerEntry(name, value string, presence bool) *HeaderEntry {
	for i := range t.Headers {
		if e := &t.Headers[i]; e.Name == name && e.Value == value && e.Presence == presence {
			return e
		}
	}
	t.Headers = append(t.Headers, HeaderEntry{Name: name, Value: value, Presence: presence})
	return &t.Headers[len(t.Headers)-1]
}

func (t *Table) addPath(key string, m Masks) {
	i := slices.IndexFunc(t.Paths, func(e PathEntry) bool { return e.Key == key })
	if i < 0 {
		t.Paths = append(t.Paths, PathEntry{Key: key})
		i = len(t.Paths) - 1
	}
	t.Paths[i].Masks.or(m)
}

// finish sorts the entries and folds each path entry's ancestors into its masks.
func (t *Table) finish() {
	slices.SortFunc(t.Paths, func(a, b PathEntry) int { return strings.Compare(a.Key, b.Key) })
	slices.SortFunc(t.Hosts, func(a, b HostEntry) int { return strings.Compare(a.Host, b.Host) })
	slices.SortFunc(t.Headers, func(a, b HeaderEntry) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		if a.Presence != b.Presence {
			return map[bool]int{true: -1, false: 1}[a.Presence]
		}
		return strings.Compare(a.Value, b.Value)
	})
	own := make([]Masks, len(t.Paths))
	for i := range t.Paths {
		own[i] = t.Paths[i].Masks
	}
	for i := range t.Paths {
		for j := range t.Paths {
			// An exact entry ends in NUL, which no longer key continues with, so only
			// prefix entries are ever strict prefixes of others.
			if j != i && strings.HasPrefix(t.Paths[i].Key, t.Paths[j].Key) {
				t.Paths[i].Masks.or(own[j])
			}
		}
	}
}

// literal reports what the kernel can do with expression re: match exactly the string s
// (prefix false), or every string that starts with s (prefix true; re is s followed by
// ".*"). "" is every string. Anything else is an error.
func literal(re string) (s string, prefix bool, err error) {
	if re == "" {
		return "", true, nil
	}
	// Parsed as the matchers compile it (Perl syntax, RE2): (?i) and the like show up as
	// flags on the literal.
	tree, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return "", false, fmt.Errorf("does not compile: %w", err)
	}
	tree = tree.Simplify()
	for tree.Op == syntax.OpCapture {
		tree = tree.Sub[0]
	}
	isLiteral := func(t *syntax.Regexp) bool {
		return t.Op == syntax.OpLiteral && t.Flags&syntax.FoldCase == 0
	}
	isAny := func(t *syntax.Regexp) bool {
		// Paths and hosts in the kernel's subset have no newline, so "." and "(?s:.)"
		// match the same there.
		return t.Op == syntax.OpStar && (t.Sub[0].Op == syntax.OpAnyCharNotNL || t.Sub[0].Op == syntax.OpAnyChar)
	}
	switch {
	case tree.Op == syntax.OpEmptyMatch:
		return "", false, nil
	case isLiteral(tree):
		return string(tree.Rune), false, nil
	case isAny(tree):
		return "", true, nil
	case tree.Op == syntax.OpConcat && len(tree.Sub) == 2 && isLiteral(tree.Sub[0]) && isAny(tree.Sub[1]):
		return string(tree.Sub[0].Rune), true, nil
	}
	return "", false, fmt.Errorf("the kernel matches only literals and literal prefixes followed by .*")
}

// fullMatch is the plan's matching (the whole value against re; "" matches anything).
func fullMatch(re, s string) bool {
	if re == "" {
		return true
	}
	c, err := regexp.Compile(`^(?:` + re + `)$`)
	return err == nil && c.MatchString(s)
}
