package l7plan

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/l7plan/l7plantest"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

var testRequests = []Request{
	{Method: "GET", Path: "/v1", Host: "deathstar"},
	{Method: "POST", Path: "/v1/request-landing", Host: "deathstar"},
	{Method: "PUT", Path: "/v1/exhaust-port", Host: "deathstar"},
	{Method: "GET", Path: "/v1/", Host: "deathstar"},
	{Method: "GET", Path: "/v1", Host: "deathstar.empire", Header: map[string]string{"x-token": "vader"}},
	{Method: "DELETE", Path: "/storage/log", Host: "storage", Header: map[string]string{"x-token": "luke"}},
	{Method: "GET", Path: "/storage/log", Host: "storage"},
}

// reference decides a request from the state alone, with mapstate.Lookup (the dataplane's
// decision, an implementation independent of the plan's): the connection reaches the proxy
// if no side denies and some side redirects; a redirecting side passes the request if one
// of the decision's L7 rules matches it, an allowing side passes it as it is.
func reference(st mapstate.State, srcEP, dstEP uint32, r Request) (steered, allowed bool) {
	var ds []mapstate.Decision
	if srcEP != 0 {
		ds = append(ds, mapstate.Lookup(st, srcEP, policy.Egress, r.Dst, policy.ProtoTCP, r.Port))
	}
	if dstEP != 0 {
		ds = append(ds, mapstate.Lookup(st, dstEP, policy.Ingress, r.Src, policy.ProtoTCP, r.Port))
	}
	allowed = true
	for _, d := range ds {
		switch d.Verdict {
		case mapstate.Denied:
			return false, false
		case mapstate.Redirected:
			steered = true
			ok := false
			for _, l7 := range d.L7 {
				if httpMatches(l7.HTTP, r) {
					ok = true
				}
			}
			allowed = allowed && ok
		}
	}
	return steered, allowed
}

// checkPlan compares the plan with the reference for every source endpoint, every
// destination (endpoints and a world address), ports 80 and 8080 and every test request.
func checkPlan(t *testing.T, st mapstate.State, eps []mapstate.Endpoint, plan Plan) (steeredSeen int) {
	t.Helper()
	type dst struct {
		ip netip.Addr
		ep uint32
	}
	dsts := []dst{{netip.MustParseAddr("192.0.2.7"), 0}, {netip.MustParseAddr("203.0.113.9"), 0}}
	for _, e := range eps {
		dsts = append(dsts, dst{e.IP, e.ID})
	}
	for _, src := range eps {
		for _, d := range dsts {
			if d.ip == src.IP {
				continue
			}
			for _, port := range []uint16{80, 8080} {
				for _, req := range testRequests {
					r := req
					r.Src, r.Dst, r.Port = src.IP, d.ip, port
					steered, want := reference(st, src.ID, d.ep, r)
					if !steered {
						continue
					}
					steeredSeen++
					if plan.Chain(r.Src, r.Dst, port) == nil {
						t.Errorf("%v -> %v:%d is steered but has no chain", r.Src, r.Dst, port)
						continue
					}
					if got := plan.Allows(r); got != want {
						t.Errorf("%v -> %v:%d %s %s host %s: plan allows=%v, reference %v (chain %s)",
							r.Src, r.Dst, port, r.Method, r.Path, r.Host, got, want, plan.Chain(r.Src, r.Dst, port).Name)
					}
				}
			}
		}
	}
	return steeredSeen
}

func TestBuildPlanStarwars(t *testing.T) {
	w := l7plantest.NewWorld()
	st := w.Compute(t,
		// deathstar ingress: tiefighters may GET /v1 and POST /v1/request-landing.
		l7plantest.EndpointsRule(policy.Ingress, l7plantest.Sel(t, "class", "deathstar"), l7plantest.Sel(t, "class", "tiefighter"), l7plantest.L7Port(80, policy.HTTPRule{Method: "GET", Path: "/v1"}, policy.HTTPRule{Method: "POST", Path: "/v1/request-landing"})),
		// The storage endpoint may reach the deathstar on port 80 without L7 rules.
		l7plantest.EndpointsRule(policy.Ingress, l7plantest.Sel(t, "class", "deathstar"), l7plantest.Sel(t, "class", "storage"), []policy.PortRule{{Protocol: policy.ProtoTCP, Port: 80}}),
	)
	plan := BuildPlan(st, nil)
	if len(plan.Chains) != 1 || plan.Chains[0].Name != "in:198.18.0.20:80" {
		t.Fatalf("chains: %+v", plan.Chains)
	}
	z := plan.Chains[0].Ingress
	if z == nil || plan.Chains[0].Egress != nil || z.EndpointID != 3 {
		t.Fatalf("chain authorisation: %+v", plan.Chains[0])
	}
	// One grant for the tiefighters' L7 rule, and the l3l4 grant for storage, which the
	// deathstar allows without L7 rules (it reaches the proxy only if its own egress
	// policy redirects it).
	var names []string
	for _, g := range z.Grants {
		names = append(names, g.Name)
	}
	if strings.Join(names, " ") != "l3l4 rule-1-0" {
		t.Fatalf("grants: %v", names)
	}
	tie := Request{Src: netip.MustParseAddr("198.18.0.10"), Dst: netip.MustParseAddr("198.18.0.20"), Port: 80, Method: "GET", Path: "/v1"}
	if ok, g := z.Allows(tie); !ok || g.RuleID != 1 {
		t.Fatalf("tiefighter GET /v1: %v %+v", ok, g)
	}
	tie.Method = "PUT"
	if ok, _ := z.Allows(tie); ok {
		t.Fatal("tiefighter PUT allowed")
	}
	sto := Request{Src: netip.MustParseAddr("198.18.0.40"), Dst: netip.MustParseAddr("198.18.0.20"), Port: 80, Method: "PUT", Path: "/v1/exhaust-port"}
	if ok, _ := z.Allows(sto); !ok {
		t.Fatal("storage (plain allow on the port) refused by the proxy")
	}
	xw := Request{Src: netip.MustParseAddr("198.18.0.30"), Dst: netip.MustParseAddr("198.18.0.20"), Port: 80, Method: "GET", Path: "/v1"}
	if ok, _ := z.Allows(xw); ok {
		t.Fatal("xwing (no rule) allowed by the proxy")
	}
	if n := checkPlan(t, st, w.In.Endpoints, plan); n == 0 {
		t.Fatal("nothing steered: the test checks nothing")
	}
}

func TestBuildPlanPairsAndEgress(t *testing.T) {
	w := l7plantest.NewWorld()
	st := w.Compute(t,
		l7plantest.EndpointsRule(policy.Ingress, l7plantest.Sel(t, "class", "deathstar"), l7plantest.Sel(t, "org", "empire"), l7plantest.L7Port(80, policy.HTTPRule{Method: "GET|PUT", Path: "/v1.*"})),
		// tiefighter egress: to the deathstar only GET, with a header, to the world only
		// on the storage path; everything else on port 80 plainly allowed to storage.
		l7plantest.EndpointsRule(policy.Egress, l7plantest.Sel(t, "class", "tiefighter"), l7plantest.Sel(t, "class", "deathstar"), l7plantest.L7Port(80, policy.HTTPRule{Method: "GET", Headers: []policy.HeaderMatch{{Name: "X-Token", Value: "vader"}}}, policy.HTTPRule{Method: "PUT", Host: "deathstar"})),
		policy.Rule{Subject: l7plantest.Sel(t, "class", "tiefighter"), Direction: policy.Egress, EnableDefaultDeny: true,
			Peers: []policy.Peer{{Kind: policy.PeerCIDR, CIDR: netip.MustParsePrefix("192.0.2.0/24")}},
			Ports: l7plantest.L7Port(80, policy.HTTPRule{Path: "/storage/.*"})},
		l7plantest.EndpointsRule(policy.Egress, l7plantest.Sel(t, "class", "tiefighter"), l7plantest.Sel(t, "class", "storage"), nil),
		// A deny beats everything: no tiefighter2 to the deathstar.
		policy.Rule{Subject: l7plantest.Sel(t, "class", "deathstar"), Direction: policy.Ingress, Deny: true,
			Peers: []policy.Peer{{Kind: policy.PeerCIDR, CIDR: netip.MustParsePrefix("198.18.0.11/32")}}},
	)
	plan := BuildPlan(st, nil)
	var names []string
	for _, c := range plan.Chains {
		names = append(names, c.Name)
	}
	got := strings.Join(names, " ")
	for _, want := range []string{"in:198.18.0.20:80", "out:198.18.0.10:80", "out:198.18.0.11:80", "pair:198.18.0.10>198.18.0.20:80", "pair:198.18.0.11>198.18.0.20:80"} {
		if !strings.Contains(got, want) {
			t.Errorf("chains %q: missing %s", got, want)
		}
	}
	pair := plan.Chain(netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("198.18.0.20"), 80)
	if pair == nil || pair.Egress == nil || pair.Ingress == nil {
		t.Fatalf("pair chain: %+v", pair)
	}
	if n := checkPlan(t, st, w.In.Endpoints, plan); n < 20 {
		t.Fatalf("only %d steered requests: the test checks too little", n)
	}
}

// TestBuildPlanRandom compares plans with the reference on random rule sets.
func TestBuildPlanRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	steered := 0
	for iter := range 300 {
		w := l7plantest.NewWorld()
		rules := l7plantest.RandomRules(t, rng)
		st := w.Compute(t, rules...)
		plan := BuildPlan(st, nil)
		before := steered
		steered += checkPlan(t, st, w.In.Endpoints, plan)
		if t.Failed() {
			for _, r := range rules {
				t.Logf("rule: %s", policy.FormatRule(r))
			}
			t.Fatalf("iteration %d failed (%d steered)", iter, steered-before)
		}
	}
	if steered < 1000 {
		t.Fatalf("only %d steered requests checked", steered)
	}
	t.Logf("%d steered requests checked", steered)
}

// Chains of the state being replaced stay, with decisions from the new state, until the
// dataplane stops steering to them.
func TestBuildPlanKeepsOldChains(t *testing.T) {
	w := l7plantest.NewWorld()
	l7 := l7plantest.EndpointsRule(policy.Ingress, l7plantest.Sel(t, "class", "deathstar"), l7plantest.Sel(t, "class", "tiefighter"), l7plantest.L7Port(80, policy.HTTPRule{Method: "GET"}))
	old := w.Compute(t, l7)
	plain := l7
	plain.Ports = []policy.PortRule{{Protocol: policy.ProtoTCP, Port: 80}}
	next := w.Compute(t, plain)
	if p := BuildPlan(next, nil); len(p.Chains) != 0 {
		t.Fatalf("no L7 rules, chains %+v", p.Chains)
	}
	p := BuildPlan(next, &old)
	if len(p.Chains) != 1 {
		t.Fatalf("kept chains: %+v", p.Chains)
	}
	r := Request{Src: netip.MustParseAddr("198.18.0.10"), Dst: netip.MustParseAddr("198.18.0.20"), Port: 80, Method: "PUT", Path: "/x"}
	if !p.Allows(r) {
		t.Fatal("kept chain refuses what the new (plain) policy allows")
	}
	r.Src = netip.MustParseAddr("198.18.0.30")
	if p.Allows(r) {
		t.Fatal("kept chain allows what the new policy denies")
	}
}

func TestAddrSetExceptions(t *testing.T) {
	u := []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/0"),
		netip.MustParsePrefix("198.18.0.0/16"),
		netip.MustParsePrefix("198.18.0.0/24"),
		netip.MustParsePrefix("198.18.0.5/32"),
		netip.MustParsePrefix("198.18.1.5/32"),
	}
	s := addrSet(u, []netip.Prefix{u[0], u[3]})
	for a, want := range map[string]bool{
		"8.8.8.8": true, "198.18.0.5": true, "198.18.0.6": false, "198.18.2.1": false, "198.18.1.5": false,
	} {
		if got := s.Contains(netip.MustParseAddr(a)); got != want {
			t.Errorf("%s: %v, want %v", a, got, want)
		}
	}
	// Only the maximal exception is kept under 0.0.0.0/0.
	if len(s[0].Except) != 1 || s[0].Except[0] != u[1] {
		t.Errorf("exceptions of /0: %v", s[0].Except)
	}
}

// TestBuildPlanDualStack: a dual-stack endpoint (its IPv4 /32 and IPv6 /128 in the ipcache,
// one endpoint ID) gets chains for both addresses, and the plan decides requests over IPv6
// as the reference does, as it does over IPv4.
func TestBuildPlanDualStack(t *testing.T) {
	w := l7plantest.NewWorld()
	st := w.Compute(t,
		l7plantest.EndpointsRule(policy.Ingress, l7plantest.Sel(t, "class", "deathstar"), l7plantest.Sel(t, "class", "tiefighter"), l7plantest.L7Port(80, policy.HTTPRule{Method: "GET", Path: "/v1"})),
		l7plantest.EndpointsRule(policy.Egress, l7plantest.Sel(t, "class", "tiefighter"), l7plantest.Sel(t, "class", "deathstar"), l7plantest.L7Port(80, policy.HTTPRule{Method: "GET|PUT"})),
	)
	eps6 := make([]mapstate.Endpoint, 0, len(w.In.Endpoints))
	for _, e := range w.In.Endpoints {
		ip6 := netip.AddrFrom16([16]byte{0: 0x20, 1: 0x01, 3: 0x02, 15: e.IP.As4()[3]})
		p4 := netip.PrefixFrom(e.IP, 32)
		st.IPCache[netip.PrefixFrom(ip6, 128)] = st.IPCache[p4]
		e.IP = ip6
		eps6 = append(eps6, e)
	}
	plan := BuildPlan(st, nil)
	var names []string
	for _, c := range plan.Chains {
		names = append(names, c.Name)
	}
	got := strings.Join(names, " ")
	for _, want := range []string{"in:198.18.0.20:80", "in:2001:2::14:80", "pair:198.18.0.10>198.18.0.20:80", "pair:2001:2::a>2001:2::14:80"} {
		if !strings.Contains(got, want) {
			t.Errorf("chains %q: missing %s", got, want)
		}
	}
	if strings.Contains(got, "pair:198.18.0.10>2001:2::14") {
		t.Errorf("chains %q: a pair across families", got)
	}
	if n := checkPlan(t, st, eps6, plan); n == 0 {
		t.Fatal("nothing steered over IPv6: the test checks nothing")
	}
	if n := checkPlan(t, st, w.In.Endpoints, plan); n == 0 {
		t.Fatal("nothing steered over IPv4")
	}
}
