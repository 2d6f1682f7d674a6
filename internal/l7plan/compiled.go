package l7plan

import (
	"net/netip"
	"regexp"
	"strings"

	"github.com/rampartnet/rampart/internal/policy"
)

// Compiled matchers: a plan's authorisations compiled once, with the semantics of
// Authz.Allows (which the Envoy configuration has), so that a request costs string
// comparisons for rules that are plain literals (most are: GET, /v1) and one RE2 match
// for the others, and nothing per request is looked up under a lock. The proxy's fast
// path decides with them.

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

// CompiledAuthz is an Authz with its matchers compiled.
type CompiledAuthz struct {
	z      *Authz
	grants []grantMatcher
}

// CompileAuthz compiles z's grants.
func CompileAuthz(z *Authz) *CompiledAuthz {
	c := &CompiledAuthz{z: z}
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

// Allows is Authz.Allows with compiled matchers.
func (c *CompiledAuthz) Allows(r *Request) (bool, *Grant) {
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

// CompiledPlan holds the compiled authorisations of one plan.
type CompiledPlan struct {
	plan  *Plan
	authz map[*Authz]*CompiledAuthz
}

// Compile compiles every authorisation of p. p must not change afterwards.
func Compile(p *Plan) *CompiledPlan {
	cp := &CompiledPlan{plan: p, authz: map[*Authz]*CompiledAuthz{}}
	for i := range p.Chains {
		for _, z := range []*Authz{p.Chains[i].Egress, p.Chains[i].Ingress} {
			if z != nil && cp.authz[z] == nil {
				cp.authz[z] = CompileAuthz(z)
			}
		}
	}
	return cp
}

// Plan returns the plan it was compiled from.
func (cp *CompiledPlan) Plan() *Plan { return cp.plan }

// Authz returns the compiled form of z, one of the plan's authorisations (nil for others).
func (cp *CompiledPlan) Authz(z *Authz) *CompiledAuthz { return cp.authz[z] }

// ChainFor is Plan.Chain for a connection's addresses.
func (cp *CompiledPlan) ChainFor(src, dst netip.AddrPort) *Chain {
	return cp.plan.Chain(src.Addr(), dst.Addr(), dst.Port())
}
