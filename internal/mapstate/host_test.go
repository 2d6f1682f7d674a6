package mapstate

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
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

// A host policy (Rule.Host) applies to the host endpoint of a node its selector matches,
// and to nothing else; endpoint rules never apply to the host endpoint; the host endpoint's
// address stays the host's in the ipcache; a trace names the host endpoint.
func TestHostEndpoint(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	hostIP := netip.MustParseAddr("198.19.254.1")
	w.in.Endpoints = append(w.in.Endpoints, Endpoint{ID: HostEndpointID, Host: true, Name: HostEndpointName,
		Labels: labels.Labels{"type": "worker"}, Identity: identity.Host, IP: hostIP})
	w.in.HostIPs = []netip.Addr{netip.MustParseAddr("198.18.0.1"), hostIP}
	w.in.AllowHost = true
	w.rules(
		// Host policy for workers: SSH from anywhere, the pod a on 9100.
		policy.Rule{ID: 1, Host: true, Subject: matchLabels(t, "type", "worker"), Direction: policy.Ingress, EnableDefaultDeny: true,
			AllPeers: true, Ports: []policy.PortRule{tcp(22)}},
		policy.Rule{ID: 2, Host: true, Subject: matchLabels(t, "type", "worker"), Direction: policy.Ingress, EnableDefaultDeny: true,
			Peers: []policy.Peer{endpointsPeer(matchLabels(t, "pod", "a"))}, Ports: []policy.PortRule{tcp(9100)}},
		// Host policy for other nodes: not this one.
		policy.Rule{ID: 3, Host: true, Subject: matchLabels(t, "type", "edge"), Direction: policy.Egress, EnableDefaultDeny: true},
		// An endpoint rule selecting everything: never the host.
		policy.Rule{ID: 4, Subject: labels.Selector{}, Direction: policy.Egress, EnableDefaultDeny: true,
			Peers: []policy.Peer{entityPeer(policy.EntityHost)}},
	)
	st := w.compute(t)
	host := st.Endpoints[HostEndpointID]
	if !host.EnforceIngress || host.EnforceEgress {
		t.Errorf("host endpoint enforces ingress %v, egress %v; want ingress only", host.EnforceIngress, host.EnforceEgress)
	}
	for k, v := range host.Entries {
		if v.RuleID != 1 && v.RuleID != 2 || k.Direction != policy.Ingress {
			t.Errorf("host entry %+v -> %+v, want rule 1 or 2 ingress only", k, v)
		}
	}
	a := st.Endpoints[1]
	if !a.EnforceEgress || a.EnforceIngress {
		t.Errorf("pod a enforces ingress %v, egress %v; want egress only (rule 4)", a.EnforceIngress, a.EnforceEgress)
	}
	for _, v := range a.Entries {
		if v.RuleID != 4 {
			t.Errorf("pod a has an entry of rule %d", v.RuleID)
		}
	}
	if e, _ := LookupIPCache(st.IPCache, hostIP); e.Identity != identity.Host || e.EndpointID != 0 {
		t.Errorf("ipcache %v = %+v, want the host identity and no endpoint", hostIP, e)
	}
	trace := func(from, to TraceRef, port uint16) TraceResult {
		t.Helper()
		res, err := Trace(w.in, st, Query{From: from, To: to, Protocol: policy.ProtoTCP, Port: port})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	hostRef := TraceRef{Name: HostEndpointName}
	podA := TraceRef{Namespace: "x", Name: "a"}
	world := TraceRef{Addr: netip.MustParseAddr("198.18.200.9")}
	if r := trace(world, hostRef, 22); r.Verdict != Allowed || r.Ingress.Rule == nil || r.Ingress.Rule.ID != 1 {
		t.Errorf("world to host:22: %v %+v", r.Verdict, r.Ingress)
	}
	if r := trace(world, hostRef, 9100); r.Verdict != Denied {
		t.Errorf("world to host:9100: %v, want denied", r.Verdict)
	}
	if r := trace(podA, hostRef, 9100); r.Verdict != Allowed || r.Ingress.Rule == nil || r.Ingress.Rule.ID != 2 {
		t.Errorf("a to host:9100: %v %+v", r.Verdict, r.Ingress)
	}
	if r := trace(TraceRef{Addr: hostIP}, podA, 80); !r.To.Endpoint || r.Verdict != Allowed {
		t.Errorf("host to a:80 (host egress unenforced, a's ingress open): %v", r.Verdict)
	}
}
