package tappolicy

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// rental is the DVD rental application of seeds/002 (Fig. 1b) on two nodes, with a
// PostgreSQL-aware monitor on each node and an HTTP one on n1.
func rental() Facts {
	ep := func(name, node, app string, exposed bool, ports ...Port) Endpoint {
		return Endpoint{Namespace: "dvd", Name: name, Node: node, Labels: map[string]string{"app": app}, Exposed: exposed, Ports: ports}
	}
	mon := func(name, node string, load int64, what ...string) Endpoint {
		return Endpoint{Namespace: "dvd", Name: name, Node: node, Labels: map[string]string{"role": "monitor"},
			Monitor: &Monitor{Inspects: what, Load: load}}
	}
	return Facts{
		Endpoints: []Endpoint{
			ep("contract-update", "n1", "contract-update", true, Port{"TCP", 8080}),
			ep("user-update", "n1", "user-update", true, Port{"TCP", 8080}),
			ep("dvd-update", "n2", "dvd-update", false, Port{"TCP", 8080}),
			ep("shipping", "n2", "shipping", false),
			ep("dvd-return", "n2", "dvd-return", false),
			ep("mq", "n2", "mq", false, Port{"TCP", 5672}),
			ep("db", "n1", "db", false, Port{"TCP", 5432}),
			mon("ids-1", "n1", 0, "pgsql", "http"),
			mon("ids-2", "n2", 0, "pgsql"),
		},
		Nodes: []Node{{"n1", 10}, {"n2", 20}},
		Talks: []Talk{
			{From: "dvd/user-update", To: "dvd/db", Protocol: "TCP", Port: 5432},
			{From: "dvd/contract-update", To: "dvd/db", Protocol: "TCP", Port: 5432},
		},
	}
}

const rentalPolicy = `# The database's connections go through a monitor that speaks PostgreSQL.
inspect(S, "pgsql", "ingress", "TCP", 5432, "redirect") :- label(S, "app", "db").

# What the outside can reach is copied to the HTTP monitor of its node.
tap(S, M, /ingress, /TCP, P, /mirror) :-
    exposed(S), port(S, "TCP", P), endpoint(S, _, N), monitor(M, N), inspects(M, "http").
`

func compile(t *testing.T, src string, f Facts) *Result {
	t.Helper()
	res, err := Compile("policy.mg", []byte(src), f)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return res
}

func find(res *Result, source, action string) *Contract {
	for i, k := range res.Contracts {
		if k.Source == source && k.Action == action {
			return &res.Contracts[i]
		}
	}
	return nil
}

func TestRentalContracts(t *testing.T) {
	res := compile(t, rentalPolicy, rental())
	if res.Strategy != PerNode || len(res.Unplaced) != 0 {
		t.Fatalf("strategy %s, unplaced %+v", res.Strategy, res.Unplaced)
	}
	var got []string
	for _, k := range res.Contracts {
		got = append(got, fmt.Sprintf("%s %s %s %s/%d %s", k.Source, k.Monitor, k.Direction, k.Protocol, k.Port, k.Action))
	}
	want := []string{
		"dvd/contract-update dvd/ids-1 ingress TCP/8080 mirror",
		"dvd/db dvd/ids-1 ingress TCP/5432 redirect", // the db is on n1: n1's pgsql monitor
		"dvd/user-update dvd/ids-1 ingress TCP/8080 mirror",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("contracts\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	db := find(res, "dvd/db", "redirect")
	if !strings.Contains(db.Placement, "least loaded of the monitors on node n1") || !strings.Contains(db.Placement, "dvd/ids-1 load 0") {
		t.Errorf("placement %q", db.Placement)
	}
	if len(db.Why) != 1 || db.Why[0].Line != 2 || !strings.HasPrefix(db.Why[0].Rule, "inspect(S") ||
		!reflect.DeepEqual(db.Why[0].Facts, []string{`label("dvd/db","app","db")`}) {
		t.Errorf("explanation of the db contract: %+v", db.Why)
	}
	cu := find(res, "dvd/contract-update", "mirror")
	if len(cu.Why) != 1 || cu.Why[0].Line != 5 || cu.Placement != "" {
		t.Fatalf("explanation of the mirror: %+v", cu)
	}
	for _, f := range []string{`exposed("dvd/contract-update")`, `port("dvd/contract-update","TCP",8080)`, `monitor("dvd/ids-1","n1")`, `inspects("dvd/ids-1","http")`} {
		if !contains(cu.Why[0].Facts, f) {
			t.Errorf("mirror explanation lacks %s: %v", f, cu.Why[0].Facts)
		}
	}
	// The same input compiles to the same contracts, names included.
	if again := compile(t, rentalPolicy, rental()); !reflect.DeepEqual(again, res) {
		t.Error("a second compilation differs")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Derived premises are explained down to the facts.
func TestExplainsDerivedPremises(t *testing.T) {
	const src = `critical(S) :- label(S, "app", "db").
critical(S) :- talks(S, D, _, _), critical(D).
inspect(S, "pgsql", "egress", "TCP", 5432, "mirror") :- critical(S), !label(S, "app", "db").
`
	res := compile(t, src, rental())
	k := find(res, "dvd/user-update", "mirror")
	if k == nil || len(k.Why) != 1 || len(k.Why[0].Derived) != 1 {
		t.Fatalf("contracts %+v", res.Contracts)
	}
	if !contains(k.Why[0].Facts, `!label("dvd/user-update","app","db")`) {
		t.Errorf("negated premise not shown grounded: %v", k.Why[0].Facts)
	}
	crit := k.Why[0].Derived[0]
	if crit.Fact != `critical("dvd/user-update")` || len(crit.Why) != 1 || crit.Why[0].Line != 2 {
		t.Fatalf("critical(user-update) explained as %+v", crit)
	}
	inner := crit.Why[0].Derived
	if len(inner) != 1 || inner[0].Fact != `critical("dvd/db")` || len(inner[0].Why) != 1 || inner[0].Why[0].Facts[0] != `label("dvd/db","app","db")` {
		t.Errorf("critical(db) explained as %+v", inner)
	}
}

// Per node, sources are sliced across the node's monitors by load.
func TestPerNodeSlicesByLoad(t *testing.T) {
	f := Facts{}
	for i := range 6 {
		f.Endpoints = append(f.Endpoints, Endpoint{Namespace: "web", Name: fmt.Sprintf("w%d", i), Node: "n1", Labels: map[string]string{"app": "web"}})
	}
	f.Endpoints = append(f.Endpoints,
		Endpoint{Namespace: "sec", Name: "m-a", Node: "n1", Monitor: &Monitor{Inspects: []string{"http"}, Load: 0}},
		Endpoint{Namespace: "sec", Name: "m-b", Node: "n1", Monitor: &Monitor{Inspects: []string{"any"}, Load: 2}},
		Endpoint{Namespace: "sec", Name: "m-c", Node: "n2", Monitor: &Monitor{Inspects: []string{"http"}, Load: 0}})
	res := compile(t, `inspect(S, "http", "both", "TCP", 80, "mirror") :- label(S, "app", "web").`, f)
	if len(res.Contracts) != 6 {
		t.Fatalf("%d contracts, want 6: %+v", len(res.Contracts), res.Unplaced)
	}
	count := map[string]int{}
	for _, k := range res.Contracts {
		count[k.Monitor]++
	}
	// m-a starts at 0, m-b at 2: m-a takes two, then they alternate (4 and 2 placed,
	// both end at load 4); m-c is on the other node.
	if count["sec/m-a"] != 4 || count["sec/m-b"] != 2 || count["sec/m-c"] != 0 {
		t.Errorf("placed %v, want m-a 4, m-b 2", count)
	}
}

func TestPerApp(t *testing.T) {
	f := rental()
	f.Endpoints = append(f.Endpoints, Endpoint{Namespace: "sec", Name: "db-ids", Node: "n2",
		Labels: map[string]string{MonitorForLabel: "db"}, Monitor: &Monitor{Inspects: []string{"pgsql"}}})
	src := `placement(/per_app).
inspect(S, "pgsql", "ingress", "TCP", 5432, "mirror") :- port(S, "TCP", 5432).
inspect(S, "amqp", "ingress", "TCP", 5672, "mirror") :- port(S, "TCP", 5672).
`
	res := compile(t, src, f)
	if res.Strategy != PerApp {
		t.Fatalf("strategy %s", res.Strategy)
	}
	// The db's monitor is the one for application db, on the other node.
	if len(res.Contracts) != 1 || res.Contracts[0].Source != "dvd/db" || res.Contracts[0].Monitor != "sec/db-ids" {
		t.Fatalf("contracts %+v", res.Contracts)
	}
	if len(res.Unplaced) != 1 || !strings.Contains(res.Unplaced[0].Request, "dvd/mq") ||
		!strings.Contains(res.Unplaced[0].Reason, `no monitors of application "mq"`) || len(res.Unplaced[0].Why) != 1 {
		t.Errorf("unplaced %+v", res.Unplaced)
	}
	// A redirect needs a monitor on its source's node: the db's is not.
	res = compile(t, strings.Replace(src, `5432, "mirror"`, `5432, "redirect"`, 1), f)
	if len(res.Contracts) != 0 || len(res.Unplaced) != 2 ||
		!strings.Contains(res.Unplaced[0].Reason, `no monitors of application "db" (label rampart.io/monitor-for=db) on node n1 inspect "pgsql" (a redirect's monitor runs on its source's node)`) {
		t.Errorf("a redirect through another node's monitor: contracts %+v, unplaced %+v", res.Contracts, res.Unplaced)
	}
}

// Bad policies are refused with the file, the place and the reason.
func TestRefusedPolicies(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"syntax", "critical(S) :- label(S, \"app\", \"db\").\n\ntap(S :- label(S).\n", "line 3:6"},
		{"action", `tap(S, "dvd/ids-1", "ingress", "TCP", 80, "copy") :- label(S, "app", "db").`, `action: "copy": want mirror or redirect`},
		{"direction", `tap(S, "dvd/ids-1", "in", "TCP", 80, "mirror") :- label(S, "app", "db").`, `direction: "in": want ingress, egress or both`},
		{"protocol", `tap(S, "dvd/ids-1", "ingress", "SCTP", 80, "mirror") :- label(S, "app", "db").`, `protocol: "SCTP"`},
		{"port range", `tap(S, "dvd/ids-1", "ingress", "TCP", 70000, "mirror") :- label(S, "app", "db").`, "port: 70000"},
		{"port with icmp", `tap(S, "dvd/ids-1", "ingress", "ICMP", 8, "mirror") :- label(S, "app", "db").`, "ports belong to TCP and UDP"},
		{"not a monitor", `tap(S, "dvd/mq", "ingress", "TCP", 80, "mirror") :- label(S, "app", "db").`, "dvd/mq is not a monitor endpoint"},
		{"unknown monitor", `tap(S, "dvd/nope", "ingress", "TCP", 80, "mirror") :- label(S, "app", "db").`, `monitor "dvd/nope" is not an endpoint`},
		{"unknown source", `tap("x/y", "dvd/ids-1", "ingress", "TCP", 80, "mirror") :- label(_, "app", "db").`, `source: "x/y" is not an endpoint`},
		{"arity", `tap(S, "dvd/ids-1") :- label(S, "app", "db").`, "tap has 2 arguments, want 6"},
		{"defines a fact predicate", `label("dvd/db", "tier", "data").`, "label"},
		{"strategy", `placement(/random).`, `placement("random")`},
		{"reserved", `rampart_why_0(S) :- label(S, "app", "db").`, "reserved"},
		{"too large", strings.Repeat("#", MaxSourceBytes+1), "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile("policy.mg", []byte(tc.src), rental())
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "policy.mg") {
				t.Errorf("error %v, want one naming policy.mg and %q", err, tc.want)
			}
		})
	}
}

// A policy whose rules derive without end stops at the fact limit with an error.
func TestDerivationIsBounded(t *testing.T) {
	_, err := Compile("policy.mg", []byte(`n(0).
n(Y) :- n(X), Y = fn:plus(X, 1).
`), rental())
	if err == nil || !strings.Contains(err.Error(), "policy.mg") || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("error %v, want the evaluation stopped at the limit", err)
	}
}

// Facts the agent hands in are checked too.
func TestBadFacts(t *testing.T) {
	f := rental()
	f.Endpoints = append(f.Endpoints, f.Endpoints[0])
	if _, err := Compile("policy.mg", []byte(rentalPolicy), f); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Errorf("duplicate endpoint: %v", err)
	}
}

// A policy that yields nothing says which premises matched no fact, following premises
// the policy derives into their own rules; one that yields something says nothing.
func TestMissingFacts(t *testing.T) {
	if res := compile(t, rentalPolicy, rental()); len(res.Contracts) == 0 || res.Missing != nil {
		t.Fatalf("rental: %d contracts, missing %v", len(res.Contracts), res.Missing)
	}
	src := `front(S) :- label(S, "app", "shop-front").
tap(S, M, /ingress, /TCP, 80, /mirror) :- front(S), monitor(M, N), endpoint(S, _, N), inspects(M, "http").
inspect(S, "pgsql", "ingress", "TCP", 5432, "redirect") :- label(S, "app", "postgres").
`
	res := compile(t, src, rental())
	want := []string{`label(S,"app","shop-front") (line 1): no fact matches`, `label(S,"app","postgres") (line 3): no fact matches`}
	if len(res.Contracts) != 0 || !reflect.DeepEqual(res.Missing, want) {
		t.Fatalf("missing %q, want %q", res.Missing, want)
	}
	// Every premise has facts, but not together.
	res = compile(t, `tap(S, M, /ingress, /TCP, 80, /mirror) :- label(S, "app", "db"), monitor(M, "n9").`, rental())
	if len(res.Missing) != 1 || !strings.Contains(res.Missing[0], `monitor(M,"n9")`) {
		t.Fatalf("missing %q", res.Missing)
	}
	res = compile(t, `tap(S, M, /ingress, /TCP, 80, /mirror) :- label(S, "app", "db"), label(M, "app", "mq"), endpoint(M, _, "n1").`, rental())
	if len(res.Missing) != 1 || !strings.Contains(res.Missing[0], "no facts match together") {
		t.Fatalf("missing %q", res.Missing)
	}
}
