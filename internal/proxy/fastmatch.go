package proxy

import (
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rampartnet/rampart/internal/policy"
)

// The fast path's matchers: an Authz's grants compiled once per plan, with the semantics
// of httpMatches (which the Envoy configuration has), so that a request costs string
// comparisons for rules that are plain literals (most are: GET, /v1) and one RE2 match
// for the others, and nothing per request is looked up under a lock.

type strMatcher struct {
	any     bool   // "" matches anything
	literal string // the whole value must equal it (when re is nil)
	re      *regexp.Regexp
	never   bool // did not compile: matches nothing (fail closed)
}

func compileStr(expr string) strMatcher {
	if expr == "" {
		return strMatcher{any: true}
	}
	if re, err := regexp.Compile(expr); err == nil {
		if lit, complete := re.LiteralPrefix(); complete {
			return strMatcher{literal: lit}
		}
	}
	re, err := regexp.Compile(`^(?:` + expr + `)$`)
	if err != nil {
		return strMatcher{never: true}
	}
	return strMatcher{re: re}
}

func (m *strMatcher) match(s string) bool {
	switch {
	case m.any:
		return true
	case m.never:
		return false
	case m.re == nil:
		return s == m.literal
	}
	return m.re.MatchString(s)
}

type headerMatcher struct {
	name  string // lower case
	value string // "" = present
}

type ruleMatcher struct {
	method, path, host strMatcher
	headers            []headerMatcher
}

type grantMatcher struct {
	g     *Grant
	rules []ruleMatcher // nil: every request
}

// compiledAuthz is an Authz ready for the fast path.
type compiledAuthz struct {
	z      *Authz
	grants []grantMatcher
}

func compileAuthz(z *Authz) *compiledAuthz {
	c := &compiledAuthz{z: z}
	for i := range z.Grants {
		g := &z.Grants[i]
		gm := grantMatcher{g: g}
		for _, h := range g.HTTP {
			rm := ruleMatcher{method: compileStr(h.Method), path: compileStr(h.Path), host: compileStr(h.Host)}
			for _, hm := range h.Headers {
				rm.headers = append(rm.headers, headerMatcher{name: strings.ToLower(hm.Name), value: hm.Value})
			}
			gm.rules = append(gm.rules, rm)
		}
		c.grants = append(c.grants, gm)
	}
	return c
}

// allows is Authz.Allows with compiled matchers.
func (c *compiledAuthz) allows(r *Request) (bool, *Grant) {
	peer := r.Src
	if c.z.Direction == policy.Egress {
		peer = r.Dst
	}
	for i := range c.grants {
		gm := &c.grants[i]
		if gm.g.Peers.Contains(peer) && gm.matches(r) {
			return true, gm.g
		}
	}
	return false, nil
}

func (gm *grantMatcher) matches(r *Request) bool {
	if gm.g.HTTP == nil {
		return true
	}
	for i := range gm.rules {
		m := &gm.rules[i]
		if !m.method.match(r.Method) || !m.path.match(r.Path) || !m.host.match(r.Host) {
			continue
		}
		ok := true
		for _, hm := range m.headers {
			v, present := r.Header[hm.name]
			if !present || (hm.value != "" && v != hm.value) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// compiledPlan holds the compiled authorisations of one plan.
type compiledPlan struct {
	plan  *Plan
	authz map[*Authz]*compiledAuthz
}

// planMatchers compiles each plan once, when the fast path first meets it.
type planMatchers struct {
	mu  sync.Mutex // serialises compiling
	cur atomic.Pointer[compiledPlan]
}

func (pm *planMatchers) get(p *Plan) *compiledPlan {
	if c := pm.cur.Load(); c != nil && c.plan == p {
		return c
	}
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if c := pm.cur.Load(); c != nil && c.plan == p {
		return c
	}
	cp := &compiledPlan{plan: p, authz: map[*Authz]*compiledAuthz{}}
	for i := range p.Chains {
		for _, z := range []*Authz{p.Chains[i].Egress, p.Chains[i].Ingress} {
			if z != nil && cp.authz[z] == nil {
				cp.authz[z] = compileAuthz(z)
			}
		}
	}
	pm.cur.Store(cp)
	return cp
}

// chainFor is Plan.Chain for a connection's addresses.
func (cp *compiledPlan) chainFor(src, dst netip.AddrPort) *Chain {
	return cp.plan.Chain(src.Addr(), dst.Addr(), dst.Port())
}
