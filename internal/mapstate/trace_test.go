package mapstate

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
)

func traceWorld(t *testing.T) (*world, State) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "y", "b", "198.18.0.11", "pod", "b")
	w.in.HostIPs = []netip.Addr{netip.MustParseAddr("198.18.0.1")}
	w.rules(
		// y/b: default deny ingress, allow TCP 80 from namespace x.
		policy.Rule{ID: 11, Description: "ingress[0]", Subject: matchLabels(t, labels.KeyNamespace, "y"),
			Direction: policy.Ingress, EnableDefaultDeny: true,
			Peers: []policy.Peer{endpointsPeer(matchLabels(t, labels.KeyNamespace, "x"))}, Ports: []policy.PortRule{tcp(80)}},
		// x/a: default deny egress, allow to the pod range on any port...
		policy.Rule{ID: 21, Description: "egress[0]", Subject: matchLabels(t, "pod", "a"),
			Direction: policy.Egress, EnableDefaultDeny: true,
			Peers: []policy.Peer{cidrPeer("198.18.0.0/15")}},
		// ...and a Cilium deny of TCP 81 to everyone.
		policy.Rule{ID: 31, Description: "specs[0].egressDeny[0]", Subject: matchLabels(t, "pod", "a"),
			Direction: policy.Egress, Deny: true, AllPeers: true, Ports: []policy.PortRule{tcp(81)}},
	)
	w.in.RulePolicies = map[uint32]PolicyRef{
		11: {Kind: policy.KindNetworkPolicy, Namespace: "y", Name: "allow-x"},
		21: {Kind: policy.KindCiliumNetworkPolicy, Namespace: "x", Name: "egress"},
		31: {Kind: policy.KindCiliumClusterwidePolicy, Name: "no-81"},
	}
	return w, w.compute(t)
}

func TestTraceEndpointToEndpoint(t *testing.T) {
	w, st := traceWorld(t)
	q := Query{From: TraceRef{Namespace: "x", Name: "a"}, To: TraceRef{Namespace: "y", Name: "b"}, Protocol: policy.ProtoTCP, Port: 80}
	res, err := Trace(w.in, st, q)
	if err != nil {
		t.Fatal(err)
	}
	if res.Verdict != Allowed || res.Egress == nil || res.Ingress == nil {
		t.Fatalf("got %+v", res)
	}
	if res.From.Identity != w.ep("x", "a").Identity || res.To.Identity != w.ep("y", "b").Identity || !res.From.Endpoint {
		t.Fatalf("ends %+v %+v", res.From, res.To)
	}
	eg := res.Egress
	if eg.Direction != policy.Egress || eg.Endpoint != "x/a" || !eg.Enforced ||
		eg.Decision.Reason != ReasonAllowedByRule || eg.Rule == nil || eg.Rule.ID != 21 ||
		eg.Rule.Description != "egress[0]" || eg.Rule.Policy.Name != "egress" ||
		eg.Decision.Secondary != w.cidrID(t, "198.18.0.0/15")|identity.EndpointCIDRFlag {
		t.Fatalf("egress check %+v rule %+v", eg, eg.Rule)
	}
	in := res.Ingress
	if in.Direction != policy.Ingress || in.Endpoint != "y/b" || in.Decision.Reason != ReasonAllowedByRule ||
		in.Rule.ID != 11 || in.Rule.Policy != (PolicyRef{Kind: policy.KindNetworkPolicy, Namespace: "y", Name: "allow-x"}) {
		t.Fatalf("ingress check %+v rule %+v", in, in.Rule)
	}

	// Port 81: egress denied by the clusterwide deny; ingress default-denied. Both reported.
	q.Port = 81
	res, err = Trace(w.in, st, q)
	if err != nil {
		t.Fatal(err)
	}
	if res.Verdict != Denied || res.Egress.Decision.Reason != ReasonDeniedByRule || res.Egress.Rule.ID != 31 ||
		res.Egress.Rule.Policy.Kind != policy.KindCiliumClusterwidePolicy ||
		res.Ingress.Decision.Reason != ReasonDefaultDeny || res.Ingress.Rule != nil {
		t.Fatalf("port 81: %+v egress %+v ingress %+v", res, res.Egress, res.Ingress)
	}

	// The JSON form (what the API sends) carries the verdict and the policy name.
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"verdict":"denied"`, `"name":"no-81"`, `"reason":"default-deny"`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("JSON %s lacks %s", data, want)
		}
	}
}

func TestTraceAddresses(t *testing.T) {
	w, st := traceWorld(t)
	// An address that is an endpoint's is that endpoint: both checks run.
	res, err := Trace(w.in, st, Query{
		From: TraceRef{Addr: netip.MustParseAddr("198.18.0.10")}, To: TraceRef{Namespace: "y", Name: "b"},
		Protocol: policy.ProtoTCP, Port: 80,
	})
	if err != nil || res.Egress == nil || res.From.Name != "a" || res.Verdict != Allowed {
		t.Fatalf("got %+v, %v", res, err)
	}
	// From the host: no egress check; ingress at y/b default-denies (host is not in x).
	res, err = Trace(w.in, st, Query{
		From: TraceRef{Addr: netip.MustParseAddr("198.18.0.1")}, To: TraceRef{Namespace: "y", Name: "b"},
		Protocol: policy.ProtoTCP, Port: 80,
	})
	if err != nil || res.Egress != nil || res.From.Identity != identity.Host || res.Verdict != Denied ||
		res.Ingress.Decision.Reason != ReasonDefaultDeny {
		t.Fatalf("from host: %+v, %v", res, err)
	}
	// To the world: egress at x/a only; 8.8.8.8 is outside the allowed CIDR.
	res, err = Trace(w.in, st, Query{
		From: TraceRef{Namespace: "x", Name: "a"}, To: TraceRef{Addr: netip.MustParseAddr("8.8.8.8")},
		Protocol: policy.ProtoUDP, Port: 53,
	})
	if err != nil || res.Ingress != nil || res.To.Identity != identity.World || res.Verdict != Denied ||
		res.Egress.Decision.Reason != ReasonDefaultDeny {
		t.Fatalf("to world: %+v, %v", res, err)
	}
}

func TestTraceErrors(t *testing.T) {
	w, st := traceWorld(t)
	a := TraceRef{Namespace: "x", Name: "a"}
	cases := map[string]struct {
		q    Query
		want string
	}{
		"unknown source":   {Query{From: TraceRef{Namespace: "x", Name: "zz"}, To: a}, "resolving source: endpoint x/zz not found"},
		"unknown dest":     {Query{From: a, To: TraceRef{Namespace: "q", Name: "a"}}, "resolving destination: endpoint q/a not found"},
		"empty ref":        {Query{From: a}, "resolving destination: no endpoint name or address"},
		"address mismatch": {Query{From: TraceRef{Namespace: "x", Name: "a", Addr: netip.MustParseAddr("1.2.3.4")}, To: a}, "has address 198.18.0.10, not 1.2.3.4"},
		"no endpoint":      {Query{From: TraceRef{Addr: netip.MustParseAddr("1.1.1.1")}, To: TraceRef{Addr: netip.MustParseAddr("8.8.8.8")}}, ErrNoEndpoint.Error()},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Trace(w.in, st, c.q)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
	_, err := Trace(w.in, st, cases["no endpoint"].q)
	if !errors.Is(err, ErrNoEndpoint) {
		t.Fatalf("not ErrNoEndpoint: %v", err)
	}
}
