package l7plan

import (
	"regexp"
	"strings"
	"sync"

	"github.com/rampartnet/rampart/internal/policy"
)

// httpMatches reports whether r matches one of rules (nil: any request), with the
// semantics the Envoy configuration has: method, path (without query) and host are RE2
// expressions matched against the whole value; a header match needs the header present
// (Value "") or equal to Value.
func httpMatches(rules []policy.HTTPRule, r Request) bool {
	if rules == nil {
		return true
	}
	for _, h := range rules {
		if httpRuleMatches(h, r) {
			return true
		}
	}
	return false
}

func httpRuleMatches(h policy.HTTPRule, r Request) bool {
	if !fullMatch(h.Method, r.Method) || !fullMatch(h.Path, r.Path) || !fullMatch(h.Host, r.Host) {
		return false
	}
	for _, hm := range h.Headers {
		v, ok := r.Header[strings.ToLower(hm.Name)]
		if !ok || (hm.Value != "" && v != hm.Value) {
			return false
		}
	}
	return true
}

var (
	reMu    sync.Mutex
	reCache = map[string]*regexp.Regexp{}
)

// fullMatch matches s against the whole of re ("" matches anything). An expression that
// does not compile matches nothing (the parser refuses those; fail closed regardless).
func fullMatch(re, s string) bool {
	if re == "" {
		return true
	}
	reMu.Lock()
	c, ok := reCache[re]
	if !ok {
		c, _ = regexp.Compile(`^(?:` + re + `)$`)
		reCache[re] = c
	}
	reMu.Unlock()
	return c != nil && c.MatchString(s)
}
