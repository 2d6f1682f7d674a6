package tappolicy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/google/mangle/analysis"
	"github.com/google/mangle/ast"
	"github.com/google/mangle/engine"
	"github.com/google/mangle/factstore"
	"github.com/google/mangle/parse"
)

// Limits on a policy: its size, and the facts its evaluation may derive (the bound on the
// memory and time one compilation takes, whatever the rules).
const (
	MaxSourceBytes  = 1 << 20
	MaxDerivedFacts = 200_000
	// maxDerivations is how many derivations of one fact an explanation lists.
	maxDerivations = 8
	// maxExplainDepth is how deep an explanation follows derived premises.
	maxExplainDepth = 6
)

// Contract is a tap contract the policy derived.
type Contract struct {
	Name      string // tp-<hash of the fields below>: stable across compilations
	Source    string // endpoint namespace/name
	Monitor   string // monitor endpoint namespace/name
	Direction string // ingress, egress, both
	Protocol  string // TCP, UDP, ICMP, any
	Port      uint16 // 0: any
	Action    string // mirror, redirect
	// Why are the derivations of the contract (of its inspect request when placed).
	Why []Derivation
	// Placement says why the monitor was chosen, for a contract placed from an inspect
	// request; empty for a tap the policy derived itself.
	Placement string
}

// Derivation is one way a fact was derived: a rule of the policy and the facts its premises
// matched. Premises that are themselves derived carry their own derivations.
type Derivation struct {
	Rule    string    // the rule, as the parser prints it
	Line    int       // its line in the policy
	Facts   []string  // the premises with the values that matched
	Derived []Premise // the derived premises, explained in turn
}

// Premise is a derived premise and how it was derived.
type Premise struct {
	Fact string
	Why  []Derivation
}

// Unplaced is an inspect request no monitor could take.
type Unplaced struct {
	Request string // the inspect fact
	Reason  string
	Why     []Derivation
}

// Result is what a compilation produced.
type Result struct {
	Strategy  string // the placement strategy used: per-node or per-app
	Contracts []Contract
	Unplaced  []Unplaced
	// Missing says why a policy yields nothing (no contract, no request): each premise
	// of the rules toward tap and inspect that no fact matches, with its rule's line, or
	// why none could be named. Empty when the policy yields something.
	Missing []string
}

// Placement strategies (seeds/002, section III-C).
const (
	PerNode = "per-node" // a monitor per node; a node's sources sliced across its monitors by load
	PerApp  = "per-app"  // a monitor per application: label rampart.io/monitor-for=<app>
)

// MonitorForLabel on a monitor names the application (the value of its sources' app label)
// it serves under the per-app strategy.
const MonitorForLabel = "rampart.io/monitor-for"

// The predicates a policy derives.
var (
	tapSym       = ast.PredicateSym{Symbol: "tap", Arity: 6}
	inspectSym   = ast.PredicateSym{Symbol: "inspect", Arity: 6}
	placementSym = ast.PredicateSym{Symbol: "placement", Arity: 1}
)

// whyPrefix starts the names of the provenance rules the compiler adds.
const whyPrefix = "rampart_why_"

// rule is a rule of the policy with its provenance predicate.
type rule struct {
	clause ast.Clause
	line   int
	why    ast.PredicateSym // zero when the rule cannot be explained (a transform)
	vars   []ast.Variable   // the provenance predicate's arguments
}

// Compile evaluates the tap policy src (file names it in errors) over facts.
func Compile(file string, src []byte, facts Facts) (*Result, error) {
	if len(src) > MaxSourceBytes {
		return nil, fmt.Errorf("tap policy %s: %d bytes, more than the %d a policy may have", file, len(src), MaxSourceBytes)
	}
	if bytes.Contains(src, []byte(whyPrefix)) {
		return nil, fmt.Errorf("tap policy %s: names starting with %s are reserved", file, whyPrefix)
	}
	unit, err := parse.Unit(bytes.NewReader(append([]byte(schema), src...)))
	if err != nil {
		return nil, fmt.Errorf("tap policy %s: %s", file, shiftLines(err.Error()))
	}
	lines := clauseLines(src)
	var rules []rule
	var whyClauses []ast.Clause
	for _, c := range unit.Clauses {
		if len(c.Premises) == 0 {
			continue
		}
		r := rule{clause: c, line: lines[c.Head.Predicate.Symbol+"#"+strconv.Itoa(len(rules))]}
		if c.Transform == nil {
			r.vars = premiseVars(c)
			r.why = ast.PredicateSym{Symbol: fmt.Sprintf("%s%d", whyPrefix, len(rules)), Arity: len(r.vars)}
			args := make([]ast.BaseTerm, len(r.vars))
			for i, v := range r.vars {
				args[i] = v
			}
			whyClauses = append(whyClauses, ast.Clause{Head: ast.Atom{Predicate: r.why, Args: args}, Premises: c.Premises})
		}
		rules = append(rules, r)
	}
	unit.Clauses = append(unit.Clauses, whyClauses...)
	info, err := analysis.AnalyzeOneUnit(unit, nil)
	if err != nil {
		return nil, fmt.Errorf("tap policy %s: %s", file, shiftLines(err.Error()))
	}
	for _, c := range unit.Clauses {
		if d, ok := info.Decls[c.Head.Predicate]; ok && d.IsExtensional() {
			return nil, fmt.Errorf("tap policy %s: %s: %s is a fact Rampart supplies; a policy may not define it", file, c.Head, c.Head.Predicate.Symbol)
		}
	}
	for _, sym := range []ast.PredicateSym{tapSym, inspectSym, placementSym} {
		for p := range info.IdbPredicates {
			if p.Symbol == sym.Symbol && p.Arity != sym.Arity {
				return nil, fmt.Errorf("tap policy %s: %s has %d arguments, want %d (%s)", file, p.Symbol, p.Arity, sym.Arity, signature(sym))
			}
		}
	}
	st, err := facts.store()
	if err != nil {
		return nil, err
	}
	for _, f := range info.InitialFacts {
		st.Add(f)
	}
	if err := engine.EvalProgram(info, st, engine.WithCreatedFactLimit(MaxDerivedFacts)); err != nil {
		return nil, fmt.Errorf("tap policy %s: evaluating (at most %d derived facts): %w", file, MaxDerivedFacts, err)
	}
	c := &compilation{file: file, store: st, rules: rules, facts: facts}
	return c.result()
}

// signature documents a derived predicate in errors.
func signature(sym ast.PredicateSym) string {
	switch sym {
	case tapSym:
		return "tap(Source, Monitor, Direction, Protocol, Port, Action)"
	case inspectSym:
		return "inspect(Source, What, Direction, Protocol, Port, Action)"
	}
	return "placement(Strategy)"
}

// premiseVars are the variables of c's premises (its head's are among them: rules are
// safe), in a stable order, without the wildcard.
func premiseVars(c ast.Clause) []ast.Variable {
	m := map[ast.Variable]bool{}
	for _, p := range c.Premises {
		ast.AddVars(p, m)
	}
	var out []ast.Variable
	for v := range m {
		if v.Symbol != "_" {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Symbol < out[j].Symbol })
	return out
}

// clauseLines maps the n-th rule (predicate#n) to its line in src: the line of the ":-"
// that ends its head. Parsed clauses carry no positions; rules appear in the unit in the
// order of the text.
func clauseLines(src []byte) map[string]int {
	out := map[string]int{}
	n := 0
	for i, line := range strings.Split(string(src), "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "#") || !strings.Contains(t, ":-") {
			continue
		}
		head := strings.TrimSpace(t[:strings.Index(t, ":-")])
		if j := strings.IndexByte(head, '('); j > 0 {
			head = head[:j]
		}
		out[head+"#"+strconv.Itoa(n)] = i + 1
		n++
	}
	return out
}

// lineCol is a parser position, line:column, in an error message.
var lineCol = regexp.MustCompile(`(^|\s)(\d+):(\d+)(\s)`)

// shiftLines rewrites the positions in a parser message to the policy's own line numbers
// (the schema's declarations come first in what is parsed), as "line L:C".
func shiftLines(msg string) string {
	return lineCol.ReplaceAllStringFunc(msg, func(m string) string {
		g := lineCol.FindStringSubmatch(m)
		n, _ := strconv.Atoi(g[2])
		if n > schemaLines {
			n -= schemaLines
		}
		return fmt.Sprintf("%sline %d:%s%s", g[1], n, g[3], g[4])
	})
}

type compilation struct {
	file  string
	store factstore.FactStore
	rules []rule
	facts Facts
	memo  map[string][]Derivation
}

func (c *compilation) result() (*Result, error) {
	res := &Result{Strategy: PerNode}
	var strategies []string
	c.store.GetFacts(ast.NewQuery(placementSym), func(a ast.Atom) error {
		strategies = append(strategies, text(a.Args[0]))
		return nil
	})
	switch {
	case len(strategies) > 1:
		return nil, fmt.Errorf("tap policy %s: placement: %d strategies derived (%s), want one", c.file, len(strategies), strings.Join(strategies, ", "))
	case len(strategies) == 1:
		switch s := strings.ReplaceAll(strategies[0], "_", "-"); s {
		case PerNode, PerApp:
			res.Strategy = s
		default:
			return nil, fmt.Errorf("tap policy %s: placement(%q): want %s or %s", c.file, strategies[0], PerNode, PerApp)
		}
	}
	endpoints := map[string]Endpoint{}
	for _, e := range c.facts.Endpoints {
		endpoints[e.Key()] = e
	}
	byName := map[string]*Contract{}
	add := func(k Contract) {
		k.Name = contractName(k)
		if have, ok := byName[k.Name]; ok {
			have.Why = append(have.Why, k.Why...)
			return
		}
		byName[k.Name] = &k
	}
	var errs []error
	c.store.GetFacts(ast.NewQuery(tapSym), func(a ast.Atom) error {
		k, err := c.contract(a, endpoints)
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		k.Why = c.explain(a, 0)
		add(k)
		return nil
	})
	var requests []ast.Atom
	c.store.GetFacts(ast.NewQuery(inspectSym), func(a ast.Atom) error {
		requests = append(requests, a)
		return nil
	})
	sort.Slice(requests, func(i, j int) bool { return requests[i].String() < requests[j].String() })
	p := newPlacer(res.Strategy, c.facts)
	for _, a := range requests {
		k, err := c.request(a, endpoints)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		why := c.explain(a, 0)
		monitor, reason, ok := p.place(endpoints[k.Source], k.Monitor, k.Action == "redirect") // Monitor holds What here
		if !ok {
			res.Unplaced = append(res.Unplaced, Unplaced{Request: a.String(), Reason: reason, Why: why})
			continue
		}
		k.Monitor, k.Placement, k.Why = monitor, reason, why
		add(k)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for _, k := range byName {
		res.Contracts = append(res.Contracts, *k)
	}
	if len(res.Contracts) == 0 && len(res.Unplaced) == 0 {
		res.Missing = c.missing()
	}
	sort.Slice(res.Contracts, func(i, j int) bool {
		a, b := res.Contracts[i], res.Contracts[j]
		if a.Source != b.Source {
			return a.Source < b.Source
		}
		return a.Name < b.Name
	})
	return res, nil
}

func contractName(k Contract) string {
	sum := sha256.Sum256([]byte(strings.Join([]string{k.Source, k.Monitor, k.Direction, k.Protocol, strconv.Itoa(int(k.Port)), k.Action}, "|")))
	return "tp-" + hex.EncodeToString(sum[:5])
}

// contract reads a derived tap fact.
func (c *compilation) contract(a ast.Atom, endpoints map[string]Endpoint) (Contract, error) {
	k, err := c.fields(a, endpoints)
	if err != nil {
		return k, err
	}
	m, ok := endpoints[k.Monitor]
	if !ok {
		return k, fmt.Errorf("tap policy %s: derived %s: monitor %q is not an endpoint", c.file, a, k.Monitor)
	}
	if m.Monitor == nil {
		return k, fmt.Errorf("tap policy %s: derived %s: %s is not a monitor endpoint", c.file, a, k.Monitor)
	}
	return k, nil
}

// request reads a derived inspect fact; the returned contract's Monitor holds What until
// it is placed.
func (c *compilation) request(a ast.Atom, endpoints map[string]Endpoint) (Contract, error) {
	k, err := c.fields(a, endpoints)
	k.Monitor = strings.ToLower(k.Monitor)
	return k, err
}

// fields reads the six arguments tap and inspect share the shape of.
func (c *compilation) fields(a ast.Atom, endpoints map[string]Endpoint) (Contract, error) {
	bad := func(field, reason string) error {
		return fmt.Errorf("tap policy %s: derived %s: %s: %s", c.file, a, field, reason)
	}
	k := Contract{
		Source:    text(a.Args[0]),
		Monitor:   text(a.Args[1]),
		Direction: strings.ToLower(text(a.Args[2])),
		Protocol:  strings.ToUpper(text(a.Args[3])),
		Action:    strings.ToLower(text(a.Args[5])),
	}
	if _, ok := endpoints[k.Source]; !ok {
		return k, bad("source", fmt.Sprintf("%q is not an endpoint (want namespace/name)", k.Source))
	}
	switch k.Direction {
	case "ingress", "egress", "both":
	default:
		return k, bad("direction", fmt.Sprintf("%q: want ingress, egress or both", k.Direction))
	}
	switch k.Protocol {
	case "TCP", "UDP", "ICMP":
	case "ANY":
		k.Protocol = "any"
	default:
		return k, bad("protocol", fmt.Sprintf("%q: want TCP, UDP, ICMP or any", k.Protocol))
	}
	port, err := portOf(a.Args[4])
	if err != nil {
		return k, bad("port", err.Error())
	}
	if port != 0 && (k.Protocol == "ICMP" || k.Protocol == "any") {
		return k, bad("port", fmt.Sprintf("%d with protocol %s: ports belong to TCP and UDP", port, k.Protocol))
	}
	k.Port = port
	switch k.Action {
	case "mirror", "redirect":
	default:
		return k, bad("action", fmt.Sprintf("%q: want mirror or redirect", k.Action))
	}
	return k, nil
}

// text is a constant's text: a string's value, a name without its leading slash
// (/redirect and "redirect" mean the same), a number's digits.
func text(t ast.BaseTerm) string {
	k, ok := t.(ast.Constant)
	if !ok {
		return t.String()
	}
	switch k.Type {
	case ast.StringType:
		return k.Symbol
	case ast.NameType:
		return strings.TrimPrefix(k.Symbol, "/")
	case ast.NumberType:
		return strconv.FormatInt(k.NumValue, 10)
	}
	return k.String()
}

// portOf reads a port: a number 0..65535 (0: any), or "any".
func portOf(t ast.BaseTerm) (uint16, error) {
	k, ok := t.(ast.Constant)
	if ok && k.Type == ast.NumberType {
		if k.NumValue < 0 || k.NumValue > 65535 {
			return 0, fmt.Errorf("%d: want 0 (any) to 65535", k.NumValue)
		}
		return uint16(k.NumValue), nil
	}
	if s := text(t); s == "any" {
		return 0, nil
	}
	return 0, fmt.Errorf("%s: want a number 0 (any) to 65535 or \"any\"", t)
}

// explain lists the derivations of fact a: every rule whose provenance facts give back a
// when applied to its head, with its premises grounded; derived premises are explained in
// turn, to maxExplainDepth.
func (c *compilation) explain(a ast.Atom, depth int) []Derivation {
	key := a.String()
	if d, ok := c.memo[key]; ok {
		return d
	}
	if c.memo == nil {
		c.memo = map[string][]Derivation{}
	}
	c.memo[key] = nil // a recursive fact explains itself no further
	var out []Derivation
	for _, r := range c.rules {
		if r.clause.Head.Predicate != a.Predicate || r.why.Symbol == "" || len(out) >= maxDerivations {
			continue
		}
		c.store.GetFacts(whyQuery(r, a), func(w ast.Atom) error {
			if len(out) >= maxDerivations {
				return nil
			}
			subst := ast.ConstSubstMap{}
			for i, v := range r.vars {
				if k, ok := w.Args[i].(ast.Constant); ok {
					subst[v] = k
				}
			}
			if r.clause.Head.ApplySubst(subst).String() != key {
				return nil
			}
			d := Derivation{Rule: r.clause.String(), Line: r.line}
			for _, p := range r.clause.Premises {
				g := p.ApplySubst(subst)
				d.Facts = append(d.Facts, grounded(g))
				if ga, ok := g.(ast.Atom); ok && depth < maxExplainDepth && c.derived(ga.Predicate) {
					d.Derived = append(d.Derived, Premise{Fact: ga.String(), Why: c.explain(ga, depth+1)})
				}
			}
			out = append(out, d)
			return nil
		})
	}
	c.memo[key] = out
	return out
}

// errFound stops a store lookup at its first fact.
var errFound = errors.New("found")

// has says whether some fact matches premise a as the rule writes it: its constants
// bound, its variables free.
func (c *compilation) has(a ast.Atom) bool {
	return errors.Is(c.store.GetFacts(a, func(ast.Atom) error { return errFound }), errFound)
}

// missing names why nothing was derived: walking down from the rules that derive tap and
// inspect, each premise no fact matches (a premise the policy derives is followed into its
// own rules), as "premise (line N): no fact matches".
func (c *compilation) missing() []string {
	var out []string
	seen := map[string]bool{}
	visited := map[ast.PredicateSym]bool{}
	rules := 0
	var walk func(pred ast.PredicateSym, depth int)
	walk = func(pred ast.PredicateSym, depth int) {
		if visited[pred] || depth > maxExplainDepth {
			return
		}
		visited[pred] = true
		for _, r := range c.rules {
			if r.clause.Head.Predicate != pred {
				continue
			}
			rules++
			for _, p := range r.clause.Premises {
				a, ok := p.(ast.Atom)
				if !ok || c.has(a) {
					continue
				}
				if c.derived(a.Predicate) {
					walk(a.Predicate, depth+1)
					continue
				}
				m := fmt.Sprintf("%s (line %d): no fact matches", grounded(a), r.line)
				if !seen[m] {
					seen[m] = true
					out = append(out, m)
				}
			}
		}
	}
	walk(tapSym, 0)
	walk(inspectSym, 0)
	switch {
	case rules == 0:
		return []string{"no rule derives " + tapSym.Symbol + " or " + inspectSym.Symbol}
	case len(out) == 0:
		return []string{"every premise matches some fact, but no facts match together (their shared variables disagree, or a negation or comparison excludes them)"}
	}
	return out
}

// derived says whether the policy's rules define pred.
func (c *compilation) derived(pred ast.PredicateSym) bool {
	for _, r := range c.rules {
		if r.clause.Head.Predicate == pred {
			return true
		}
	}
	return false
}

// grounded renders a premise after substitution: a wildcard, which matched anything and is
// bound to nothing, prints as "_" (substitution leaves an empty constant in its place).
func grounded(t ast.Term) string {
	render := func(a ast.Atom) string {
		args := make([]string, len(a.Args))
		for i, x := range a.Args {
			if args[i] = x.String(); args[i] == "" {
				args[i] = "_"
			}
		}
		return a.Predicate.Symbol + "(" + strings.Join(args, ",") + ")"
	}
	switch a := t.(type) {
	case ast.Atom:
		return render(a)
	case ast.NegAtom:
		return "!" + render(a.Atom)
	}
	return t.String()
}

// whyQuery is the query for the provenance facts of rule r that can give back fact a: the
// variables of r's head bound to a's values, so the store reads the facts of those values
// (it indexes every argument) and not every derivation of the rule.
func whyQuery(r rule, a ast.Atom) ast.Atom {
	bind := map[ast.Variable]ast.BaseTerm{}
	for i, h := range r.clause.Head.Args {
		if v, ok := h.(ast.Variable); ok && v.Symbol != "_" && i < len(a.Args) {
			if k, ok := a.Args[i].(ast.Constant); ok {
				bind[v] = k
			}
		}
	}
	args := make([]ast.BaseTerm, len(r.vars))
	for i, v := range r.vars {
		args[i] = v
		if k, ok := bind[v]; ok {
			args[i] = k
		}
	}
	return ast.Atom{Predicate: r.why, Args: args}
}
