package mapstate

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// hostWorld: x/a enforces ingress (allows TCP 80 from x/b only) and denies the host on
// TCP 22; x/b has L7 rules on TCP 8080 from anyone; x/c has no policy.
func hostWorld(t *testing.T, allowHost bool) (*world, State) {
	t.Helper()
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "x", "b", "198.18.0.11", "pod", "b")
	w.endpoint(3, "x", "c", "198.18.0.12", "pod", "c")
	w.in.HostIPs = []netip.Addr{netip.MustParseAddr("198.18.0.1")}
	w.in.AllowHost = allowHost
	w.rules(
		policy.Rule{ID: 1, Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, EnableDefaultDeny: true,
			Peers: []policy.Peer{endpointsPeer(matchLabels(t, "pod", "b"))}, Ports: []policy.PortRule{tcp(80)}},
		policy.Rule{ID: 2, Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, Deny: true,
			Peers: []policy.Peer{entityPeer(policy.EntityHost)}, Ports: []policy.PortRule{tcp(22)}},
		policy.Rule{ID: 3, Subject: matchLabels(t, "pod", "b"), Direction: policy.Ingress, EnableDefaultDeny: true,
			AllPeers: true, Ports: []policy.PortRule{{Protocol: policy.ProtoTCP, Port: 8080, HTTP: []policy.HTTPRule{{Method: "GET"}}}}},
	)
	return w, w.compute(t)
}

// With AllowHost, every endpoint that enforces ingress admits the host on any protocol;
// a deny rule for the host and the L7 rules of a port still apply; nothing else changes.
func TestAllowHost(t *testing.T) {
	_, off := hostWorld(t, false)
	w, st := hostWorld(t, true)
	hostKey := Key{Identity: identity.Host, Direction: policy.Ingress, Protocol: policy.ProtoAny}
	for _, id := range []uint32{1, 2} {
		if v, ok := st.Endpoints[id].Entries[hostKey]; !ok || v != (Value{RuleID: HostTrafficRuleID}) {
			t.Errorf("endpoint %d: host entry %+v (present %v)", id, v, ok)
		}
		if _, ok := off.Endpoints[id].Entries[hostKey]; ok {
			t.Errorf("endpoint %d: host entry without AllowHost", id)
		}
		// The host entry is the only difference.
		if len(st.Endpoints[id].Entries) != len(off.Endpoints[id].Entries)+1 {
			t.Errorf("endpoint %d: %d entries, %d without AllowHost", id, len(st.Endpoints[id].Entries), len(off.Endpoints[id].Entries))
		}
	}
	if len(st.Endpoints[3].Entries) != 0 {
		t.Errorf("endpoint 3 (no ingress enforcement): entries %v", st.Endpoints[3].Entries)
	}

	host := netip.MustParseAddr("198.18.0.1")
	to := func(name string, proto policy.Protocol, port uint16) *TraceResult {
		t.Helper()
		res, err := Trace(w.in, st, Query{From: TraceRef{Addr: host}, To: TraceRef{Namespace: "x", Name: name}, Protocol: proto, Port: port})
		if err != nil {
			t.Fatal(err)
		}
		return &res
	}
	if r := to("a", policy.ProtoTCP, 443); r.Verdict != Allowed || r.Ingress.Rule == nil ||
		r.Ingress.Rule.ID != HostTrafficRuleID || !strings.Contains(r.Ingress.Rule.Description, "--host-traffic") {
		t.Errorf("host to a:443: %+v", r.Ingress)
	}
	if r := to("a", policy.ProtoICMP, 8); r.Verdict != Allowed {
		t.Errorf("host ping a: %v", r.Verdict)
	}
	if r := to("a", policy.ProtoTCP, 22); r.Verdict != Denied || r.Ingress.Rule == nil || r.Ingress.Rule.ID != 2 {
		t.Errorf("host to a:22 (denied by rule 2): %+v", r.Ingress)
	}
	if r := to("b", policy.ProtoTCP, 8080); r.Verdict != Redirected {
		t.Errorf("host to b:8080 (L7 rules): %v, want redirected", r.Verdict)
	}
	// Other peers are not admitted by it.
	res, err := Trace(w.in, st, Query{From: TraceRef{Namespace: "x", Name: "c"}, To: TraceRef{Namespace: "x", Name: "a"}, Protocol: policy.ProtoTCP, Port: 443})
	if err != nil || res.Verdict != Denied {
		t.Errorf("c to a:443: %v, %v", res.Verdict, err)
	}
	// Without AllowHost the host is an ordinary peer.
	res, err = Trace(w.in, off, Query{From: TraceRef{Addr: host}, To: TraceRef{Namespace: "x", Name: "a"}, Protocol: policy.ProtoTCP, Port: 443})
	if err != nil || res.Verdict != Denied {
		t.Errorf("host to a:443 without AllowHost: %v, %v", res.Verdict, err)
	}

	// No policy rule may take the reserved rule ID.
	w.in.Rules[0].ID = HostTrafficRuleID
	if err := w.in.Check(); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("rule with the host traffic rule ID: %v", err)
	}
}
