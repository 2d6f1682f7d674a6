package mapstate

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
)

func TestPrefixes(t *testing.T) {
	rules := []policy.Rule{
		{Peers: []policy.Peer{
			cidrPeer("10.0.0.0/8", "10.1.0.0/16"),
			{Kind: policy.PeerCIDR, CIDR: netip.MustParsePrefix("192.168.1.7/24")}, // unmasked
			entityPeer(policy.EntityWorld),
		}},
		{Peers: []policy.Peer{
			cidrPeer("10.1.0.0/16"), // duplicate of an except
			cidrPeer("2001:db8::/32"),
			cidrPeer("0.0.0.0/0"),
			{Kind: policy.PeerCIDR}, // invalid: skipped
		}},
	}
	got := Prefixes(rules)
	want := []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/0"),
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("10.1.0.0/16"),
		netip.MustParsePrefix("192.168.1.0/24"),
		netip.MustParsePrefix("2001:db8::/32"),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Prefixes = %v, want %v", got, want)
	}
}

func TestEnforcementFlags(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "x", "b", "198.18.0.11", "pod", "b")
	w.endpoint(3, "y", "a", "198.18.0.12", "pod", "a")
	w.rules(
		// Default deny ingress for pods a in x, with no peers at all.
		policy.Rule{Subject: matchLabels(t, "pod", "a", labels.KeyNamespace, "x"), Direction: policy.Ingress, EnableDefaultDeny: true},
		// An egress allow that does not switch enforcement on (e.g. a CNP with
		// enableDefaultDeny.egress=false).
		policy.Rule{Subject: matchLabels(t, "pod", "b"), Direction: policy.Egress, AllPeers: true},
		// Egress enforcement for y/a.
		policy.Rule{Subject: matchLabels(t, labels.KeyNamespace, "y"), Direction: policy.Egress, EnableDefaultDeny: true, AllPeers: true},
	)
	st := w.compute(t)
	want := map[uint32][2]bool{1: {true, false}, 2: {false, false}, 3: {false, true}}
	for id, flags := range want {
		pol := st.Endpoints[id]
		if pol.EnforceIngress != flags[0] || pol.EnforceEgress != flags[1] {
			t.Errorf("endpoint %d: enforce ingress=%v egress=%v, want %v", id, pol.EnforceIngress, pol.EnforceEgress, flags)
		}
	}
	if len(st.Endpoints[1].Entries) != 0 {
		t.Errorf("default-deny-only rule produced entries %v", st.Endpoints[1].Entries)
	}
	if _, ok := st.Endpoints[2].Entries[Key{Identity: identity.Any, Direction: policy.Egress}]; !ok {
		t.Errorf("AllPeers egress rule did not produce the any-identity any-protocol entry: %v", st.Endpoints[2].Entries)
	}
}

func TestPeerSelection(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "x", "b", "198.18.0.11", "pod", "b")
	w.endpoint(3, "y", "b", "198.18.0.12", "pod", "b")
	w.endpoint(4, "x", "b2", "198.18.0.13", "pod", "b") // replica of x/b: same identity
	subject := matchLabels(t, "pod", "a", labels.KeyNamespace, "x")
	rule := func(peers ...policy.Peer) policy.Rule {
		return policy.Rule{Subject: subject, Direction: policy.Ingress, EnableDefaultDeny: true, Peers: peers}
	}
	idXA, idXB, idYB := w.ep("x", "a").Identity, w.ep("x", "b").Identity, w.ep("y", "b").Identity
	if w.ep("x", "b2").Identity != idXB {
		t.Fatalf("replicas got different identities")
	}

	allCIDR := func() []identity.Identity {
		var ids []identity.Identity
		for _, id := range w.in.CIDRIdentities {
			ids = append(ids, id)
		}
		return ids
	}
	cases := []struct {
		name  string
		rules []policy.Rule
		want  func() []identity.Identity
	}{
		{"endpoints by label", []policy.Rule{rule(endpointsPeer(matchLabels(t, "pod", "b")))},
			func() []identity.Identity { return []identity.Identity{idXB, idYB} }},
		{"endpoints by label and namespace", []policy.Rule{rule(endpointsPeer(matchLabels(t, "pod", "b", labels.KeyNamespace, "y")))},
			func() []identity.Identity { return []identity.Identity{idYB} }},
		{"selector matching nothing", []policy.Rule{rule(endpointsPeer(labels.None()))},
			func() []identity.Identity { return nil }},
		{"all peers", []policy.Rule{{Subject: subject, Direction: policy.Ingress, AllPeers: true}},
			func() []identity.Identity { return []identity.Identity{identity.Any} }},
		{"entity all", []policy.Rule{rule(entityPeer(policy.EntityAll))},
			func() []identity.Identity { return []identity.Identity{identity.Any} }},
		{"entity host", []policy.Rule{rule(entityPeer(policy.EntityHost))},
			func() []identity.Identity { return []identity.Identity{identity.Host} }},
		{"entity remote-node", []policy.Rule{rule(entityPeer(policy.EntityRemoteNode))},
			func() []identity.Identity { return []identity.Identity{identity.RemoteNode} }},
		{"entity health", []policy.Rule{rule(entityPeer(policy.EntityHealth))},
			func() []identity.Identity { return []identity.Identity{identity.Health} }},
		{"entity init", []policy.Rule{rule(entityPeer(policy.EntityInit))},
			func() []identity.Identity { return []identity.Identity{identity.Init} }},
		{"entity unmanaged", []policy.Rule{rule(entityPeer(policy.EntityUnmanaged))},
			func() []identity.Identity { return []identity.Identity{identity.Unmanaged} }},
		{"entity kube-apiserver", []policy.Rule{rule(entityPeer(policy.EntityKubeAPIServer))},
			func() []identity.Identity { return []identity.Identity{identity.KubeAPIServer} }},
		{"entity ingress selects nothing", []policy.Rule{rule(entityPeer(policy.EntityIngress))},
			func() []identity.Identity { return nil }},
		{"entity cluster", []policy.Rule{rule(entityPeer(policy.EntityCluster))},
			func() []identity.Identity {
				return []identity.Identity{idXA, idXB, idYB, identity.Host, identity.RemoteNode,
					identity.Health, identity.Init, identity.Unmanaged, identity.KubeAPIServer}
			}},
		{"entity world: World and plain CIDR identities", []policy.Rule{
			rule(entityPeer(policy.EntityWorld)),
			// Another rule's prefixes exist as CIDR identities too; it selects nothing here
			// because its subject matches no endpoint.
			{Subject: labels.None(), Direction: policy.Ingress, Peers: []policy.Peer{cidrPeer("10.0.0.0/8", "10.1.0.0/16")}},
		}, func() []identity.Identity { return append(allCIDR(), identity.World) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w.rules(c.rules...)
			st := w.compute(t)
			got := identitiesOf(st.Endpoints[1], policy.Ingress)
			if want := c.want(); !sameIDs(got, want...) {
				t.Fatalf("selected %v, want %v", got, want)
			}
		})
	}
}

func TestCIDRPeerSelection(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.rules(
		policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress, EnableDefaultDeny: true,
			Peers: []policy.Peer{cidrPeer("10.0.0.0/8", "10.1.0.0/16")}},
		// Prefixes used by other rules inside and outside the peer.
		policy.Rule{Subject: labels.None(), Direction: policy.Egress, Peers: []policy.Peer{
			cidrPeer("10.2.0.0/16"), cidrPeer("10.1.5.0/24"), cidrPeer("11.0.0.0/8"), cidrPeer("0.0.0.0/0"),
		}},
	)
	st := w.compute(t)
	got := identitiesOf(st.Endpoints[1], policy.Egress)
	flag := identity.EndpointCIDRFlag
	ten, two := w.cidrID(t, "10.0.0.0/8"), w.cidrID(t, "10.2.0.0/16")
	// 10.1.0.0/16 is excepted and so is 10.1.5.0/24 inside it; 11/8 and 0/0 are outside.
	if !sameIDs(got, ten, ten|flag, two, two|flag) {
		t.Fatalf("selected %v, want 10/8 and 10.2/16, plain and flagged", got)
	}
}

func TestCIDRPeerSlashZero(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.rules(policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress,
		Peers: []policy.Peer{cidrPeer("0.0.0.0/0", "10.0.0.0/8")}})
	st := w.compute(t)
	zero := w.cidrID(t, "0.0.0.0/0")
	if got := identitiesOf(st.Endpoints[1], policy.Egress); !sameIDs(got, zero, zero|identity.EndpointCIDRFlag, identity.World) {
		t.Fatalf("0.0.0.0/0 selected %v, want its CIDR identity plain and flagged, and World", got)
	}

	// ::/0 selects its own CIDR identities but not World: World also covers IPv4 addresses.
	w.rules(policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress,
		Peers: []policy.Peer{cidrPeer("::/0")}})
	st = w.compute(t)
	v6 := w.cidrID(t, "::/0")
	if got := identitiesOf(st.Endpoints[1], policy.Egress); !sameIDs(got, v6, v6|identity.EndpointCIDRFlag) {
		t.Fatalf("::/0 selected %v", got)
	}
}

func TestPortsInEntries(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "x", "b", "198.18.0.11", "pod", "b")
	peer := w.ep("x", "b").Identity
	subject := matchLabels(t, "pod", "a")
	w.rules(
		policy.Rule{Subject: subject, Direction: policy.Ingress, Peers: []policy.Peer{endpointsPeer(matchLabels(t, "pod", "b"))},
			Ports: []policy.PortRule{tcp(80), {Protocol: policy.ProtoAny, Port: 53}, {Protocol: policy.ProtoUDP},
				{Protocol: policy.ProtoTCP, Port: 8000, EndPort: 8003}, {Protocol: policy.ProtoICMP, Port: 8, ICMPType: true}}},
		policy.Rule{Subject: subject, Direction: policy.Egress, Peers: []policy.Peer{endpointsPeer(matchLabels(t, "pod", "b"))}},
	)
	st := w.compute(t)
	in := func(proto policy.Protocol, port uint16, plen uint8) Key {
		return Key{Identity: peer, Direction: policy.Ingress, Protocol: proto, Port: port, PortPrefixLen: plen}
	}
	want := map[Key]Value{
		in(policy.ProtoTCP, 80, 16):                {RuleID: 1},
		in(policy.ProtoTCP, 53, 16):                {RuleID: 1},
		in(policy.ProtoUDP, 53, 16):                {RuleID: 1},
		in(policy.ProtoSCTP, 53, 16):               {RuleID: 1},
		in(policy.ProtoUDP, 0, 0):                  {RuleID: 1},
		in(policy.ProtoTCP, 8000, 14):              {RuleID: 1},
		in(policy.ProtoICMP, 8, 16):                {RuleID: 1},
		{Identity: peer, Direction: policy.Egress}: {RuleID: 2},
	}
	got := st.Endpoints[1].Entries
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("entry %+v = %+v (present %v), want %+v", k, got[k], hasKey(got, k), v)
		}
	}
}

func hasKey(m map[Key]Value, k Key) bool { _, ok := m[k]; return ok }

func TestNamedPorts(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "x", "b", "198.18.0.11", "pod", "b")
	w.endpoint(3, "x", "b2", "198.18.0.12", "pod", "b") // replica declaring another port
	w.endpoint(4, "x", "c", "198.18.0.13", "pod", "c")
	w.ep("x", "a").NamedPorts = map[string]NamedPort{"http": {Port: 8080, Protocol: policy.ProtoTCP}}
	w.ep("x", "b").NamedPorts = map[string]NamedPort{"http": {Port: 9080, Protocol: policy.ProtoTCP}}
	w.ep("x", "b2").NamedPorts = map[string]NamedPort{"http": {Port: 9081, Protocol: policy.ProtoTCP}}
	w.ep("x", "c").NamedPorts = map[string]NamedPort{"http": {Port: 7080, Protocol: policy.ProtoTCP}, "dns": {Port: 53, Protocol: policy.ProtoUDP}}
	idA, idB, idC := w.ep("x", "a").Identity, w.ep("x", "b").Identity, w.ep("x", "c").Identity
	httpPort := []policy.PortRule{{Name: "http", Protocol: policy.ProtoTCP}}
	w.rules(
		// Ingress to a from b and c on "http": a's own 8080, whoever the peer.
		policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress,
			Peers: []policy.Peer{endpointsPeer(matchLabels(t, "pod", "b")), endpointsPeer(matchLabels(t, "pod", "c"))}, Ports: httpPort},
		// Egress from a to b and c on "http": each peer identity's own ports.
		policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress,
			Peers: []policy.Peer{endpointsPeer(matchLabels(t, "pod", "b")), endpointsPeer(matchLabels(t, "pod", "c"))}, Ports: httpPort},
		// Egress from a to a CIDR on "http": any endpoint's.
		policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress,
			Peers: []policy.Peer{cidrPeer("10.0.0.0/8")}, Ports: httpPort},
		// Egress from a to anyone on "dns" over TCP: no endpoint declares dns/TCP.
		policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress, AllPeers: true,
			Ports: []policy.PortRule{{Name: "dns", Protocol: policy.ProtoTCP}, {Name: "nope", Protocol: policy.ProtoTCP}}},
	)
	st := w.compute(t)
	ports := func(id identity.Identity, dir policy.Direction) []uint16 {
		var out []uint16
		for k := range st.Endpoints[1].Entries {
			if k.Identity == id && k.Direction == dir {
				if k.Protocol != policy.ProtoTCP || k.PortPrefixLen != 16 {
					t.Errorf("named port entry %+v not an exact TCP port", k)
				}
				out = append(out, k.Port)
			}
		}
		slices.Sort(out)
		return out
	}
	check := func(name string, got []uint16, want ...uint16) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s: ports %v, want %v", name, got, want)
		}
	}
	check("ingress from b", ports(idB, policy.Ingress), 8080)
	check("ingress from c", ports(idC, policy.Ingress), 8080)
	check("egress to b", ports(idB, policy.Egress), 9080, 9081)
	check("egress to c", ports(idC, policy.Egress), 7080)
	cidr := w.cidrID(t, "10.0.0.0/8")
	check("egress to cidr", ports(cidr, policy.Egress), 7080, 8080, 9080, 9081)
	check("egress to cidr flagged", ports(cidr|identity.EndpointCIDRFlag, policy.Egress), 7080, 8080, 9080, 9081)
	check("unresolved names", ports(identity.Any, policy.Egress))
	check("no ingress for a itself", ports(idA, policy.Ingress))
}

func TestDenyPrecedence(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "x", "b", "198.18.0.11", "pod", "b")
	peer := w.ep("x", "b").Identity
	subject := matchLabels(t, "pod", "a")
	fromB := []policy.Peer{endpointsPeer(matchLabels(t, "pod", "b"))}
	w.rules(
		policy.Rule{ID: 10, Subject: subject, Direction: policy.Ingress, Peers: fromB, Ports: []policy.PortRule{tcp(80), tcp(443), {Protocol: policy.ProtoUDP, Port: 53}}},
		policy.Rule{ID: 5, Subject: subject, Direction: policy.Ingress, Peers: fromB, Ports: []policy.PortRule{tcp(80)}},
		// Deny TCP 64..127 (one /10 prefix): covers the allow of 80, not 443.
		policy.Rule{ID: 20, Subject: subject, Direction: policy.Ingress, Deny: true, Peers: fromB, Ports: []policy.PortRule{{Protocol: policy.ProtoTCP, Port: 64, EndPort: 127}}},
		// A second deny covering 80 with a higher ID: the lowest covering deny is kept.
		policy.Rule{ID: 30, Subject: subject, Direction: policy.Ingress, Deny: true, Peers: fromB, Ports: []policy.PortRule{{Protocol: policy.ProtoTCP}}},
		// Egress: deny of every protocol covers allows of any protocol and port.
		policy.Rule{ID: 40, Subject: subject, Direction: policy.Egress, Peers: fromB, Ports: []policy.PortRule{{Protocol: policy.ProtoUDP, Port: 53}}},
		policy.Rule{ID: 41, Subject: subject, Direction: policy.Egress, Peers: fromB},
		policy.Rule{ID: 42, Subject: subject, Direction: policy.Egress, Deny: true, Peers: fromB},
		// A deny of another identity (Any) does not rewrite the peer's entries: the dataplane
		// finds it in its own lookup.
		policy.Rule{ID: 50, Subject: subject, Direction: policy.Ingress, Deny: true, AllPeers: true, Ports: []policy.PortRule{{Protocol: policy.ProtoUDP}}},
	)
	st := w.compute(t)
	k := func(dir policy.Direction, proto policy.Protocol, port uint16, plen uint8) Key {
		return Key{Identity: peer, Direction: dir, Protocol: proto, Port: port, PortPrefixLen: plen}
	}
	want := map[Key]Value{
		k(policy.Ingress, policy.ProtoTCP, 80, 16):                                     {Deny: true, RuleID: 20}, // allow 5 and 10, covered by 20 and 30
		k(policy.Ingress, policy.ProtoTCP, 443, 16):                                    {Deny: true, RuleID: 30}, // covered only by 30
		k(policy.Ingress, policy.ProtoUDP, 53, 16):                                     {RuleID: 10},             // no deny of this identity covers UDP
		k(policy.Ingress, policy.ProtoTCP, 64, 10):                                     {Deny: true, RuleID: 20},
		k(policy.Ingress, policy.ProtoTCP, 0, 0):                                       {Deny: true, RuleID: 30},
		k(policy.Egress, policy.ProtoUDP, 53, 16):                                      {Deny: true, RuleID: 42},
		k(policy.Egress, policy.ProtoAny, 0, 0):                                        {Deny: true, RuleID: 42}, // allow 41 and deny 42 on one key
		{Identity: identity.Any, Direction: policy.Ingress, Protocol: policy.ProtoUDP}: {Deny: true, RuleID: 50},
	}
	got := st.Endpoints[1].Entries
	if len(got) != len(want) {
		t.Errorf("got %d entries, want %d: %v", len(got), len(want), got)
	}
	for key, v := range want {
		if g, ok := got[key]; !ok || g != v {
			t.Errorf("entry %+v = %+v (present %v), want %+v", key, g, ok, v)
		}
	}
}

func TestDenyDoesNotRewriteWiderAllow(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.rules(
		policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, AllPeers: true,
			Ports: []policy.PortRule{{Protocol: policy.ProtoTCP, Port: 64, EndPort: 127}}},
		policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, AllPeers: true, Deny: true,
			Ports: []policy.PortRule{tcp(64)}},
	)
	st := w.compute(t)
	wide := Key{Identity: identity.Any, Direction: policy.Ingress, Protocol: policy.ProtoTCP, Port: 64, PortPrefixLen: 10}
	if got := st.Endpoints[1].Entries[wide]; got != (Value{RuleID: 1}) {
		t.Fatalf("allow 64-127 became %+v; only the narrower deny of 64 may win, by LPM", got)
	}
	for port, want := range map[uint16]Verdict{64: Denied, 65: Allowed, 127: Allowed, 128: Allowed} {
		if d := Lookup(st, 1, policy.Ingress, netip.MustParseAddr("8.8.8.8"), policy.ProtoTCP, port); d.Verdict != want {
			t.Errorf("port %d: %s, want %s", port, d.Verdict, want)
		}
	}
}

func TestMergeKeepsLowestRuleID(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	rules := []policy.Rule{
		{ID: 7, Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, AllPeers: true, Ports: []policy.PortRule{tcp(80)}},
		{ID: 3, Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, AllPeers: true, Ports: []policy.PortRule{tcp(80)}},
		{ID: 9, Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, AllPeers: true, Ports: []policy.PortRule{tcp(80)}},
	}
	key := Key{Identity: identity.Any, Direction: policy.Ingress, Protocol: policy.ProtoTCP, Port: 80, PortPrefixLen: 16}
	for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 0, 2}} {
		w.rules(rules[order[0]], rules[order[1]], rules[order[2]])
		if got := w.compute(t).Endpoints[1].Entries[key]; got != (Value{RuleID: 3}) {
			t.Fatalf("order %v: %+v, want rule 3", order, got)
		}
	}
}

func TestIPCache(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "x", "b", "198.18.1.10", "pod", "b")
	w.endpoint(3, "x", "c", "192.0.2.1", "pod", "c")
	w.in.HostIPs = []netip.Addr{netip.MustParseAddr("198.18.0.1")}
	w.rules(policy.Rule{Subject: labels.None(), Direction: policy.Egress, Peers: []policy.Peer{
		cidrPeer("198.18.0.0/15", "198.18.1.0/24"), cidrPeer("0.0.0.0/0"), cidrPeer("2001:db8::/32"),
	}})
	// No /0 policy prefix for this variant: checked below with a second input.
	st := w.compute(t)
	slash15, slash24 := w.cidrID(t, "198.18.0.0/15"), w.cidrID(t, "198.18.1.0/24")
	zero, v6 := w.cidrID(t, "0.0.0.0/0"), w.cidrID(t, "2001:db8::/32")
	flag := identity.EndpointCIDRFlag
	want := map[netip.Prefix]IPCacheEntry{
		netip.MustParsePrefix("0.0.0.0/0"):      {Identity: identity.World}, // World, not the /0 CIDR identity
		netip.MustParsePrefix("::/0"):           {Identity: identity.World},
		netip.MustParsePrefix("198.18.0.0/15"):  {Identity: slash15},
		netip.MustParsePrefix("198.18.1.0/24"):  {Identity: slash24},
		netip.MustParsePrefix("2001:db8::/32"):  {Identity: v6},
		netip.MustParsePrefix("198.18.0.10/32"): {Identity: w.ep("x", "a").Identity, Secondary: slash15 | flag, EndpointID: 1},
		netip.MustParsePrefix("198.18.1.10/32"): {Identity: w.ep("x", "b").Identity, Secondary: slash24 | flag, EndpointID: 2},
		netip.MustParsePrefix("192.0.2.1/32"):   {Identity: w.ep("x", "c").Identity, Secondary: zero | flag, EndpointID: 3}, // /0 counts
		netip.MustParsePrefix("198.18.0.1/32"):  {Identity: identity.Host, Secondary: slash15 | flag},                       // no endpoint: ID 0
	}
	if len(st.IPCache) != len(want) {
		t.Errorf("ipcache has %d entries, want %d: %v", len(st.IPCache), len(want), st.IPCache)
	}
	for p, e := range want {
		if got, ok := st.IPCache[p]; !ok || got != e {
			t.Errorf("ipcache[%v] = %+v (present %v), want %+v", p, got, ok, e)
		}
	}

	// Without policy prefixes an endpoint has no secondary identity.
	w.rules()
	st = w.compute(t)
	if got := st.IPCache[netip.MustParsePrefix("192.0.2.1/32")]; got.Secondary != 0 {
		t.Errorf("secondary without policy prefixes = %d", got.Secondary)
	}
}

// A dual-stack endpoint's IPv6 address maps, a /128, to what its IPv4 address does:
// its identity, its ep_id, the longest policy prefix holding it; the router's IPv6
// addresses to the host.
func TestIPCacheDualStack(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a").IP6 = netip.MustParseAddr("2001:2::a")
	w.endpoint(2, "x", "b", "198.18.0.11", "pod", "b") // IPv4 only
	w.in.HostIPs = []netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:2::1"), netip.MustParseAddr("fe80::1")}
	w.rules(policy.Rule{Subject: labels.None(), Direction: policy.Egress, Peers: []policy.Peer{cidrPeer("2001:2::/48")}})
	st := w.compute(t)
	v6 := w.cidrID(t, "2001:2::/48") | identity.EndpointCIDRFlag
	a := w.ep("x", "a")
	want := map[netip.Prefix]IPCacheEntry{
		netip.MustParsePrefix("198.18.0.10/32"): {Identity: a.Identity, EndpointID: 1},
		netip.MustParsePrefix("2001:2::a/128"):  {Identity: a.Identity, Secondary: v6, EndpointID: 1},
		netip.MustParsePrefix("198.18.0.11/32"): {Identity: w.ep("x", "b").Identity, EndpointID: 2},
		netip.MustParsePrefix("198.18.0.1/32"):  {Identity: identity.Host},
		netip.MustParsePrefix("2001:2::1/128"):  {Identity: identity.Host, Secondary: v6},
		netip.MustParsePrefix("fe80::1/128"):    {Identity: identity.Host},
	}
	for p, e := range want {
		if got, ok := st.IPCache[p]; !ok || got != e {
			t.Errorf("ipcache[%v] = %+v (present %v), want %+v", p, got, ok, e)
		}
	}
	// The two /0, the policy prefix, and the entries above: nothing else.
	if len(st.IPCache) != len(want)+3 {
		t.Errorf("ipcache has %d entries, want %d: %v", len(st.IPCache), len(want)+3, st.IPCache)
	}
}

func TestCheckDualStackEndpoints(t *testing.T) {
	in := Input{Endpoints: []Endpoint{
		{ID: 1, Namespace: "x", Name: "a", Identity: 300, IP: netip.MustParseAddr("198.18.0.10"), IP6: netip.MustParseAddr("2001:2::a")},
		{ID: 2, Namespace: "x", Name: "b", Identity: 300, IP: netip.MustParseAddr("198.18.0.11"), IP6: netip.MustParseAddr("2001:2::a")},
		{ID: 3, Namespace: "x", Name: "c", Identity: 300, IP: netip.MustParseAddr("198.18.0.12"), IP6: netip.MustParseAddr("198.18.0.13")},
	}}
	err := in.Check()
	for _, want := range []string{"x/a and x/b share address 2001:2::a", "x/c: IPv6 address 198.18.0.13"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check error %v lacks %q", err, want)
		}
	}
}

func TestComputeIgnoresInvalidCIDRIdentities(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.rules(policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress,
		Peers: []policy.Peer{cidrPeer("10.0.0.0/8")}})
	// A broken agent maps the prefix to 0 ("any peer"): Compute must not put 0 in a key,
	// and Check must say so.
	w.in.CIDRIdentities[netip.MustParsePrefix("10.0.0.0/8")] = 0
	if err := w.in.Check(); err == nil || !strings.Contains(err.Error(), "10.0.0.0/8") {
		t.Fatalf("Check = %v, want an error naming the prefix", err)
	}
	st := Compute(w.in)
	if len(st.Endpoints[1].Entries) != 0 {
		t.Fatalf("entries %v from an invalid CIDR identity", st.Endpoints[1].Entries)
	}
	delete(w.in.CIDRIdentities, netip.MustParsePrefix("10.0.0.0/8"))
	if err := w.in.Check(); err == nil || !strings.Contains(err.Error(), "no CIDR identity") {
		t.Fatalf("Check with a missing prefix = %v", err)
	}
}

func TestCheckEndpointsAndRules(t *testing.T) {
	in := Input{
		Endpoints: []Endpoint{
			{ID: 1, Namespace: "x", Name: "a", Identity: 300, IP: netip.MustParseAddr("198.18.0.1")},
			{ID: 1, Namespace: "x", Name: "b", Identity: 0},
			{ID: 2, Namespace: "x", Name: "c", Identity: 300, IP: netip.MustParseAddr("198.18.0.1")},
		},
		Rules: []policy.Rule{{ID: 4}, {ID: 4}},
	}
	err := in.Check()
	if err == nil {
		t.Fatal("Check accepted bad input")
	}
	for _, want := range []string{"share endpoint ID 1", "x/b has invalid identity", "x/b has no address", "x/a and x/c share address 198.18.0.1", "rule ID 4 used twice"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Check error %q lacks %q", err, want)
		}
	}
}

// BenchmarkCompute10kRules measures a full recompute with 10,000 rules (half L3 by label,
// half L4 with a CIDR peer each) over 100 endpoints, the scale of the benchmark.
func BenchmarkCompute10kRules(b *testing.B) {
	w := newWorld()
	for i := 0; i < 100; i++ {
		w.endpoint(uint32(i+1), namespaces[i%3], fmt.Sprintf("e%d", i),
			netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i)}).String(), "pod", podValues[i%3], "n", fmt.Sprint(i%26))
	}
	var rules []policy.Rule
	for i := 0; i < 10000; i++ {
		r := policy.Rule{Subject: matchLabels(b, "pod", podValues[i%3]), Direction: policy.Ingress, EnableDefaultDeny: true}
		if i%2 == 0 {
			r.Peers = []policy.Peer{endpointsPeer(matchLabels(b, "n", fmt.Sprint(i%26)))}
		} else {
			r.Peers = []policy.Peer{{Kind: policy.PeerCIDR, CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)}}
			r.Ports = []policy.PortRule{{Protocol: policy.ProtoTCP, Port: uint16(1000 + i%100), EndPort: uint16(1100 + i%100)}}
		}
		rules = append(rules, r)
	}
	w.rules(rules...)
	b.ResetTimer()
	var entries int
	for i := 0; i < b.N; i++ {
		st := Compute(w.in)
		entries = 0
		for _, ep := range st.Endpoints {
			entries += len(ep.Entries)
		}
	}
	b.ReportMetric(float64(entries), "entries")
}
