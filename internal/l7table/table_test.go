package l7table

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/policy"
)

var (
	client = netip.MustParseAddr("198.18.0.10")
	server = netip.MustParseAddr("198.18.0.20")
	other  = netip.MustParseAddr("198.18.0.30")
)

func peers(a ...netip.Addr) l7plan.AddrSet {
	var s l7plan.AddrSet
	for _, x := range a {
		s = append(s, l7plan.AddrRange{Prefix: netip.PrefixFrom(x, 32)})
	}
	return s
}

// TestMatchesPlan compares the kernel's decision (Allows, from the encoded table) with the
// plan's own (Plan.Allows, the semantics Envoy and the fast path enforce) on random rule
// sets and requests, for every table the kernel takes.
func TestMatchesPlan(t *testing.T) {
	long := "/" + strings.Repeat("a", 140)
	methodREs := []string{"", "GET", "GET|HEAD", "POST", "P.*", "(?i)get", "DELETE", "G.T", "PUT|PATCH"}
	pathREs := []string{"", "/v1", "/v1/.*", "/v1.*", ".*", "/v1/request-landing", "/public/.*", "/",
		"/v1/a", long[:PathMax-1], long[:PathMax], long[:PathMax] + ".*", long[:60] + ".*", "(/v1)"}
	hostREs := []string{"", "", "deathstar", "deathstar:80", ".*"}
	reqMethods := append(Methods[:], "PROPFIND")
	reqPaths := []string{"/", "/v1", "/v1/", "/v1/a", "/v1x", "/v1/request-landing", "/public/x", "/public",
		"/a", long, long[:PathMax-1], long[:PathMax], long[:PathMax+1], long[:61], "/v1/a/b"}
	reqHosts := []string{"deathstar", "deathstar:80", "DEATHSTAR", "other", strings.Repeat("h", 70)}
	headerRules := [][]policy.HeaderMatch{nil, nil, nil, {{Name: "x-a"}}, {{Name: "x-a", Value: "1"}},
		{{Name: "x-a", Value: "1"}, {Name: "x-b"}}, {{Name: "x-b", Value: "z"}}, {{Name: "x-a", Value: "2"}, {Name: "x-a"}}}
	reqHeaders := []map[string]string{{}, {"x-a": "1"}, {"x-a": "2"}, {"x-a": "1", "x-b": "z"}, {"x-b": ""},
		{"x-a": strings.Repeat("1", 70)}}

	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	authz := func(dir policy.Direction, peer netip.Addr) *l7plan.Authz {
		z := &l7plan.Authz{EndpointID: 1, Direction: dir, Port: 80}
		for g := range 1 + rng.IntN(3) {
			gr := l7plan.Grant{Name: "rule-" + string(rune('a'+g)), RuleID: uint32(g + 1)}
			switch rng.IntN(4) {
			case 0:
				gr.Peers = peers(other)
			default:
				gr.Peers = peers(peer)
			}
			if rng.IntN(8) == 0 {
				gr.Name = l7plan.GrantL3L4 // HTTP nil: every request
			} else {
				for range 1 + rng.IntN(4) {
					r := policy.HTTPRule{Method: pick(methodREs), Path: pick(pathREs), Host: pick(hostREs)}
					r.Headers = headerRules[rng.IntN(len(headerRules))]
					gr.HTTP = append(gr.HTTP, r)
				}
			}
			z.Grants = append(z.Grants, gr)
		}
		return z
	}
	compiled, decisions := 0, 0
	for range 3000 {
		c := l7plan.Chain{Name: "c", Port: 80, Src: client, Dst: server}
		if rng.IntN(3) > 0 {
			c.Ingress = authz(policy.Ingress, client)
		}
		if rng.IntN(3) == 0 || c.Ingress == nil {
			c.Egress = authz(policy.Egress, server)
		}
		plan := &l7plan.Plan{Chains: []l7plan.Chain{c}}
		tab, err := Compile(plan, client, server, 80)
		if err != nil {
			continue
		}
		compiled++
		for _, m := range reqMethods {
			for i, p := range reqPaths {
				for j, h := range reqHosts {
					hdr := reqHeaders[(i+j)%len(reqHeaders)]
					want := plan.Allows(l7plan.Request{Src: client, Dst: server, Port: 80, Method: m, Path: p, Host: h, Header: hdr})
					got, masks := tab.Allows(m, p, h, hdr)
					if m == "PROPFIND" {
						// Outside the kernel's subset: refused whatever the rules say.
						want = false
					}
					if got != want {
						t.Fatalf("%s %s host %s headers %v: kernel %v, plan %v\nchain egress %+v\ningress %+v\ntable %+v", m, p, h, hdr, got, want, c.Egress, c.Ingress, tab)
					}
					if got {
						checkRules(t, tab, masks)
					}
					decisions++
				}
			}
		}
	}
	if compiled < 1000 {
		t.Fatalf("only %d of 3000 random tables compiled: the generator no longer exercises the kernel's subset", compiled)
	}
	t.Logf("%d tables, %d decisions compared", compiled, decisions)
}

// checkRules: every bit a passing request reports names a rule of its side (or Pass).
func checkRules(t *testing.T, tab *Table, masks Masks) {
	t.Helper()
	for side, m := range masks {
		if tab.Header.Pass[side] != 0 {
			continue
		}
		if m == 0 || m>>len(tab.Rules[side]) != 0 {
			t.Fatalf("side %d: mask %#x for %d rules", side, m, len(tab.Rules[side]))
		}
	}
}

func TestRefusesWhatTheKernelCannotMatch(t *testing.T) {
	for _, tc := range []struct {
		rule policy.HTTPRule
		want string
	}{
		{policy.HTTPRule{Path: "/v1/[0-9]+"}, "literal"},
		{policy.HTTPRule{Path: "(?i)/v1"}, "literal"},
		{policy.HTTPRule{Path: "^/v1$"}, "literal"},
		{policy.HTTPRule{Path: "/" + strings.Repeat("a", PathMax)}, "longer than"},
		{policy.HTTPRule{Host: "death.*"}, "exact host"},
		{policy.HTTPRule{Host: "(?i)deathstar"}, "literal"},
		{policy.HTTPRule{Headers: []policy.HeaderMatch{{Name: "x-" + strings.Repeat("k", HeaderNameMax)}}}, "longer than"},
	} {
		plan := &l7plan.Plan{Chains: []l7plan.Chain{{Port: 80, Dst: server, Ingress: &l7plan.Authz{
			Direction: policy.Ingress, Port: 80,
			Grants: []l7plan.Grant{{Name: "rule-1-0", Peers: peers(client), HTTP: []policy.HTTPRule{tc.rule}}},
		}}}}
		_, err := Compile(plan, client, server, 80)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.rule, err, tc.want)
		}
	}
	var many []policy.HTTPRule
	for range MaxRules + 1 {
		many = append(many, policy.HTTPRule{Path: "/x"})
	}
	plan := &l7plan.Plan{Chains: []l7plan.Chain{{Port: 80, Dst: server, Ingress: &l7plan.Authz{
		Direction: policy.Ingress, Port: 80, Grants: []l7plan.Grant{{Name: "rule-1-0", Peers: peers(client), HTTP: many}},
	}}}}
	if _, err := Compile(plan, client, server, 80); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("%d rules: error %v", len(many), err)
	}
	if _, err := Compile(plan, client, server, 8080); err == nil {
		t.Errorf("a port without a chain compiled")
	}
}

// TestFortyRules: the benchmark's forty-rule policy fits, and each rule is told apart.
func TestFortyRules(t *testing.T) {
	var rules []policy.HTTPRule
	for i := range 40 {
		rules = append(rules, policy.HTTPRule{Method: "GET", Path: "/api/v" + string(rune('a'+i%26)) + "/item" + string(rune('0'+i/26)) + "/.*"})
	}
	plan := &l7plan.Plan{Chains: []l7plan.Chain{{Port: 80, Dst: server, Ingress: &l7plan.Authz{
		Direction: policy.Ingress, Port: 80, Grants: []l7plan.Grant{{Name: "rule-7-0", RuleID: 7, Peers: peers(client), HTTP: rules}},
	}}}}
	tab, err := Compile(plan, client, server, 80)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rules {
		p := strings.TrimSuffix(r.Path, ".*") + "x"
		ok, m := tab.Allows("GET", p, "h")
		if !ok || m[Ingress] != 1<<i || tab.Rules[Ingress][i].HTTP.Path != r.Path {
			t.Fatalf("GET %s: %v %#x", p, ok, m[Ingress])
		}
		if ok, _ := tab.Allows("POST", p, "h"); ok {
			t.Fatalf("POST %s allowed", p)
		}
	}
}
