package join

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/monitor/suricata"
	"github.com/rampartnet/rampart/internal/tap"
)

func spec(m tap.Match) *api.TapMatch { s := api.TapMatchOf(m); return &s }

var t0 = time.Date(2026, 11, 28, 0, 1, 2, 0, time.UTC)

func view() *View {
	web := tap.Match{Direction: tap.Both, Protocol: tap.ProtoTCP, Ports: []tap.PortRange{{First: 8080, Last: 8080}}}
	return &View{
		Monitor: "sec/ids",
		Endpoints: []api.Endpoint{
			{Namespace: "shop", Name: "web", IP: "198.18.0.6", IP6: "2001:2::6", Identity: 264, IdentityLabels: []string{"app=web"}},
			{Namespace: "shop", Name: "client", IP: "198.18.0.5", IP6: "2001:2::5", Identity: 263, IdentityLabels: []string{"app=client"}},
			{Namespace: "sec", Name: "ids", IP: "198.18.0.7", Identity: 265, Monitor: true},
		},
		Remotes: []api.RemoteEndpoint{{Namespace: "shop", Name: "db", Node: "n2", IP: "198.19.1.5", Identity: 70000}},
		Nodes:   []api.Node{{Name: "n2", Address: "198.19.255.2"}},
		Identities: []api.Identity{
			{ID: 2, Kind: "reserved", Labels: []string{"reserved:world"}},
			{ID: 6, Kind: "reserved", Labels: []string{"reserved:remote-node"}},
			{ID: 70000, Kind: "endpoint", Labels: []string{"app=db"}},
			{ID: 16777217, Kind: "cidr", Prefix: "203.0.113.0/24", Labels: []string{"cidr:203.0.113.0/24"}},
			{ID: 16777218, Kind: "cidr", Prefix: "203.0.0.0/16", Labels: []string{"cidr:203.0.0.0/16"}},
		},
		Taps: []api.Tap{
			{Name: "web-mirror", Monitor: "sec/ids", Action: "mirror", Endpoints: []string{"shop/web"}, MatchSpec: spec(web)},
			// Only the client's requests: an alert on web's answer is still its flow.
			{Name: "client-out", Monitor: "sec/ids", Action: "mirror", Endpoints: []string{"shop/client"},
				MatchSpec: spec(tap.Match{Direction: tap.Egress, Protocol: tap.ProtoTCP, PeerPorts: []tap.PortRange{{First: 8080, Last: 8080}}})},
			{Name: "other-monitor", Monitor: "sec/other", Action: "mirror", Endpoints: []string{"shop/web"}, MatchSpec: spec(web)},
			{Name: "web-udp", Monitor: "sec/ids", Action: "redirect", Endpoints: []string{"shop/web"},
				MatchSpec: spec(tap.Match{Direction: tap.Both, Protocol: tap.ProtoUDP})},
		},
		Flows: []api.Flow{
			// The client's egress event and web's ingress event of one connection; an
			// older connection on the same ports; an L7 record.
			{Time: t0.Add(-time.Hour), Type: "new", Verdict: "FORWARDED", Protocol: "TCP", Direction: "ingress", Endpoint: "shop/web",
				Source: api.FlowPeer{IP: "198.18.0.5", Port: 40004, Identity: 1}, Dest: api.FlowPeer{IP: "198.18.0.6", Port: 8080, Identity: 1}},
			{Time: t0.Add(-50 * time.Millisecond), Type: "new", Verdict: "FORWARDED", Protocol: "TCP", Direction: "egress", Endpoint: "shop/client",
				Source: api.FlowPeer{IP: "198.18.0.5", Port: 40004, Identity: 263, Namespace: "shop", Name: "client"},
				Dest:   api.FlowPeer{IP: "198.18.0.6", Port: 8080, Identity: 264, Namespace: "shop", Name: "web"}},
			{Time: t0.Add(-40 * time.Millisecond), Type: "new", Verdict: "FORWARDED", Protocol: "TCP", Direction: "ingress", Endpoint: "shop/web", Flags: []string{"tapped"},
				Source: api.FlowPeer{IP: "198.18.0.5", Port: 40004, Identity: 263, Namespace: "shop", Name: "client", Labels: []string{"app=client"}},
				Dest:   api.FlowPeer{IP: "198.18.0.6", Port: 8080, Identity: 264, Namespace: "shop", Name: "web", Labels: []string{"app=web"}}},
			{Time: t0, Type: api.FlowTypeL7, Protocol: "TCP",
				Source: api.FlowPeer{IP: "198.18.0.5", Port: 40004}, Dest: api.FlowPeer{IP: "198.18.0.6", Port: 8080}},
		},
	}
}

func alert(src, dst string, action suricata.Action) suricata.Event {
	return suricata.Event{Time: t0, Type: suricata.TypeAlert, FlowID: 42,
		Tuple: suricata.FiveTuple{Proto: "TCP", Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst)},
		Alert: &suricata.Alert{Action: action, GID: 1, SignatureID: 1000001, Rev: 1, Signature: "rampart-attack", Severity: 3}}
}

func contractNames(a Alert) string {
	var s []string
	for _, c := range a.Contracts {
		s = append(s, c.Name+"@"+c.Endpoint+":"+c.Direction)
	}
	return strings.Join(s, " ")
}

// An alert on the client's request names both endpoints with their identities, the tapped
// flow event of the connection (not an older one on the same ports), and the contracts of
// this monitor whose match holds the flow at either side.
func TestJoinRequest(t *testing.T) {
	a, ok := Join(view(), alert("198.18.0.5:40004", "198.18.0.6:8080", suricata.Allowed))
	if !ok {
		t.Fatal("alert not joined")
	}
	if a.Source.Endpoint != "shop/client" || a.Source.Identity != 263 || a.Destination.Endpoint != "shop/web" || a.Destination.Identity != 264 {
		t.Errorf("sides %+v -> %+v", a.Source, a.Destination)
	}
	if a.Flow == nil || a.Flow.Endpoint != "shop/web" || !a.Flow.Time.Equal(t0.Add(-40*time.Millisecond)) {
		t.Errorf("flow %+v, want web's tapped event", a.Flow)
	}
	if got := contractNames(a); got != "web-mirror@shop/web:ingress client-out@shop/client:egress" {
		t.Errorf("contracts %q", got)
	}
	if a.Monitor != "sec/ids" || a.Action != "allowed" || a.SignatureID != 1000001 || a.Signature != "rampart-attack" {
		t.Errorf("alert fields %+v", a)
	}
	line := Format(a)
	for _, want := range []string{`alert allowed [1:1000001:1] "rampart-attack"`, "shop/client (id 263) -> shop/web (id 264) TCP 198.18.0.5:40004 -> 198.18.0.6:8080",
		"contract=web-mirror (mirror, ingress at shop/web)", "flow tapped "} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
}

// An alert on an IPv6 connection (Suricata's IPv6-ICMP aside, the same protocol names)
// names the endpoints by their IPv6 addresses and the contracts that tap it.
func TestJoinIPv6(t *testing.T) {
	a, ok := Join(view(), alert("[2001:2::5]:40004", "[2001:2::6]:8080", suricata.Allowed))
	if !ok {
		t.Fatal("alert not joined")
	}
	if a.Source.Endpoint != "shop/client" || a.Destination.Endpoint != "shop/web" || a.Destination.Identity != 264 {
		t.Errorf("sides %+v -> %+v", a.Source, a.Destination)
	}
	if got := contractNames(a); got != "web-mirror@shop/web:ingress client-out@shop/client:egress" {
		t.Errorf("contracts %q", got)
	}
}

// An alert on web's answer is about the same connection: the client's egress-only
// contract tapped it, in its other direction.
func TestJoinAnswer(t *testing.T) {
	a, _ := Join(view(), alert("198.18.0.6:8080", "198.18.0.5:40004", suricata.Blocked))
	if got := contractNames(a); got != "web-mirror@shop/web:egress client-out@shop/client:egress" {
		t.Errorf("contracts %q", got)
	}
	if a.Source.Endpoint != "shop/web" || a.Action != "blocked" || a.Flow == nil {
		t.Errorf("answer: %+v", a)
	}
}

// Without a flow event the sides come from the endpoints, the remote pods, the nodes and
// the CIDR identities (longest prefix), else the world; no contract taps a flow on a port
// no match holds, and a drop record joins like an alert.
func TestJoinWithoutFlow(t *testing.T) {
	v := view()
	v.Flows = nil
	for _, tc := range []struct {
		peer, name, endpoint string
		id                   uint32
	}{
		{"198.19.1.5:5432", "shop/db@n2", "shop/db", 70000},
		{"198.19.255.2:4789", "remote-node", "", 6},
		{"203.0.113.9:443", "203.0.113.0/24", "", 16777217},
		{"203.0.1.1:443", "203.0.0.0/16", "", 16777218},
		{"192.0.2.1:443", "world", "", 2},
	} {
		a, _ := Join(v, alert("198.18.0.6:8080", tc.peer, suricata.Allowed))
		if a.Destination.Name != tc.name || a.Destination.Endpoint != tc.endpoint || a.Destination.Identity != tc.id {
			t.Errorf("%s: got %+v", tc.peer, a.Destination)
		}
		if a.Source.Endpoint != "shop/web" || a.Source.Identity != 264 || a.Flow != nil {
			t.Errorf("%s: source %+v, flow %v", tc.peer, a.Source, a.Flow)
		}
		if got := contractNames(a); got != "web-mirror@shop/web:egress" {
			t.Errorf("%s: contracts %q", tc.peer, got)
		}
	}
	a, _ := Join(v, alert("198.18.0.5:40004", "198.18.0.6:9090", suricata.Allowed))
	if len(a.Contracts) != 0 || !strings.Contains(Format(a), "contract=none") {
		t.Errorf("port 9090: contracts %q", contractNames(a))
	}
	d := alert("198.18.0.5:40004", "198.18.0.6:8080", "")
	d.Type, d.Alert, d.Drop = suricata.TypeDrop, nil, &suricata.Drop{Reason: "rules"}
	a, ok := Join(v, d)
	if !ok || a.Event != "drop" || a.Action != "blocked" || a.DropReason != "rules" || !strings.Contains(Format(a), "drop blocked reason=rules") {
		t.Errorf("drop: %v %+v", ok, a)
	}
	if _, ok := Join(v, suricata.Event{Type: suricata.TypeFlow}); ok {
		t.Error("a flow record was joined as an alert")
	}
}
