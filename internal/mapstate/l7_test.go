package mapstate

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

var (
	landing = policy.HTTPRule{Method: "POST", Path: "/v1/request-landing"}
	getV1   = policy.HTTPRule{Method: "GET", Path: "/v1"}
	anyReq  = policy.HTTPRule{}
)

func l7(port uint16, hs ...policy.HTTPRule) policy.PortRule {
	return policy.PortRule{Protocol: policy.ProtoTCP, Port: port, HTTP: hs}
}

// starWars is the demo's world: the deathstar (1), a tiefighter (2) of the empire and an
// xwing (3) of the alliance, all in namespace default.
func starWars() *world {
	w := newWorld()
	w.endpoint(1, "default", "deathstar", "198.18.0.10", "org", "empire", "class", "deathstar")
	w.endpoint(2, "default", "tiefighter", "198.18.0.11", "org", "empire", "class", "tiefighter")
	w.endpoint(3, "default", "xwing", "198.18.0.12", "org", "alliance", "class", "xwing")
	return w
}

func (w *world) id(name string) identity.Identity { return w.ep("default", name).Identity }

func (w *world) ip(name string) netip.Addr { return w.ep("default", name).IP }

// ingressL7 is sw_l3_l4_l7_policy.yaml: the deathstar accepts org=empire on TCP 80 for
// POST /v1/request-landing only.
func ingressL7(t *testing.T, id uint32, peers []policy.Peer, ports ...policy.PortRule) policy.Rule {
	return policy.Rule{ID: id, Subject: matchLabels(t, "class", "deathstar"), Direction: policy.Ingress,
		EnableDefaultDeny: true, Peers: peers, AllPeers: peers == nil, Ports: ports}
}

func TestL7Ingress(t *testing.T) {
	w := starWars()
	w.rules(ingressL7(t, 1, []policy.Peer{endpointsPeer(matchLabels(t, "org", "empire"))}, l7(80, landing)))
	st := w.compute(t)

	empire := []identity.Identity{w.id("deathstar"), w.id("tiefighter")}
	slices.Sort(empire)
	for _, id := range empire {
		k := Key{Identity: id, Direction: policy.Ingress, Protocol: policy.ProtoTCP, Port: 80, PortPrefixLen: 16}
		if v := st.Endpoints[1].Entries[k]; v != (Value{RuleID: 1, Redirect: true}) {
			t.Errorf("entry %+v = %+v, want a redirect by rule 1", k, v)
		}
	}
	want := []L7Rule{{EndpointID: 1, Direction: policy.Ingress, Port: 80, Peers: empire, HTTP: []policy.HTTPRule{landing}, RuleID: 1}}
	if !reflect.DeepEqual(st.L7, want) {
		t.Fatalf("L7 = %+v\nwant %+v", st.L7, want)
	}
	if e := st.IPCache[netip.PrefixFrom(w.ip("deathstar"), 32)]; e.EndpointID != 1 {
		t.Errorf("deathstar ipcache entry %+v has no endpoint ID", e)
	}

	d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 80)
	if d.Verdict != Redirected || d.Reason != ReasonRedirected || d.RuleID != 1 || !reflect.DeepEqual(d.L7, want) {
		t.Errorf("tiefighter -> deathstar:80 = %+v", d)
	}
	if d := Lookup(st, 1, policy.Ingress, w.ip("xwing"), policy.ProtoTCP, 80); d.Verdict != Denied || d.Reason != ReasonDefaultDeny || d.L7 != nil {
		t.Errorf("xwing -> deathstar:80 = %+v", d)
	}
	if d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 81); d.Verdict != Denied {
		t.Errorf("tiefighter -> deathstar:81 = %+v", d)
	}
	if d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoUDP, 80); d.Verdict != Denied {
		t.Errorf("tiefighter -> deathstar:80/UDP = %+v", d)
	}

	// The state's HTTP rules are copies: changing them leaves the input alone.
	st.L7[0].HTTP[0].Method = "PUT"
	if w.in.Rules[0].Ports[0].HTTP[0].Method != "POST" {
		t.Error("State.L7 shares storage with the input rules")
	}
}

func TestL7PlainAllowOfTheSamePort(t *testing.T) {
	w := starWars()
	w.rules(
		ingressL7(t, 1, []policy.Peer{endpointsPeer(matchLabels(t, "class", "tiefighter"))}, l7(80, landing)),
		// A plain allow of the same port for the whole empire: the tiefighter's key becomes
		// a redirect, and rule 2 allows every request through the proxy.
		ingressL7(t, 2, []policy.Peer{endpointsPeer(matchLabels(t, "org", "empire"))}, tcp(80)),
	)
	st := w.compute(t)
	tf := Key{Identity: w.id("tiefighter"), Direction: policy.Ingress, Protocol: policy.ProtoTCP, Port: 80, PortPrefixLen: 16}
	ds := tf
	ds.Identity = w.id("deathstar")
	if v := st.Endpoints[1].Entries[tf]; v != (Value{RuleID: 1, Redirect: true}) {
		t.Errorf("tiefighter entry = %+v", v)
	}
	if v := st.Endpoints[1].Entries[ds]; v != (Value{RuleID: 2}) {
		t.Errorf("deathstar entry = %+v, want a plain allow (no L7 rule selects it)", v)
	}
	empire := []identity.Identity{w.id("deathstar"), w.id("tiefighter")}
	slices.Sort(empire)
	want := []L7Rule{
		{EndpointID: 1, Direction: policy.Ingress, Port: 80, Peers: []identity.Identity{w.id("tiefighter")}, HTTP: []policy.HTTPRule{landing}, RuleID: 1},
		{EndpointID: 1, Direction: policy.Ingress, Port: 80, Peers: empire, HTTP: []policy.HTTPRule{anyReq}, RuleID: 2},
	}
	if !reflect.DeepEqual(st.L7, want) {
		t.Fatalf("L7 = %+v\nwant %+v", st.L7, want)
	}
	d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 80)
	if d.Verdict != Redirected || d.RuleID != 1 || !reflect.DeepEqual(d.L7, want) {
		t.Errorf("tiefighter = %+v", d)
	}

	// Both in one rule (two toPorts entries): the rule allows every request.
	w.rules(ingressL7(t, 1, []policy.Peer{endpointsPeer(matchLabels(t, "class", "tiefighter"))}, l7(80, landing), tcp(80)))
	st = w.compute(t)
	if len(st.L7) != 1 || !reflect.DeepEqual(st.L7[0].HTTP, []policy.HTTPRule{anyReq}) || !st.Endpoints[1].Entries[tf].Redirect {
		t.Errorf("L7 plus plain port in one rule: L7 = %+v, entry %+v", st.L7, st.Endpoints[1].Entries[tf])
	}
}

func TestL7BroaderPlainAllow(t *testing.T) {
	w := starWars()
	tfPeer := []policy.Peer{endpointsPeer(matchLabels(t, "class", "tiefighter"))}
	w.rules(
		ingressL7(t, 1, tfPeer, l7(80, landing)),
		ingressL7(t, 2, tfPeer, policy.PortRule{Protocol: policy.ProtoTCP}), // every TCP port
		ingressL7(t, 3, tfPeer, policy.PortRule{Protocol: policy.ProtoTCP, Port: 64, EndPort: 127}),
	)
	st := w.compute(t)
	// The LPM finds the redirect for port 80 (longest), the range or all-ports allow
	// elsewhere.
	d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 80)
	if d.Verdict != Redirected || d.RuleID != 1 || d.Entry.PortPrefixLen != 16 {
		t.Fatalf("port 80 = %+v", d)
	}
	got := map[uint32][]policy.HTTPRule{}
	for _, r := range d.L7 {
		got[r.RuleID] = r.HTTP
	}
	want := map[uint32][]policy.HTTPRule{1: {landing}, 2: {anyReq}, 3: {anyReq}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("L7 for port 80 = %+v, want %+v", got, want)
	}
	if d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 81); d.Verdict != Allowed || d.RuleID != 3 || d.L7 != nil {
		t.Errorf("port 81 = %+v", d)
	}
	if d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 443); d.Verdict != Allowed || d.RuleID != 2 {
		t.Errorf("port 443 = %+v", d)
	}
	// Only the redirected port has L7 rules.
	for _, r := range st.L7 {
		if r.Port != 80 {
			t.Errorf("L7 rule for port %d: %+v", r.Port, r)
		}
	}
}

func TestL7AnyIdentity(t *testing.T) {
	w := starWars()
	tfPeer := []policy.Peer{endpointsPeer(matchLabels(t, "class", "tiefighter"))}
	// A specific redirect and a plain allow of everyone (identity Any): the tiefighter's
	// lookups give redirect (its identity) and allow (Any), so it is redirected, and rule
	// 2 lets it make every request. Everyone else is allowed without the proxy.
	w.rules(ingressL7(t, 1, tfPeer, l7(80, landing)), ingressL7(t, 2, nil, tcp(80)))
	st := w.compute(t)
	d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 80)
	wantL7 := []L7Rule{
		{EndpointID: 1, Direction: policy.Ingress, Port: 80, Peers: []identity.Identity{w.id("tiefighter")}, HTTP: []policy.HTTPRule{landing}, RuleID: 1},
		{EndpointID: 1, Direction: policy.Ingress, Port: 80, Peers: []identity.Identity{identity.Any}, HTTP: []policy.HTTPRule{anyReq}, RuleID: 2},
	}
	if d.Verdict != Redirected || d.RuleID != 1 || d.Entry.Identity != w.id("tiefighter") || !reflect.DeepEqual(d.L7, wantL7) {
		t.Errorf("tiefighter = %+v", d)
	}
	if d := Lookup(st, 1, policy.Ingress, w.ip("xwing"), policy.ProtoTCP, 80); d.Verdict != Allowed || d.RuleID != 2 || d.Entry.Identity != identity.Any {
		t.Errorf("xwing = %+v", d)
	}
	if d := Lookup(st, 1, policy.Ingress, netip.MustParseAddr("8.8.8.8"), policy.ProtoTCP, 80); d.Verdict != Allowed {
		t.Errorf("world = %+v", d)
	}

	// The other way round: an L7 rule for everyone and a plain allow for the tiefighter.
	// Everyone is redirected; the tiefighter may make every request, the others only
	// landing requests.
	w.rules(ingressL7(t, 1, nil, l7(80, landing)), ingressL7(t, 2, tfPeer, tcp(80)))
	st = w.compute(t)
	d = Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 80)
	if d.Verdict != Redirected || d.RuleID != 1 || d.Entry.Identity != identity.Any || len(d.L7) != 2 {
		t.Errorf("tiefighter = %+v", d)
	}
	d = Lookup(st, 1, policy.Ingress, w.ip("xwing"), policy.ProtoTCP, 80)
	if d.Verdict != Redirected || len(d.L7) != 1 || d.L7[0].RuleID != 1 {
		t.Errorf("xwing = %+v", d)
	}
}

func TestL7SecondaryIdentity(t *testing.T) {
	w := starWars()
	// The redirect comes from the tiefighter's address range (its secondary identity), the
	// plain allow from its labels: both apply to its connections.
	w.rules(
		ingressL7(t, 1, []policy.Peer{cidrPeer("198.18.0.0/24")}, l7(80, landing)),
		ingressL7(t, 2, []policy.Peer{endpointsPeer(matchLabels(t, "class", "tiefighter"))}, tcp(80)),
	)
	st := w.compute(t)
	d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 80)
	if d.Verdict != Redirected || d.RuleID != 1 || d.Entry.Identity != d.Secondary || len(d.L7) != 2 {
		t.Fatalf("tiefighter = %+v", d)
	}
	// A plain CIDR allow for an address outside the cluster meets no L7 rule.
	if d := Lookup(st, 1, policy.Ingress, netip.MustParseAddr("198.18.0.99"), policy.ProtoTCP, 80); d.Verdict != Redirected || len(d.L7) != 1 {
		t.Errorf("198.18.0.99 = %+v", d)
	}
}

func TestL7DenyWins(t *testing.T) {
	w := starWars()
	empire := []policy.Peer{endpointsPeer(matchLabels(t, "org", "empire"))}
	w.rules(
		ingressL7(t, 1, empire, l7(80, landing)),
		// A broader deny of the tiefighter (every TCP port) turns its redirect into a deny.
		policy.Rule{ID: 2, Subject: matchLabels(t, "class", "deathstar"), Direction: policy.Ingress, Deny: true,
			Peers: []policy.Peer{endpointsPeer(matchLabels(t, "class", "tiefighter"))}, Ports: []policy.PortRule{{Protocol: policy.ProtoTCP}}},
	)
	st := w.compute(t)
	k := Key{Identity: w.id("tiefighter"), Direction: policy.Ingress, Protocol: policy.ProtoTCP, Port: 80, PortPrefixLen: 16}
	if v := st.Endpoints[1].Entries[k]; v != (Value{Deny: true, RuleID: 2}) {
		t.Errorf("tiefighter entry = %+v, want the deny", v)
	}
	if d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 80); d.Verdict != Denied || d.RuleID != 2 || d.L7 != nil {
		t.Errorf("tiefighter = %+v", d)
	}
	// The deathstar itself (org=empire) is still redirected; the denied tiefighter is not
	// listed, since it never reaches the proxy.
	want := []L7Rule{{EndpointID: 1, Direction: policy.Ingress, Port: 80, Peers: []identity.Identity{w.id("deathstar")}, HTTP: []policy.HTTPRule{landing}, RuleID: 1}}
	if !reflect.DeepEqual(st.L7, want) {
		t.Errorf("L7 = %+v\nwant %+v", st.L7, want)
	}

	// A deny of everyone on the port leaves no redirect, and no L7 rule.
	w.rules(ingressL7(t, 1, empire, l7(80, landing)),
		policy.Rule{ID: 2, Subject: matchLabels(t, "class", "deathstar"), Direction: policy.Ingress, Deny: true, AllPeers: true, Ports: []policy.PortRule{tcp(80)}})
	st = w.compute(t)
	if st.L7 != nil {
		t.Errorf("L7 = %+v under a deny of every peer", st.L7)
	}
	if d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 80); d.Verdict != Denied || d.RuleID != 2 {
		t.Errorf("tiefighter = %+v", d)
	}
}

func TestL7EgressNamedPort(t *testing.T) {
	w := starWars()
	w.ep("default", "deathstar").NamedPorts = map[string]NamedPort{"http": {Port: 8080, Protocol: policy.ProtoTCP}}
	w.ep("default", "xwing").NamedPorts = map[string]NamedPort{"http": {Port: 9090, Protocol: policy.ProtoAny}}
	// The tiefighter may send GET /v1 to any endpoint's "http" port.
	w.rules(policy.Rule{ID: 1, Subject: matchLabels(t, "class", "tiefighter"), Direction: policy.Egress, EnableDefaultDeny: true,
		Peers: []policy.Peer{endpointsPeer(matchLabels(t))},
		Ports: []policy.PortRule{{Protocol: policy.ProtoTCP, Name: "http", HTTP: []policy.HTTPRule{getV1}}}})
	st := w.compute(t)
	want := []L7Rule{
		{EndpointID: 2, Direction: policy.Egress, Port: 8080, Peers: []identity.Identity{w.id("deathstar")}, HTTP: []policy.HTTPRule{getV1}, RuleID: 1},
		{EndpointID: 2, Direction: policy.Egress, Port: 9090, Peers: []identity.Identity{w.id("xwing")}, HTTP: []policy.HTTPRule{getV1}, RuleID: 1},
	}
	if !reflect.DeepEqual(st.L7, want) {
		t.Fatalf("L7 = %+v\nwant %+v", st.L7, want)
	}
	if d := Lookup(st, 2, policy.Egress, w.ip("deathstar"), policy.ProtoTCP, 8080); d.Verdict != Redirected || !reflect.DeepEqual(d.L7, want[:1]) {
		t.Errorf("to deathstar:8080 = %+v", d)
	}
	// The xwing's port is not the deathstar's.
	if d := Lookup(st, 2, policy.Egress, w.ip("deathstar"), policy.ProtoTCP, 9090); d.Verdict != Denied {
		t.Errorf("to deathstar:9090 = %+v", d)
	}
}

func TestL7InvalidInput(t *testing.T) {
	w := starWars()
	peers := []policy.Peer{endpointsPeer(matchLabels(t, "org", "empire"))}
	w.rules(
		ingressL7(t, 1, peers, policy.PortRule{Protocol: policy.ProtoTCP, Port: 80, EndPort: 90, HTTP: []policy.HTTPRule{landing}}),
		policy.Rule{ID: 2, Subject: matchLabels(t, "class", "xwing"), Direction: policy.Ingress, Deny: true, AllPeers: true,
			Ports: []policy.PortRule{l7(80, landing)}},
		ingressL7(t, 3, peers, l7(81, policy.HTTPRule{Path: "(("})),
	)
	err := w.in.Check()
	for _, want := range []string{"rule 1", "port range", "rule 2", "deny rule cannot have L7 rules", "rule 3", "invalid regular expression"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check = %v, want it to mention %q", err, want)
		}
	}
	st := Compute(w.in)
	// Fail closed: the L7 range allows nothing, and the deny rule denies the whole port.
	if d := Lookup(st, 1, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 85); d.Verdict != Denied || d.Reason != ReasonDefaultDeny {
		t.Errorf("tiefighter -> deathstar:85 = %+v", d)
	}
	if d := Lookup(st, 3, policy.Ingress, w.ip("tiefighter"), policy.ProtoTCP, 80); d.Verdict != Denied || d.RuleID != 2 {
		t.Errorf("tiefighter -> xwing:80 = %+v", d)
	}
}

func TestTraceL7(t *testing.T) {
	w := starWars()
	w.rules(ingressL7(t, 7, []policy.Peer{endpointsPeer(matchLabels(t, "org", "empire"))}, l7(80, landing)))
	w.in.Rules[0].Description = "spec.ingress[0]"
	w.in.RulePolicies = map[uint32]PolicyRef{7: {Kind: policy.KindCiliumNetworkPolicy, Namespace: "default", Name: "rule1"}}
	st := w.compute(t)
	res, err := Trace(w.in, st, Query{From: TraceRef{Namespace: "default", Name: "tiefighter"}, To: TraceRef{Namespace: "default", Name: "deathstar"}, Protocol: policy.ProtoTCP, Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	if res.Verdict != Redirected || res.Egress.Decision.Verdict != Allowed || res.Ingress.Decision.Verdict != Redirected {
		t.Fatalf("trace = %+v", res)
	}
	in := res.Ingress
	wantL7 := []TraceL7{{Rule: RuleInfo{ID: 7, Policy: PolicyRef{Kind: policy.KindCiliumNetworkPolicy, Namespace: "default", Name: "rule1"}, Description: "spec.ingress[0]"}, HTTP: []policy.HTTPRule{landing}}}
	if in.Rule == nil || in.Rule.ID != 7 || in.Rule.Policy.Name != "rule1" || !reflect.DeepEqual(in.L7, wantL7) {
		t.Errorf("ingress check = %+v, rule %+v, L7 %+v", in, in.Rule, in.L7)
	}
	res, err = Trace(w.in, st, Query{From: TraceRef{Namespace: "default", Name: "xwing"}, To: TraceRef{Namespace: "default", Name: "deathstar"}, Protocol: policy.ProtoTCP, Port: 80})
	if err != nil || res.Verdict != Denied || res.Ingress.L7 != nil {
		t.Errorf("xwing trace = %+v, %v", res, err)
	}
}

func TestCombineVerdicts(t *testing.T) {
	cases := []struct{ a, b, want Verdict }{
		{Allowed, Allowed, Allowed},
		{Allowed, Redirected, Redirected},
		{Redirected, Redirected, Redirected},
		{Redirected, Denied, Denied},
		{Denied, Allowed, Denied},
		{Allowed, "bogus", Denied},
	}
	for _, c := range cases {
		if got := combine(c.a, c.b); got != c.want {
			t.Errorf("combine(%s, %s) = %s, want %s", c.a, c.b, got, c.want)
		}
	}
}
