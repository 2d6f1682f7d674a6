package tap

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/labels"
)

func sel(t *testing.T, k, v string) labels.Selector {
	t.Helper()
	r, err := labels.NewRequirement(k, "In", []string{v})
	if err != nil {
		t.Fatal(err)
	}
	return labels.Selector{}.With(r)
}

func ep(ns, name string, id uint32, ip string, l labels.Labels) Endpoint {
	return Endpoint{Namespace: ns, Name: name, ID: id, Addrs: []netip.Addr{netip.MustParseAddr(ip)}, Labels: labels.ForPod(ns, l, nil, "")}
}

func monitor(ns, name string, id uint32, ip string) Endpoint {
	e := ep(ns, name, id, ip, labels.Labels{"app": "ids"})
	e.Monitor = true
	return e
}

func rulesOf(res Resolution) []string {
	var out []string
	for _, r := range res.Rules {
		out = append(out, r.String())
	}
	return out
}

func wantRules(t *testing.T, res Resolution, want ...string) {
	t.Helper()
	if got := rulesOf(res); !slices.Equal(got, want) {
		t.Errorf("rules:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// A selector contract follows its endpoints: replicas added and removed, relabels; an
// endpoint contract follows its endpoint's address and id.
func TestResolveFollowsEndpoints(t *testing.T) {
	web := &Contract{Kind: KindTapContract, Name: "web", Source: Source{Selector: sel(t, "app", "web")}, Monitor: "sec/ids",
		Match: Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{80, 80}}}, Action: Mirror}
	db := &Contract{Kind: KindTapContract, Name: "db", Source: Source{Endpoint: "shop/db"}, Monitor: "sec/ids",
		Match: Match{Direction: Ingress, Protocol: ProtoTCP, Ports: []PortRange{{5432, 5432}}}, Action: Redirect}
	cs := []*Contract{web, db}
	ids := monitor("sec", "ids", 9, "198.18.0.9")
	eps := []Endpoint{ids, ep("shop", "web-1", 1, "198.18.0.1", labels.Labels{"app": "web"}), ep("shop", "db", 3, "198.18.0.3", nil)}

	res := Resolve(cs, eps, "")
	wantRules(t, res,
		"shop/db[0] db ingress TCP ports 5432 redirect -> sec/ids",
		"shop/web-1[0] web both TCP ports 80 mirror -> sec/ids")
	if r := res.Rules[0]; r.EndpointID != 3 || r.Monitor.ID != 9 {
		t.Errorf("rule %v: endpoint id %d, monitor id %d; want 3 and 9", r, r.EndpointID, r.Monitor.ID)
	}

	// A replica added.
	eps = append(eps, ep("shop", "web-2", 2, "198.18.0.2", labels.Labels{"app": "web"}))
	res = Resolve(cs, eps, "")
	wantRules(t, res,
		"shop/db[0] db ingress TCP ports 5432 redirect -> sec/ids",
		"shop/web-1[0] web both TCP ports 80 mirror -> sec/ids",
		"shop/web-2[0] web both TCP ports 80 mirror -> sec/ids")
	if got := res.Status["web"].Endpoints; !slices.Equal(got, []string{"shop/web-1", "shop/web-2"}) {
		t.Errorf("status endpoints %v", got)
	}

	// A relabel: web-1 leaves the selector.
	eps[1] = ep("shop", "web-1", 1, "198.18.0.1", labels.Labels{"app": "old"})
	res = Resolve(cs, eps, "")
	wantRules(t, res,
		"shop/db[0] db ingress TCP ports 5432 redirect -> sec/ids",
		"shop/web-2[0] web both TCP ports 80 mirror -> sec/ids")

	// A replica removed; db recreated with another id and address.
	eps = []Endpoint{ids, eps[1], ep("shop", "db", 7, "198.18.0.7", nil)}
	res = Resolve(cs, eps, "")
	wantRules(t, res, "shop/db[0] db ingress TCP ports 5432 redirect -> sec/ids")
	if res.Rules[0].EndpointID != 7 {
		t.Errorf("db rule has endpoint id %d, want 7", res.Rules[0].EndpointID)
	}
	if got := res.Status["web"].Endpoints; len(got) != 0 {
		t.Errorf("web taps %v, want nothing", got)
	}
}

// Without its monitor, a redirect fails closed (drop) unless it fails open by setting, and
// a mirror passes (its copies are lost); the monitor coming back restores the taps.
func TestResolveMonitorUnavailable(t *testing.T) {
	mk := func(name string, a Action, f FailMode, port uint16) *Contract {
		return &Contract{Kind: KindTapContract, Name: name, Source: Source{Endpoint: "shop/web"}, Monitor: "sec/ids",
			Match: Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{port, port}}}, Action: a, FailMode: f}
	}
	cs := []*Contract{mk("a-closed", Redirect, FailClosed, 1), mk("b-open", Redirect, FailOpen, 2), mk("c-mirror", Mirror, FailClosed, 3)}
	web := ep("shop", "web", 1, "198.18.0.1", nil)

	res := Resolve(cs, []Endpoint{web}, "")
	wantRules(t, res,
		"shop/web[0] a-closed both TCP ports 1 drop",
		"shop/web[1] b-open both TCP ports 2 pass",
		"shop/web[2] c-mirror both TCP ports 3 pass")
	if p := res.Status["a-closed"].MonitorProblem; p != "monitor sec/ids does not exist" {
		t.Errorf("monitor problem %q", p)
	}

	// The named endpoint exists but is no monitor: still unavailable.
	notMon := ep("sec", "ids", 9, "198.18.0.9", nil)
	res = Resolve(cs, []Endpoint{web, notMon}, "")
	if res.Rules[0].Effect != EffectDrop || res.Status["a-closed"].MonitorProblem != "endpoint sec/ids is not a monitor" {
		t.Errorf("with a non-monitor: %v, %q", res.Rules[0], res.Status["a-closed"].MonitorProblem)
	}

	res = Resolve(cs, []Endpoint{web, monitor("sec", "ids", 9, "198.18.0.9")}, "")
	wantRules(t, res,
		"shop/web[0] a-closed both TCP ports 1 redirect -> sec/ids",
		"shop/web[1] b-open both TCP ports 2 redirect -> sec/ids",
		"shop/web[2] c-mirror both TCP ports 3 mirror -> sec/ids")
}

// Rules are made for this node's endpoints only; a monitor on another node is named with
// its node and without an endpoint id of this node.
func TestResolveAcrossNodes(t *testing.T) {
	c := &Contract{Kind: KindTapContract, Name: "all", Source: Source{Selector: sel(t, "app", "web")}, Monitor: "sec/ids",
		Match: Match{Direction: Both}, Action: Mirror}
	local := ep("shop", "web-1", 1, "198.18.0.1", labels.Labels{"app": "web"})
	remote := ep("shop", "web-2", 0, "198.18.1.2", labels.Labels{"app": "web"})
	remote.Node = "node-b"
	mon := monitor("sec", "ids", 4, "198.18.1.9")
	mon.Node = "node-b"
	res := Resolve([]*Contract{c}, []Endpoint{local, remote, mon}, "")
	wantRules(t, res, "shop/web-1[0] all both any mirror -> sec/ids@node-b")
	if res.Rules[0].Monitor.ID != 0 || res.Rules[0].Monitor.Addrs[0] != netip.MustParseAddr("198.18.1.9") {
		t.Errorf("remote monitor %+v", res.Rules[0].Monitor)
	}
	// On node-b the same input gives node-b's endpoint.
	res = Resolve([]*Contract{c}, []Endpoint{local, remote, mon}, "node-b")
	wantRules(t, res, "shop/web-2[0] all both any mirror -> sec/ids")
}

// Monitors are never tapped, even by a selector that matches them.
func TestResolveSkipsMonitors(t *testing.T) {
	c := &Contract{Kind: KindTapContract, Name: "everything", Source: Source{}, Monitor: "sec/ids", Match: Match{Direction: Both}, Action: Mirror}
	res := Resolve([]*Contract{c}, []Endpoint{monitor("sec", "ids", 9, "198.18.0.9"), ep("shop", "web", 1, "198.18.0.1", nil)}, "")
	wantRules(t, res, "shop/web[0] everything both any mirror -> sec/ids")
}

// Overlapping contracts on one endpoint are conflicts naming both; disjoint ones and
// ones on different endpoints are not. CheckChanged refuses only what involves a change.
func TestResolveConflicts(t *testing.T) {
	mk := func(name string, s Source, m Match) *Contract {
		return &Contract{Kind: KindTapContract, Name: name, Source: s, Monitor: "sec/ids", Match: m, Action: Mirror}
	}
	http := mk("http", Source{Selector: sel(t, "app", "web")}, Match{Direction: Both, Protocol: ProtoTCP, Ports: []PortRange{{80, 80}}})
	mq := mk("mq", Source{Selector: sel(t, "app", "web")}, Match{Direction: Egress, Protocol: ProtoTCP, PeerPorts: []PortRange{{5672, 5672}}})
	all := mk("all-web1", Source{Endpoint: "shop/web-1"}, Match{Direction: Ingress})
	eps := []Endpoint{
		monitor("sec", "ids", 9, "198.18.0.9"),
		ep("shop", "web-1", 1, "198.18.0.1", labels.Labels{"app": "web"}),
		ep("shop", "web-2", 2, "198.18.0.2", labels.Labels{"app": "web"}),
	}
	// http and mq overlap: an egress packet from port 80 to port 5672 matches both.
	res := Resolve([]*Contract{http, mq}, eps, "")
	want := []Conflict{{"shop/web-1", "http", "mq"}, {"shop/web-2", "http", "mq"}}
	if !slices.Equal(res.Conflicts, want) {
		t.Errorf("conflicts %v, want %v", res.Conflicts, want)
	}
	err := CheckChanged(res, []*Contract{http, mq}, []string{"mq"})
	var oe *OverlapError
	if !errors.As(err, &oe) || !strings.Contains(err.Error(), "tap contracts http and mq overlap on endpoint shop/web-1") || !strings.Contains(err.Error(), "1 more") {
		t.Errorf("CheckChanged = %v", err)
	}
	if err := CheckChanged(res, []*Contract{http, mq}, []string{"other"}); err != nil {
		t.Errorf("CheckChanged of an unrelated change = %v", err)
	}

	// Made disjoint (the web server's own port only as endpoint port on ingress).
	http.Match.Direction = Ingress
	res = Resolve([]*Contract{http, mq}, eps, "")
	if len(res.Conflicts) != 0 {
		t.Errorf("conflicts %v, want none", res.Conflicts)
	}
	// An endpoint contract meets the selector one on web-1 only.
	res = Resolve([]*Contract{http, mq, all}, eps, "")
	want = []Conflict{{"shop/web-1", "all-web1", "http"}}
	if !slices.Equal(res.Conflicts, want) {
		t.Errorf("conflicts %v, want %v", res.Conflicts, want)
	}
	wantRules(t, res,
		"shop/web-1[0] all-web1 ingress any mirror -> sec/ids",
		"shop/web-1[1] http ingress TCP ports 80 mirror -> sec/ids",
		"shop/web-1[2] mq egress TCP peer-ports 5672 mirror -> sec/ids",
		"shop/web-2[0] http ingress TCP ports 80 mirror -> sec/ids",
		"shop/web-2[1] mq egress TCP peer-ports 5672 mirror -> sec/ids")
}

// The result does not depend on the order of the input, and counters are summed per
// contract by the rules.
func TestResolveDeterministic(t *testing.T) {
	a := &Contract{Kind: KindTapContract, Name: "a", Source: Source{Selector: sel(t, "app", "web")}, Monitor: "sec/ids", Match: Match{Direction: Ingress}, Action: Mirror}
	b := &Contract{Kind: KindTapContract, Name: "b", Source: Source{Selector: sel(t, "app", "web")}, Monitor: "sec/ids", Match: Match{Direction: Egress}, Action: Redirect}
	eps := []Endpoint{ep("shop", "w2", 2, "198.18.0.2", labels.Labels{"app": "web"}), monitor("sec", "ids", 9, "198.18.0.9"), ep("shop", "w1", 1, "198.18.0.1", labels.Labels{"app": "web"})}
	r1 := Resolve([]*Contract{a, b}, eps, "")
	slices.Reverse(eps)
	r2 := Resolve([]*Contract{b, a}, eps, "")
	if !r1.RulesEqual(r2) {
		t.Errorf("order changed the rules:\n%v\n%v", rulesOf(r1), rulesOf(r2))
	}
	// The monitor moved: every rule changes.
	eps[1].Addrs = []netip.Addr{netip.MustParseAddr("198.18.0.99")}
	if r3 := Resolve([]*Contract{a, b}, eps, ""); r3.RulesEqual(r1) {
		t.Errorf("the monitor's new address left the rules equal: %v", rulesOf(r3))
	}
	counts := map[RuleKey]Counters{
		{1, "a"}: {MirroredPackets: 1, MirroredBytes: 100},
		{2, "a"}: {MirroredPackets: 2, MirroredBytes: 200},
		{1, "b"}: {RedirectedPackets: 5, DroppedByMonitor: 1},
		{7, "a"}: {MirroredPackets: 1000}, // no rule: not counted
	}
	per := PerContract(r1, counts)
	if per["a"] != (Counters{MirroredPackets: 3, MirroredBytes: 300}) || per["b"] != (Counters{RedirectedPackets: 5, DroppedByMonitor: 1}) {
		t.Errorf("per contract %+v", per)
	}
}

// Contracts naming one endpoint conflict before it exists; different endpoints or
// disjoint matches do not.
func TestNamedConflicts(t *testing.T) {
	mk := func(name, ep string, d Direction) *Contract {
		return &Contract{Kind: KindTapContract, Name: name, Source: Source{Endpoint: ep}, Monitor: "sec/ids", Match: Match{Direction: d}, Action: Mirror}
	}
	cs := []*Contract{mk("b", "shop/db", Ingress), mk("a", "shop/db", Both), mk("c", "shop/db", Egress), mk("d", "shop/web", Both)}
	want := []Conflict{{"shop/db", "a", "b"}, {"shop/db", "a", "c"}}
	if got := NamedConflicts(cs); !slices.Equal(got, want) {
		t.Errorf("NamedConflicts = %v, want %v", got, want)
	}
	// No endpoint exists: the resolution has nothing, the check still refuses.
	err := CheckChanged(Resolve(cs, nil, ""), cs, []string{"c"})
	if err == nil || !strings.Contains(err.Error(), "tap contracts a and c overlap on endpoint shop/db") {
		t.Errorf("CheckChanged = %v", err)
	}
	if err := CheckChanged(Resolve(cs, nil, ""), cs, []string{"d"}); err != nil {
		t.Errorf("CheckChanged(d) = %v", err)
	}
}
