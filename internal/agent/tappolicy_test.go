package agent

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/tappolicy"
)

// tapPolicySrc copies what reaches a web endpoint from outside to a monitor that inspects
// HTTP, and sends the database's connections through one that inspects PostgreSQL.
const tapPolicySrc = `# web traffic from outside, both ways, to any HTTP monitor
tap(S, M, "both", "TCP", 80, "mirror") :-
    label(S, "app", "web"), exposed(S), monitor(M, _), inspects(M, "http").

inspect(S, "pgsql", "ingress", "TCP", 5432, "redirect") :- label(S, "app", "db").
`

// denyIngressShop makes every endpoint of namespace shop admit nothing.
const denyIngressShop = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: shop}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`

// webFromWorld admits anyone outside the cluster to the web endpoints' port 80.
const webFromWorld = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-world, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: 0.0.0.0/0}}]
    ports: [{port: 80, protocol: TCP}]
`

func (h *harness) addInspector(ns, name string, what ...string) {
	h.t.Helper()
	l := map[string]string{"app": "ids"}
	for _, w := range what {
		l[InspectsLabelPrefix+w] = "true"
	}
	if _, err := h.a.AddEndpoint(context.Background(), api.EndpointSpec{Namespace: ns, Name: name, Labels: l, Monitor: true}); err != nil {
		h.t.Fatalf("adding monitor %s/%s: %v", ns, name, err)
	}
}

func (h *harness) addServer(ns, name, app string, port uint16) {
	h.t.Helper()
	spec := api.EndpointSpec{Namespace: ns, Name: name, Labels: map[string]string{"app": app},
		Ports: []api.NamedPort{{Name: "p", Port: port, Protocol: "TCP"}}}
	if _, err := h.a.AddEndpoint(context.Background(), spec); err != nil {
		h.t.Fatalf("adding %s/%s: %v", ns, name, err)
	}
}

func (h *harness) applyTapPolicy(src string) (api.ChangeResult, error) {
	return h.a.ApplyTapPolicy(context.Background(), api.TapPolicyRequest{File: "taps.mg", Source: src})
}

// installedSummary renders the installed rules without the generated contract names.
var tpName = regexp.MustCompile(`tp-[0-9a-f]{10}`)

func installedSummary(f *fakeTaps) []string {
	var out []string
	for _, r := range f.installed() {
		out = append(out, tpName.ReplaceAllString(r, "tp"))
	}
	return out
}

func wantRules(t *testing.T, f *fakeTaps, want ...string) {
	t.Helper()
	got := installedSummary(f)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("installed tap rules:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// The tap policy's contracts are installed, follow relabels, new endpoints, policy
// changes and a monitor added later, and survive a restart.
func TestTapPolicyFollowsModel(t *testing.T) {
	h := newTapHarness(t)
	ctx := context.Background()
	h.addInspector("sec", "ids", "http")
	h.addServer("shop", "web-1", "web", 80)
	h.addServer("shop", "db", "db", 5432)
	res, err := h.applyTapPolicy(tapPolicySrc)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changes) != 3 || res.Changes[0].Kind != KindTapPolicy || res.Changes[0].Action != "created" {
		t.Errorf("changes %+v", res.Changes)
	}
	// No ingress policy: web-1 admits everything, so it is exposed. "both" with a port is
	// two contracts, the server's own port in and the peer's out.
	web := []string{
		"shop/web-1[0] tp-in both TCP ports 80 mirror -> sec/ids",
		"shop/web-1[1] tp-out both TCP ports 1-79,81-65535 peer-ports 80 mirror -> sec/ids",
	}
	wantRules(t, h.dp.taps, web...)
	pol, err := h.a.GetTapPolicy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pol.Source != tapPolicySrc || len(pol.Contracts) != 1 || len(pol.Contracts[0].Taps) != 2 || len(pol.Unplaced) != 1 ||
		!strings.Contains(pol.Unplaced[0].Reason, `inspect "pgsql"`) {
		t.Errorf("tap policy %+v", pol)
	}
	ts, _ := h.a.ListTaps(ctx)
	if len(ts) != 2 || ts[0].Source != "tap policy taps.mg" || ts[0].Monitor != "sec/ids" {
		t.Errorf("listed %+v", ts)
	}

	// Relabelled away from web: its contracts go; a new web replica gets them.
	if _, err := h.a.LabelEndpoint(ctx, "shop", "web-1", api.LabelChange{Set: map[string]string{"app": "api"}}); err != nil {
		t.Fatal(err)
	}
	wantRules(t, h.dp.taps)
	h.addServer("shop", "web-2", "web", 80)
	wantRules(t, h.dp.taps, strings.ReplaceAll(web[0], "web-1", "web-2"), strings.ReplaceAll(web[1], "web-1", "web-2"))

	// Not exposed once policy admits nothing from outside; exposed again when port 80
	// admits the world.
	if _, err := h.apply("deny.yaml", denyIngressShop); err != nil {
		t.Fatal(err)
	}
	wantRules(t, h.dp.taps)
	if _, err := h.apply("world.yaml", webFromWorld); err != nil {
		t.Fatal(err)
	}
	web2 := []string{strings.ReplaceAll(web[0], "web-1", "web-2"), strings.ReplaceAll(web[1], "web-1", "web-2")}
	wantRules(t, h.dp.taps, web2...)

	// A PostgreSQL monitor added later takes the database's request.
	h.addInspector("sec", "pg", "pgsql")
	withDB := append([]string{"shop/db[0] tp both TCP ports 5432 redirect -> sec/pg"}, web2...)
	wantRules(t, h.dp.taps, withDB...)
	if pol, _ := h.a.GetTapPolicy(ctx); len(pol.Unplaced) != 0 || len(pol.Contracts) != 2 {
		t.Errorf("after the monitor: %+v", pol)
	}

	// A restart keeps the policy and what it yields.
	h.restart()
	wantRules(t, h.dp.taps, withDB...)
	if pol, err := h.a.GetTapPolicy(ctx); err != nil || pol.Source != tapPolicySrc || pol.Error != "" {
		t.Errorf("after restart: %+v, %v", pol, err)
	}

	// Deleted: its contracts go with it.
	if _, err := h.a.DeleteTapPolicy(ctx); err != nil {
		t.Fatal(err)
	}
	wantRules(t, h.dp.taps)
	if _, err := h.a.GetTapPolicy(ctx); !api.IsNotFound(err) {
		t.Errorf("get after delete: %v", err)
	}
	h.restart()
	wantRules(t, h.dp.taps)
}

// Overlap between the policy's contracts and the user's is refused as a whole, naming
// both, whichever comes second; nothing is applied.
func TestTapPolicyOverlapRefused(t *testing.T) {
	h := newTapHarness(t)
	ctx := context.Background()
	h.addInspector("sec", "ids", "http")
	h.addServer("shop", "web-1", "web", 80)
	if _, err := h.addTaps(tapWeb); err != nil { // web-http: both TCP ports 80 on app=web
		t.Fatal(err)
	}
	before := h.dp.taps.installed()
	_, err := h.applyTapPolicy(tapPolicySrc)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(err.Error(), "web-http") || !tpName.MatchString(err.Error()) {
		t.Fatalf("overlapping policy: %v", err)
	}
	if _, err := h.a.GetTapPolicy(ctx); !api.IsNotFound(err) {
		t.Errorf("a refused policy was kept: %v", err)
	}
	if got := h.dp.taps.installed(); strings.Join(got, "|") != strings.Join(before, "|") {
		t.Errorf("rules changed by a refused policy: %v", got)
	}
	// The other way round: the policy first, then the user's contract.
	if _, err := h.a.DeleteTap(ctx, "web-http"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.applyTapPolicy(tapPolicySrc); err != nil {
		t.Fatal(err)
	}
	if _, err := h.addTaps(tapWeb); err == nil || !strings.Contains(err.Error(), "web-http") || !tpName.MatchString(err.Error()) {
		t.Fatalf("overlapping contract: %v", err)
	}
	// A policy that does not compile is refused with its line.
	if _, err := h.applyTapPolicy("tap(S :- label(S).\n"); err == nil || !strings.Contains(err.Error(), "taps.mg") || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("a syntax error: %v", err)
	}
	if pol, _ := h.a.GetTapPolicy(ctx); pol.Source != tapPolicySrc {
		t.Errorf("policy after a refused replacement: %q", pol.Source)
	}
}

// A recompilation that fails keeps the last good contracts installed and reports the
// error in the status, until the policy compiles again.
func TestTapPolicyRecompileFailureKeepsLastGood(t *testing.T) {
	h := newTapHarness(t)
	ctx := context.Background()
	h.addInspector("sec", "ids", "pgsql")
	h.addServer("shop", "db", "db", 5432)
	// The monitor is named: without it the policy derives a contract for no endpoint.
	if _, err := h.applyTapPolicy(`tap(S, "sec/ids", "ingress", "TCP", 5432, "redirect") :- label(S, "app", "db").`); err != nil {
		t.Fatal(err)
	}
	want := "shop/db[0] tp both TCP ports 5432 redirect -> sec/ids"
	wantRules(t, h.dp.taps, want)
	if err := h.a.DeleteEndpoint(ctx, "sec", "ids"); err != nil {
		t.Fatal(err)
	}
	// The redirect stays, failing closed while its monitor is gone.
	wantRules(t, h.dp.taps, "shop/db[0] tp both TCP ports 5432 drop")
	st, _ := h.a.Status(ctx)
	if st.TapPolicy == nil || !strings.Contains(st.TapPolicy.Error, `"sec/ids" is not an endpoint`) || st.TapPolicy.Contracts != 1 {
		t.Fatalf("status %+v", st.TapPolicy)
	}
	// Also across a restart: the last good contracts are persisted.
	h.restart()
	wantRules(t, h.dp.taps, "shop/db[0] tp both TCP ports 5432 drop")
	if st, _ := h.a.Status(ctx); st.TapPolicy == nil || st.TapPolicy.Error == "" {
		t.Errorf("status after restart %+v", st.TapPolicy)
	}
	h.addInspector("sec", "ids", "pgsql")
	wantRules(t, h.dp.taps, want)
	if st, _ := h.a.Status(ctx); st.TapPolicy == nil || st.TapPolicy.Error != "" {
		t.Errorf("status once compiling again %+v", st.TapPolicy)
	}
}

// A dry run compiles against the agent's facts, explains, lists the facts, and applies
// nothing.
func TestTapPolicyCompileDryRun(t *testing.T) {
	h := newTapHarness(t)
	ctx := context.Background()
	h.addInspector("sec", "ids", "http")
	h.addServer("shop", "web-1", "web", 80)
	h.addServer("shop", "db", "db", 5432)
	res, err := h.a.CompileTapPolicy(ctx, api.TapPolicyRequest{File: "taps.mg", Source: tapPolicySrc, Explain: true, Facts: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Contracts) != 1 || len(res.Contracts[0].Why) != 1 || res.Contracts[0].Why[0].Line != 2 {
		t.Fatalf("contracts %+v", res.Contracts)
	}
	for _, f := range []string{`exposed("shop/web-1")`, `inspects("sec/ids","http")`, `monitor("sec/ids",_)`} {
		if !strings.Contains(strings.Join(res.Contracts[0].Why[0].Facts, " "), f) {
			t.Errorf("explanation lacks %s: %v", f, res.Contracts[0].Why[0].Facts)
		}
	}
	facts := strings.Join(res.Facts, "\n")
	for _, f := range []string{`port("shop/db","TCP",5432).`, `talks("shop/web-1","shop/db","TCP",5432).`, `node("local",3).`, `monitor_load("sec/ids",0).`} {
		if !strings.Contains(facts, f) {
			t.Errorf("facts lack %s:\n%s", f, facts)
		}
	}
	if len(h.dp.taps.installed()) != 0 {
		t.Errorf("a dry run installed %v", h.dp.taps.installed())
	}
	if _, err := h.a.GetTapPolicy(ctx); !api.IsNotFound(err) {
		t.Errorf("a dry run kept a policy: %v", err)
	}
	// Talks follow policy: denied ingress at the database removes them.
	if _, err := h.apply("deny.yaml", denyIngressShop); err != nil {
		t.Fatal(err)
	}
	res, err = h.a.CompileTapPolicy(ctx, api.TapPolicyRequest{File: "taps.mg", Source: tapPolicySrc, Facts: true})
	if err != nil {
		t.Fatal(err)
	}
	if facts := strings.Join(res.Facts, "\n"); strings.Contains(facts, "talks(") || strings.Contains(facts, `exposed("shop/`) {
		t.Errorf("facts under deny-all ingress:\n%s", strings.Join(res.Facts, "\n"))
	}
	if _, err := h.a.CompileTapPolicy(ctx, api.TapPolicyRequest{File: "big.mg", Source: strings.Repeat("#", tappolicy.MaxSourceBytes+1)}); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("an oversized policy: %v", err)
	}
}

// The talks facts are bounded: past the limit the policy is refused, naming the limit;
// a recompilation past it keeps the last good contracts.
func TestTapPolicyTalksBounded(t *testing.T) {
	h := newTapHarness(t)
	h.a.taps.SetTalksLimit(4)
	ctx := context.Background()
	h.addInspector("sec", "ids", "pgsql")
	h.addServer("shop", "db", "db", 5432)
	h.addServer("shop", "a", "a", 80)
	// 3 endpoints that all admit each other: sec/ids, shop/a, shop/db -> talks to a (2)
	// and to db (2); the limit of 4 holds.
	src := `tap(S, "sec/ids", "ingress", "TCP", 5432, "redirect") :- label(S, "app", "db"), talks(_, S, "TCP", 5432).`
	if _, err := h.applyTapPolicy(src); err != nil {
		t.Fatal(err)
	}
	h.addServer("shop", "b", "b", 80) // now 3 + 3 + 3 talks
	st, _ := h.a.Status(ctx)
	if st.TapPolicy == nil || !strings.Contains(st.TapPolicy.Error, "more than 4 talks facts") || st.TapPolicy.Contracts != 1 {
		t.Fatalf("status %+v", st.TapPolicy)
	}
	wantRules(t, h.dp.taps, "shop/db[0] tp both TCP ports 5432 redirect -> sec/ids")
	if _, err := h.applyTapPolicy(src + "\n"); err == nil || !strings.Contains(err.Error(), "more than 4 talks facts") {
		t.Errorf("a new policy past the limit: %v", err)
	}
	// A policy that does not read talks is not given them, nor bounded by them.
	if _, err := h.applyTapPolicy(`tap(S, "sec/ids", "ingress", "TCP", 5432, "redirect") :- label(S, "app", "db").`); err != nil {
		t.Errorf("a policy without talks: %v", err)
	}
}

// BenchmarkTapPolicyRelabel is the cost of a relabel on a node of 200 endpoints that all
// admit each other, without a tap policy, with one that reads no talks facts, and with one
// that joins over the 39,800 talks facts.
func BenchmarkTapPolicyRelabel(b *testing.B) {
	for _, bc := range []struct{ name, src string }{
		{"without", ""},
		{"exposed", `inspect(S, "http", "ingress", "TCP", 80, "mirror") :- label(S, "app", "web"), exposed(S).`},
		{"talks", `inspect(S, "http", "ingress", "TCP", 80, "mirror") :- label(S, "app", "web"), talks(_, S, "TCP", 80).`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := newHarness(b)
			h.dp.taps = &fakeTaps{}
			h.restart()
			h.addInspector("sec", "ids", "http")
			for i := range 200 {
				spec := api.EndpointSpec{Namespace: "shop", Name: "w" + strconv.Itoa(i), Labels: map[string]string{"app": "web"},
					Ports: []api.NamedPort{{Name: "http", Port: 80, Protocol: "TCP"}}}
				if _, err := h.a.AddEndpoint(context.Background(), spec); err != nil {
					b.Fatal(err)
				}
			}
			if bc.src != "" {
				if _, err := h.applyTapPolicy(bc.src); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				v := "a" + strconv.Itoa(i%2)
				if _, err := h.a.LabelEndpoint(context.Background(), "shop", "w0", api.LabelChange{Set: map[string]string{"tier": v}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Pods on other nodes are facts too: a monitor there serves its application (per-app
// placement) for copies, and the contract names its node; a redirect is placed on a
// monitor of the source's node only.
func TestTapPolicyRemoteMonitor(t *testing.T) {
	h := newTapHarness(t)
	ctx := context.Background()
	h.addServer("shop", "db", "db", 5432)
	if _, err := h.a.PutNode(ctx, "n2", api.NodeSpec{Address: "198.19.0.2", PodCIDR: "10.2.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	src := `placement(/per_app).
inspect(S, "pgsql", "ingress", "TCP", 5432, "mirror") :- label(S, "app", "db").
`
	if _, err := h.applyTapPolicy(src); err != nil {
		t.Fatal(err)
	}
	wantRules(t, h.dp.taps)
	if pol, _ := h.a.GetTapPolicy(ctx); len(pol.Unplaced) != 1 || !strings.Contains(pol.Unplaced[0].Reason, `no monitors of application "db"`) {
		t.Errorf("unplaced %+v", pol.Unplaced)
	}
	spec := api.RemoteEndpointSpec{Node: "n2", IP: "10.2.0.9", Monitor: true,
		Labels: map[string]string{tappolicy.MonitorForLabel: "db", InspectsLabelPrefix + "pgsql": "true"}}
	if _, err := h.a.PutRemoteEndpoint(ctx, "sec", "ids", spec); err != nil {
		t.Fatal(err)
	}
	wantRules(t, h.dp.taps, "shop/db[0] tp both TCP ports 5432 mirror -> sec/ids@n2")
	redirect := strings.Replace(src, `"mirror"`, `"redirect"`, 1)
	if _, err := h.applyTapPolicy(redirect); err != nil {
		t.Fatal(err)
	}
	wantRules(t, h.dp.taps)
	if pol, _ := h.a.GetTapPolicy(ctx); len(pol.Unplaced) != 1 || !strings.Contains(pol.Unplaced[0].Reason, "on node local inspect \"pgsql\" (a redirect's monitor runs on its source's node)") {
		t.Errorf("a redirect placed on another node's monitor: unplaced %+v", pol.Unplaced)
	}
	res, err := h.a.CompileTapPolicy(ctx, api.TapPolicyRequest{File: "taps.mg", Source: src, Facts: true})
	if err != nil {
		t.Fatal(err)
	}
	facts := strings.Join(res.Facts, "\n")
	for _, f := range []string{`endpoint("sec/ids","sec","n2").`, `monitor("sec/ids","n2").`, `node("n2",1).`, `node("local",1).`} {
		if !strings.Contains(facts, f) {
			t.Errorf("facts lack %s:\n%s", f, facts)
		}
	}
}

// The tap policy is compiled when its inputs change, not on every change of the model: a
// policy change leaves a tap policy that reads nothing of the computed policy (no exposed,
// no talks) uncompiled, and one that reads exposed is compiled again only when what a
// policy change does to exposure differs. A relabel, an input of every tap policy,
// compiles it.
func TestTapPolicyCompiledOnlyWhenItsInputsChange(t *testing.T) {
	h := newTapHarness(t)
	ctx := context.Background()
	h.addInspector("sec", "ids", "pgsql")
	h.addServer("shop", "db", "db", 5432)
	h.addServer("shop", "web-1", "web", 80)
	compilations := h.a.taps.Compilations
	if _, err := h.applyTapPolicy(`tap(S, "sec/ids", "ingress", "TCP", 5432, "mirror") :- label(S, "app", "db").`); err != nil {
		t.Fatal(err)
	}
	n := compilations()
	if n == 0 {
		t.Fatal("applying a tap policy compiled nothing")
	}
	for _, p := range []struct{ file, doc string }{{"deny.yaml", denyIngressShop}, {"world.yaml", webFromWorld}} {
		if _, err := h.apply(p.file, p.doc); err != nil {
			t.Fatal(err)
		}
		if got := compilations(); got != n {
			t.Fatalf("applying %s compiled a tap policy that reads no policy (%d compilations, want %d)", p.file, got, n)
		}
	}
	wantRules(t, h.dp.taps, "shop/db[0] tp both TCP ports 5432 mirror -> sec/ids")
	if _, err := h.a.LabelEndpoint(ctx, "shop", "db", api.LabelChange{Set: map[string]string{"tier": "data"}}); err != nil {
		t.Fatal(err)
	}
	if got := compilations(); got != n+1 {
		t.Fatalf("a relabel: %d compilations, want %d", got, n+1)
	}

	// A policy that reads exposed: a policy change that leaves every endpoint's exposure
	// as it was compiles nothing, one that changes it compiles once.
	if _, err := h.applyTapPolicy(tapPolicySrc); err != nil {
		t.Fatal(err)
	}
	n = compilations()
	if _, err := h.apply("world.yaml", strings.Replace(webFromWorld, "web-world", "web-world-2", 1)); err != nil {
		t.Fatal(err)
	}
	if got := compilations(); got != n {
		t.Errorf("a policy change that exposes nothing new: %d compilations, want %d", got, n)
	}
	if _, err := h.a.Delete(ctx, api.DeleteRequest{Documents: []api.Document{{Source: "world.yaml", Data: webFromWorld}, {Source: "world.yaml", Data: strings.Replace(webFromWorld, "web-world", "web-world-2", 1)}}}); err != nil {
		t.Fatal(err)
	}
	if got := compilations(); got != n+1 {
		t.Errorf("a policy change that hides web-1 from outside: %d compilations, want %d", got, n+1)
	}
	wantRules(t, h.dp.taps, "shop/db[0] tp both TCP ports 5432 redirect -> sec/ids")
}
