package servicemap

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
)

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func ep(ns, name, ip string, port uint16) api.FlowPeer {
	return api.FlowPeer{Namespace: ns, Name: name, IP: ip, Port: port}
}

// flowOf is a TCP flow from src to dst.
func flowOf(src, dst api.FlowPeer, verdict, reason, dir string) api.Flow {
	return api.Flow{Time: t0, Type: "new", Verdict: verdict, Reason: reason, Direction: dir, Protocol: "TCP", Source: src, Dest: dst}
}

// sample is what the map sees of x/a -> x/b:80 allowed, x/c -> x/b:80 denied by a rule,
// x/c -> x/d:81 denied by default, an L7 request x/a -> x/b and a packet from the world.
func sample() []api.Flow {
	a, b, c, d := ep("x", "a", "198.18.0.2", 40000), ep("x", "b", "198.18.0.3", 80), ep("x", "c", "198.18.0.4", 40001), ep("x", "d", "198.18.0.5", 81)
	deny := flowOf(c, b, "DROPPED", "policy-deny", "ingress")
	deny.Rule = &api.RuleRef{ID: 7, Policy: "CiliumNetworkPolicy/x/b-in", Rule: "spec.ingressDeny[0]"}
	allow := flowOf(a, b, "FORWARDED", "", "ingress")
	allow.Rule = &api.RuleRef{ID: 6, Policy: "CiliumNetworkPolicy/x/b-in", Rule: "spec.ingress[0]"}
	l7 := flowOf(a, b, "FORWARDED", "", "ingress")
	l7.Type, l7.L7 = "l7", &api.L7Flow{Protocol: "HTTP/1.1", Method: "GET", Path: "/v1", Status: 200}
	world := flowOf(api.FlowPeer{IP: "203.0.113.9", Port: 5555, Labels: []string{"reserved:world"}}, b, "DROPPED", "policy-default-deny", "ingress")
	return []api.Flow{
		flowOf(a, b, "FORWARDED", "", "egress"), allow,
		flowOf(c, b, "FORWARDED", "", "egress"), deny,
		flowOf(c, d, "FORWARDED", "", "egress"), flowOf(c, d, "DROPPED", "policy-default-deny", "ingress"),
		l7, world,
	}
}

func edgesByID(t *testing.T, agg *Aggregator) map[string]Edge {
	t.Helper()
	edges, _, _ := agg.Edges()
	m := map[string]Edge{}
	for _, e := range edges {
		m[e.ID] = e
	}
	return m
}

func TestAggregatorEdges(t *testing.T) {
	agg := NewAggregator(0, 0)
	for _, f := range sample() {
		agg.Add(f)
	}
	edges, peers, st := agg.Edges()
	if len(edges) != 4 || st.FlowsSeen != 8 || st.Edges != 4 || st.EdgesEvicted != 0 {
		t.Fatalf("edges %d, stats %+v; want 4 edges of 8 flows", len(edges), st)
	}
	// The drops first: a dropped edge is what the page must not bury.
	if edges[0].Verdict != "DROPPED" || edges[len(edges)-1].Verdict != "FORWARDED" {
		t.Errorf("edges not ordered by severity: %+v", edges)
	}
	m := edgesByID(t, agg)
	ab := m["x/a->x/b"]
	if ab.Verdict != "FORWARDED" || ab.Flows != 3 || len(ab.Verdicts) != 1 {
		t.Fatalf("x/a->x/b = %+v", ab)
	}
	fw := ab.Verdicts[0]
	if len(fw.Ports) != 1 || fw.Ports[0] != (Count{"80/TCP", 3}) || len(fw.Rules) != 1 || fw.Rules[0].Policy != "CiliumNetworkPolicy/x/b-in" ||
		len(fw.L7) != 1 || fw.L7[0] != (L7Count{"GET", "/v1", 200, 1}) {
		t.Errorf("x/a->x/b details = %+v", fw)
	}
	// Forwarded leaving x/c, dropped entering x/b: one edge, marked dropped, with both.
	cb := m["x/c->x/b"]
	if cb.Verdict != "DROPPED" || len(cb.Verdicts) != 2 || cb.Verdicts[0].Verdict != "DROPPED" || cb.Verdicts[1].Verdict != "FORWARDED" {
		t.Fatalf("x/c->x/b = %+v", cb)
	}
	dr := cb.Verdicts[0]
	if len(dr.Reasons) != 1 || dr.Reasons[0].Value != "policy-deny" || len(dr.Rules) != 1 ||
		dr.Rules[0] != (RuleCount{"CiliumNetworkPolicy/x/b-in", "spec.ingressDeny[0]", 1}) {
		t.Errorf("x/c->x/b drop details = %+v", dr)
	}
	if cd := m["x/c->x/d"]; cd.Verdict != "DROPPED" || cd.Verdicts[0].Reasons[0].Value != "policy-default-deny" || cd.Verdicts[0].Rules != nil {
		t.Errorf("x/c->x/d = %+v", cd)
	}
	// Every address of the world is one peer.
	if w, ok := m["reserved:world->x/b"]; !ok || w.Verdict != "DROPPED" {
		t.Errorf("world edge missing: %v", m)
	}
	var kinds []string
	for _, p := range peers {
		kinds = append(kinds, p.ID+"="+p.Kind)
	}
	if got, want := strings.Join(kinds, " "), "reserved:world=reserved x/a=endpoint x/b=endpoint x/c=endpoint x/d=endpoint"; got != want {
		t.Errorf("peers %s, want %s", got, want)
	}
}

func TestPeerOf(t *testing.T) {
	for _, c := range []struct {
		in   api.FlowPeer
		want Peer
	}{
		{api.FlowPeer{Namespace: "x", Name: "a", IP: "198.18.0.2"}, Peer{ID: "x/a", Namespace: "x", Name: "a", Kind: "endpoint", IP: "198.18.0.2"}},
		{api.FlowPeer{Namespace: "x", Name: "r", IP: "198.19.0.2", Node: "n2"}, Peer{ID: "x/r", Namespace: "x", Name: "r", Kind: "remote-endpoint", IP: "198.19.0.2", Node: "n2"}},
		{api.FlowPeer{IP: "10.1.2.3", Labels: []string{"cidr:10.0.0.0/8 (endpoint address)"}}, Peer{ID: "cidr:10.0.0.0/8", Name: "10.0.0.0/8", Kind: "cidr"}},
		{api.FlowPeer{IP: "192.0.2.1", Labels: []string{"reserved:host"}}, Peer{ID: "reserved:host", Name: "host", Kind: "reserved"}},
		{api.FlowPeer{IP: "192.0.2.1"}, Peer{ID: "ip:192.0.2.1", Name: "192.0.2.1", Kind: "address", IP: "192.0.2.1"}},
	} {
		if got := peerOf(c.in); got != c.want {
			t.Errorf("peerOf(%+v) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

// A flow row names the deciding rule's policy, or, for a default deny that no rule
// decided, the policies behind it.
func TestRowPolicy(t *testing.T) {
	ruled := rowOf(api.Flow{Verdict: "DROPPED", Reason: "policy-deny", Rule: &api.RuleRef{ID: 3, Policy: "CiliumNetworkPolicy/x/b", Rule: "specs[0].ingressDeny[0]"}})
	if ruled.Policy != "CiliumNetworkPolicy/x/b" || ruled.Rule != "specs[0].ingressDeny[0]" {
		t.Errorf("deny rule: policy %q rule %q", ruled.Policy, ruled.Rule)
	}
	dd := rowOf(api.Flow{Verdict: "DROPPED", Reason: "policy-default-deny", DefaultDenyBy: []string{"NetworkPolicy/x/a", "NetworkPolicy/x/b"}})
	if dd.Policy != "NetworkPolicy/x/a, NetworkPolicy/x/b" || dd.Rule != "default deny" {
		t.Errorf("default deny: policy %q rule %q", dd.Policy, dd.Rule)
	}
}

// TestAggregatorBounds: the edges, each edge's details and the flow table stay within
// their bounds whatever comes, and what they pushed out is counted.
func TestAggregatorBounds(t *testing.T) {
	agg := NewAggregator(3, 4)
	b := ep("x", "b", "198.18.0.3", 80)
	for i := range 5 {
		agg.Add(flowOf(ep("x", fmt.Sprint("c", i), "198.18.1.1", 1000), b, "FORWARDED", "", "egress"))
	}
	// Seen again, x/c2 is the most recent: x/c3 goes for the next new edge.
	agg.Add(flowOf(ep("x", "c2", "198.18.1.1", 1000), b, "FORWARDED", "", "egress"))
	agg.Add(flowOf(ep("x", "c9", "198.18.1.1", 1000), b, "FORWARDED", "", "egress"))
	m := edgesByID(t, agg)
	_, _, st := agg.Edges()
	if len(m) != 3 || st.EdgesEvicted != 3 || st.FlowsSeen != 7 {
		t.Fatalf("edges %v, stats %+v; want 3 edges, 3 evicted", m, st)
	}
	for _, id := range []string{"x/c2->x/b", "x/c4->x/b", "x/c9->x/b"} {
		if _, ok := m[id]; !ok {
			t.Errorf("%s evicted; kept %v", id, m)
		}
	}
	rows, st := agg.Flows(FlowQuery{})
	if len(rows) != 4 || st.FlowsKept != 4 || st.FlowsEvicted != 3 || rows[0].Seq != 7 || rows[3].Seq != 4 {
		t.Fatalf("flow table %+v, stats %+v; want seq 7..4", rows, st)
	}

	// A port scan: the edge keeps maxEdgeDetails ports and counts the rest.
	agg = NewAggregator(0, 0)
	for p := range maxEdgeDetails + 8 {
		agg.Add(flowOf(ep("x", "a", "", 1), ep("x", "b", "", uint16(1000+p)), "DROPPED", "", "ingress"))
	}
	e := edgesByID(t, agg)["x/a->x/b"]
	if len(e.Verdicts[0].Ports) != maxEdgeDetails || e.Omitted != 8 || e.Flows != maxEdgeDetails+8 {
		t.Errorf("port scan edge: %d ports, omitted %d, flows %d", len(e.Verdicts[0].Ports), e.Omitted, e.Flows)
	}
	// A crawler's long paths are cut.
	f := flowOf(ep("x", "a", "", 1), ep("x", "b", "", 80), "FORWARDED", "", "ingress")
	f.L7 = &api.L7Flow{Method: "GET", Path: "/" + strings.Repeat("p", 4000), Status: 404}
	agg.Add(f)
	if r, _ := agg.Flows(FlowQuery{Limit: 1}); len(r[0].L7.Path) > maxText+len("…") {
		t.Errorf("L7 path kept at %d bytes", len(r[0].L7.Path))
	}
}

func TestFlowQuery(t *testing.T) {
	agg := NewAggregator(0, 0)
	for _, f := range sample() {
		agg.Add(f)
	}
	for _, c := range []struct {
		q    FlowQuery
		want int
	}{
		{FlowQuery{}, 8},
		{FlowQuery{Verdict: "dropped"}, 3},
		{FlowQuery{Pod: "x/d"}, 2},
		{FlowQuery{Pod: "world"}, 1},
		{FlowQuery{Port: 81}, 2},
		{FlowQuery{Namespace: "y"}, 0},
		{FlowQuery{Namespace: "x", Verdict: "FORWARDED", Limit: 2}, 2},
	} {
		if rows, _ := agg.Flows(c.q); len(rows) != c.want {
			t.Errorf("%+v: %d rows, want %d", c.q, len(rows), c.want)
		}
	}
}

// fakeSource lists fixed endpoints and sends its flows as history, then follows until
// the request ends.
type fakeSource struct {
	eps   []api.Endpoint
	flows []api.Flow
	lost  uint64 // told to the request's Lost before the flows
}

func (s fakeSource) ListEndpoints(context.Context) ([]api.Endpoint, error) { return s.eps, nil }
func (s fakeSource) ListRemoteEndpoints(context.Context) ([]api.RemoteEndpoint, error) {
	return []api.RemoteEndpoint{{Namespace: "y", Name: "far", Node: "n2", IP: "198.19.0.9"}}, nil
}

func (s fakeSource) Observe(ctx context.Context, req api.ObserveRequest, send func(api.Flow) error) error {
	if s.lost > 0 && req.Lost != nil {
		req.Lost(s.lost)
	}
	for _, f := range s.flows {
		if err := send(f); err != nil {
			return err
		}
	}
	if req.Follow {
		<-ctx.Done()
	}
	return nil
}

func TestHandler(t *testing.T) {
	src := fakeSource{eps: []api.Endpoint{{Namespace: "x", Name: "a", IP: "198.18.0.2"}, {Namespace: "z", Name: "idle"}}, flows: sample(), lost: 7}
	agg := NewAggregator(0, 0)
	// Ended already: the fake sends its history and returns.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Follow(ctx, src, agg); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(src, agg))
	defer srv.Close()
	get := func(path string, v any) *http.Response {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if v != nil {
			if err := json.Unmarshal(b, v); err != nil {
				t.Fatalf("GET %s: %v\n%s", path, err, b)
			}
		}
		return resp
	}
	var m Map
	get("/api/map", &m)
	if m.Stats.FlowsLost != 7 {
		t.Errorf("flows lost %d, want the 7 the agent said the map missed", m.Stats.FlowsLost)
	}
	var groups []string
	for _, ns := range m.Namespaces {
		var ids []string
		for _, n := range ns.Nodes {
			ids = append(ids, n.ID)
		}
		groups = append(groups, ns.Name+":"+strings.Join(ids, ","))
	}
	// Listed endpoints without traffic and remote ones are there; the world last.
	if got, want := strings.Join(groups, " "), "x:x/a,x/b,x/c,x/d y:y/far z:z/idle :reserved:world"; got != want {
		t.Errorf("namespaces %s, want %s", got, want)
	}
	if len(m.Edges) != 4 || m.Stats.FlowsSeen != 8 {
		t.Errorf("map has %d edges, stats %+v", len(m.Edges), m.Stats)
	}
	var ft FlowTable
	if resp := get("/api/flows?verdict=DROPPED&port=80&limit=5", &ft); resp.StatusCode != 200 || len(ft.Flows) != 2 {
		t.Errorf("filtered flows: %s, %+v", resp.Status, ft.Flows)
	}
	if resp := get("/api/flows?port=http", nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad port: %s", resp.Status)
	}
	resp := get("/", nil)
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Errorf("GET /: %s %v", resp.Status, resp.Header)
	}
	for _, f := range []string{"/app.js", "/style.css"} {
		if resp := get(f, nil); resp.StatusCode != 200 {
			t.Errorf("GET %s: %s", f, resp.Status)
		}
	}
	// Read-only: other methods are refused.
	r, err := http.Post(srv.URL+"/api/map", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /api/map: %s", r.Status)
	}
	// A name other than localhost is refused (DNS rebinding); addresses and localhost pass.
	for host, want := range map[string]int{"evil.example:80": 403, "localhost:1": 200, "127.0.0.1:1": 200, "[::1]:1": 200} {
		req, _ := http.NewRequest("GET", srv.URL+"/api/map", nil)
		req.Host = host
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != want {
			t.Errorf("Host %s: %s, want %d", host, r.Status, want)
		}
	}
}

// blockedSource is an agent whose endpoint list waits, as behind a long change.
type blockedSource struct {
	fakeSource
	entered chan struct{}
	release chan struct{}
}

func (s blockedSource) ListEndpoints(ctx context.Context) ([]api.Endpoint, error) {
	s.entered <- struct{}{}
	<-s.release
	return nil, nil
}

// TestMapRequestsBounded: requests waiting for the agent do not pile up without bound.
func TestMapRequestsBounded(t *testing.T) {
	src := blockedSource{entered: make(chan struct{}), release: make(chan struct{})}
	srv := httptest.NewServer(Handler(src, NewAggregator(0, 0)))
	defer srv.Close()
	done := make(chan int, maxMapRequests)
	for range maxMapRequests {
		go func() {
			r, err := http.Get(srv.URL + "/api/map")
			if err != nil {
				done <- 0
				return
			}
			r.Body.Close()
			done <- r.StatusCode
		}()
		<-src.entered
	}
	r, err := http.Get(srv.URL + "/api/map")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("request %d while %d wait: %s, want 503", maxMapRequests+1, maxMapRequests, r.Status)
	}
	close(src.release)
	for range maxMapRequests {
		if code := <-done; code != http.StatusOK {
			t.Errorf("a waiting request got %d", code)
		}
	}
}
