package agent

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/l7table"
)

// TestSendSidePairs: with the send-side verdict on, the agent lists the pairs of local
// endpoints whose L7 rules the kernel can match, with their tables, and takes them back
// when the rules go or cannot be matched in the kernel; with it off, it lists none.
func TestSendSidePairs(t *testing.T) {
	h := newHarness(t)
	h.a.Close()
	h.cfg.L7SendSide = true
	h.start()
	tie, ds, _ := starwars(h)
	if _, err := h.apply("l7.yaml", l7Deathstar); err != nil {
		t.Fatal(err)
	}
	pairs := listed(h.dp.sockPairs)
	if len(pairs) != 1 {
		t.Fatalf("pairs %+v, want tiefighter -> deathstar:80 alone (the xwing is refused at L3)", pairs)
	}
	p := pairs[0]
	if p.Client.String() != tie.IP || p.Server.String() != ds.IP || p.Port != 80 || p.ClientEpID != tie.EpID || p.ServerEpID != ds.EpID ||
		p.ClientNetns == "" || p.ServerNetns == "" || p.ClientNetns == p.ServerNetns {
		t.Fatalf("pair %+v", p)
	}
	for _, r := range []struct {
		method, path string
		want         bool
	}{{"GET", "/v1", true}, {"POST", "/v1/request-landing", true}, {"PUT", "/v1/exhaust-port", false}, {"GET", "/v1/", false}} {
		if got, _ := p.Table.Allows(r.method, r.path, "deathstar"); got != r.want {
			t.Errorf("%s %s: %v, want %v", r.method, r.path, got, r.want)
		}
	}
	// The table comes from the very plan the proxy was given for this change.
	if tab, err := l7table.Compile(h.prox.last().plan, p.Client, p.Server, 80); err != nil || !reflect.DeepEqual(tab, p.Table) {
		t.Errorf("the proxy's plan gives table %+v (%v), the pair has %+v", tab, err, p.Table)
	}
	if g := p.Table.Rules[1][0]; g.HTTP.Method != "GET" || g.HTTP.Path != "/v1" || g.RuleID == 0 {
		t.Errorf("rule 0: %+v", g)
	}
	if st, err := h.a.Status(context.Background()); err != nil || st.SendSide == nil || st.SendSide.Pairs != 1 {
		t.Errorf("status: %+v %v, want one send-side pair", st.SendSide, err)
	}

	// A rule the kernel cannot match: the pair goes back to the proxy.
	complex := strings.Replace(l7Deathstar, "- {method: GET, path: /v1}\n        - {method: POST, path: /v1/request-landing}",
		`- {method: GET, path: "/v1/[0-9]+"}`, 1)
	if complex == l7Deathstar {
		t.Fatal("the policy did not change")
	}
	if _, err := h.apply("l7.yaml", complex); err != nil {
		t.Fatal(err)
	}
	if len(listed(h.dp.sockPairs)) != 0 {
		t.Fatalf("pairs %+v for a rule the kernel cannot match", h.dp.sockPairs)
	}
	// Its open connections: refused, as the new rule cannot be matched in the kernel.
	if p := find(h.dp.sockPairs, tie.IP, ds.IP); p == nil || p.Table != nil {
		t.Fatalf("tiefighter -> deathstar after the change: %+v, want an unlisted pair with no table", p)
	}
	if _, err := h.apply("l7.yaml", l7Deathstar); err != nil {
		t.Fatal(err)
	}
	if len(listed(h.dp.sockPairs)) != 1 {
		t.Fatalf("pairs %+v after the rule came back", h.dp.sockPairs)
	}
	// The L7 rules go, L3/L4 still allows: unlisted, and its open connections pass
	// everything (the old state's chain, decided by the new state).
	if _, err := h.apply("l7.yaml", l3Deathstar); err != nil {
		t.Fatal(err)
	}
	if len(listed(h.dp.sockPairs)) != 0 {
		t.Fatalf("pairs %+v without L7 rules", h.dp.sockPairs)
	}
	p = *find(h.dp.sockPairs, tie.IP, ds.IP)
	if p.Table == nil || p.Table.Header.Pass != [2]uint64{1, 1} {
		t.Fatalf("tiefighter -> deathstar without L7 rules: table %+v, want every request passed", p.Table)
	}
	// That table comes from the plan the proxy kept the old chains in while the dataplane
	// moved (the update before the last, which dropped them).
	kept := h.prox.updates[h.prox.count()-2].plan
	if tab, err := l7table.Compile(kept, p.Client, p.Server, 80); err != nil || !reflect.DeepEqual(tab, p.Table) {
		t.Errorf("the proxy's kept plan gives table %+v (%v), the pair has %+v", tab, err, p.Table)
	}
	// The send-side verdict off: nothing listed.
	h.a.Close()
	h.cfg.L7SendSide = false
	h.start()
	if _, err := h.apply("l7.yaml", l7Deathstar); err != nil {
		t.Fatal(err)
	}
	if h.dp.sockPairs != nil {
		t.Fatalf("pairs %+v with the send-side verdict off", h.dp.sockPairs)
	}
	if st, _ := h.a.Status(context.Background()); st.SendSide != nil {
		t.Errorf("status with the send-side verdict off: %+v", st.SendSide)
	}
}

func listed(pairs []SockPair) []SockPair {
	var out []SockPair
	for _, p := range pairs {
		if p.Listed {
			out = append(out, p)
		}
	}
	return out
}

func find(pairs []SockPair, client, server string) *SockPair {
	for i := range pairs {
		if pairs[i].Client.String() == client && pairs[i].Server.String() == server {
			return &pairs[i]
		}
	}
	return nil
}
