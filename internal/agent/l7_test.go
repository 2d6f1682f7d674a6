package agent

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/l7plan/l7plantest"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/proxy"
)

const l7Deathstar = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: rule1, namespace: sw}
spec:
  endpointSelector: {matchLabels: {class: deathstar}}
  ingress:
  - fromEndpoints: [{matchLabels: {org: empire}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules:
        http:
        - {method: GET, path: /v1}
        - {method: POST, path: /v1/request-landing}
`

const l3Deathstar = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: rule1, namespace: sw}
spec:
  endpointSelector: {matchLabels: {class: deathstar}}
  ingress:
  - fromEndpoints: [{matchLabels: {org: empire}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
`

func starwars(h *harness) (tie, ds, xw api.Endpoint) {
	tie = h.add("sw", "tiefighter", map[string]string{"org": "empire", "class": "tiefighter"})
	ds = h.add("sw", "deathstar", map[string]string{"org": "empire", "class": "deathstar"})
	xw = h.add("sw", "xwing", map[string]string{"org": "alliance", "class": "xwing"})
	return
}

func TestL7ProxyBeforeDataplane(t *testing.T) {
	h := newHarness(t)
	if h.dp.proxyListen != proxy.DefaultListen || h.dp.proxyNetns != h.net.NetnsPath() {
		t.Fatalf("dataplane proxy setup: %q %v", h.dp.proxyNetns, h.dp.proxyListen)
	}
	tie, ds, _ := starwars(h)
	if h.prox.count() != 0 {
		t.Fatal("proxy started without L7 rules")
	}
	// The policy route to the proxy costs all forwarded traffic: not without L7 rules.
	if _, err := h.apply("l3.yaml", l3Deathstar); err != nil {
		t.Fatal(err)
	}
	if h.dp.proxyRouted != 0 {
		t.Fatal("proxy route added without L7 rules")
	}
	if st, _ := h.a.Status(context.Background()); st.Proxy.State != "not started" {
		t.Fatalf("proxy state %q before L7 rules", st.Proxy.State)
	}
	if _, err := h.apply("l7.yaml", l7Deathstar); err != nil {
		t.Fatal(err)
	}
	if h.prox.count() != 1 || h.prox.started != 1 {
		t.Fatalf("proxy updates %d, started %d", h.prox.count(), h.prox.started)
	}
	up := h.prox.last()
	// The deathstar's ingress chain, which lets the tiefighter GET /v1 only.
	get := l7plan.Request{Src: netip.MustParseAddr(tie.IP), Dst: netip.MustParseAddr(ds.IP), Port: 80, Method: "GET", Path: "/v1"}
	put := get
	put.Method = "PUT"
	if c := up.plan.Chains; len(c) != 1 || c[0].Ingress == nil || c[0].Ingress.EndpointID != ds.EpID || !up.plan.Allows(get) || up.plan.Allows(put) {
		t.Fatalf("proxy plan: %+v", up.plan.Chains)
	}
	var redirectAt int64
	for _, a := range h.dp.applied {
		if a.epID == ds.EpID && a.redirect {
			redirectAt = a.seq
		}
	}
	if redirectAt == 0 || redirectAt < up.seq {
		t.Fatalf("redirect entries applied at %d, proxy updated at %d: the proxy must come first", redirectAt, up.seq)
	}
	if h.dp.proxyRouted != 1 || h.dp.proxyRoutedAt > redirectAt {
		t.Fatalf("proxy route added %d times, at %d; redirect entries at %d: want once, before", h.dp.proxyRouted, h.dp.proxyRoutedAt, redirectAt)
	}
	st, _ := h.a.Status(context.Background())
	if st.Proxy.State != "running" || st.Proxy.PID != 4242 {
		t.Fatalf("proxy status: %+v", st.Proxy)
	}

	// Trace: redirected, with the L7 rules.
	res, err := h.a.Trace(context.Background(), api.TraceRequest{From: "sw/tiefighter", To: "sw/deathstar", Port: 80, Protocol: "TCP"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Allowed || !res.Redirected || len(res.Sides) != 2 || !res.Sides[1].Redirected || len(res.Sides[1].L7) != 1 {
		t.Fatalf("trace: %+v", res)
	}
	l7 := res.Sides[1].L7[0]
	if l7.Rule == nil || l7.Rule.Policy != "CiliumNetworkPolicy/sw/rule1" || strings.Join(l7.HTTP, "; ") != `method "GET" path "/v1"; method "POST" path "/v1/request-landing"` {
		t.Fatalf("trace L7: %+v %v", l7.Rule, l7.HTTP)
	}

	// Back to L3/L4: the proxy keeps the old chains until the dataplane stopped steering,
	// then drops them.
	n := h.prox.count()
	if _, err := h.apply("l3.yaml", l3Deathstar); err != nil {
		t.Fatal(err)
	}
	if h.prox.count() != n+2 {
		t.Fatalf("%d proxy updates for the L7 removal, want 2", h.prox.count()-n)
	}
	first, second := h.prox.updates[n], h.prox.updates[n+1]
	// First the old chain, judging by the new (L3/L4) policy; then none.
	if len(first.plan.Chains) != 1 || !first.plan.Allows(put) || len(second.plan.Chains) != 0 {
		t.Fatalf("removal updates: chains %+v then %+v", first.plan.Chains, second.plan.Chains)
	}
	var plainAt int64
	for _, a := range h.dp.applied {
		if a.epID == ds.EpID && !a.redirect {
			plainAt = a.seq
		}
	}
	if !(first.seq < plainAt && plainAt < second.seq) {
		t.Fatalf("order: keep update %d, dataplane %d, prune %d", first.seq, plainAt, second.seq)
	}
	// L7 again: the route is there already.
	if _, err := h.apply("l7.yaml", l7Deathstar); err != nil {
		t.Fatal(err)
	}
	if h.dp.proxyRouted != 1 {
		t.Fatalf("proxy route added %d times, want once", h.dp.proxyRouted)
	}
}

// The L7 plans of a change are built once, and a second one (with the old state's chains
// kept) only when the old state has a chain the new one lacks.
func TestL7PlansOncePerChange(t *testing.T) {
	w := l7plantest.NewWorld()
	sel := func(class string) labels.Selector { return l7plantest.Sel(t, "class", class) }
	l7 := policy.Rule{Subject: sel("deathstar"), Direction: policy.Ingress, EnableDefaultDeny: true,
		Peers: []policy.Peer{{Kind: policy.PeerEndpoints, Selector: sel("tiefighter")}},
		Ports: l7plantest.L7Port(80, policy.HTTPRule{Method: "GET"})}
	plain := l7
	plain.Ports = []policy.PortRule{{Protocol: policy.ProtoTCP, Port: 80}}
	withL7, without := &desired{state: w.Compute(t, l7)}, &desired{state: w.Compute(t, plain)}
	put := l7plan.Request{Src: netip.MustParseAddr("198.18.0.10"), Dst: netip.MustParseAddr("198.18.0.20"), Port: 80, Method: "PUT", Path: "/"}
	for _, tc := range []struct {
		name       string
		old, new   *desired
		plan, kept int  // chains
		keptAllows bool // the kept plan lets the tiefighter PUT
	}{
		{"no L7", without, without, 0, 0, false},
		{"L7 added", without, withL7, 1, 1, false},
		{"L7 kept", withL7, withL7, 1, 1, false},
		{"L7 removed", withL7, without, 0, 1, true},
	} {
		pl := buildL7Plans(tc.old, tc.new)
		if len(pl.plan.Chains) != tc.plan || len(pl.kept.Chains) != tc.kept {
			t.Errorf("%s: %d chains, %d kept, want %d and %d", tc.name, len(pl.plan.Chains), len(pl.kept.Chains), tc.plan, tc.kept)
		}
		if (pl.plan == pl.kept) != (tc.plan == tc.kept) {
			t.Errorf("%s: plan and kept plan the same: %v, want %v", tc.name, pl.plan == pl.kept, tc.plan == tc.kept)
		}
		if got := pl.kept.Allows(put); got != tc.keptAllows {
			t.Errorf("%s: kept plan allows PUT: %v, want %v", tc.name, got, tc.keptAllows)
		}
	}
}

func TestL7ProxyFailureRollsBack(t *testing.T) {
	h := newHarness(t)
	_, ds, _ := starwars(h)
	h.prox.failNext = errors.New("proxy rejected configuration version 2")
	if _, err := h.apply("l7.yaml", l7Deathstar); err == nil || !strings.Contains(err.Error(), "rejected") {
		t.Fatalf("apply with a failing proxy: %v", err)
	}
	for _, a := range h.dp.applied {
		if a.redirect {
			t.Fatalf("redirect entries reached the dataplane for ep %d", a.epID)
		}
	}
	// Rolled back: the proxy was given the previous state (no L7) again.
	// (Chains the failed state had stay, judged by the previous state: no L7 rules.)
	for _, c := range h.prox.last().plan.Chains {
		for _, z := range []*l7plan.Authz{c.Egress, c.Ingress} {
			if z == nil {
				continue
			}
			for _, g := range z.Grants {
				if g.HTTP != nil {
					t.Fatalf("proxy left with L7 rules %+v in chain %s", g.HTTP, c.Name)
				}
			}
		}
	}
	pols, _ := h.a.ListPolicies(context.Background())
	if len(pols) != 0 {
		t.Fatalf("policy stored after a failed apply: %+v", pols)
	}
	_ = ds
}

func TestL7RefusedWithoutEnvoy(t *testing.T) {
	h := newHarness(t)
	starwars(h)
	h.a.Close()
	h.proxyErr = proxy.ErrNoEnvoy
	h.a = nil
	h.start()
	_, err := h.apply("l7.yaml", l7Deathstar)
	var e *api.Error
	if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || !strings.Contains(e.Message, "envoy not found") {
		t.Fatalf("L7 policy without Envoy: %v", err)
	}
	if _, err := h.apply("l3.yaml", l3Deathstar); err != nil {
		t.Fatalf("L3 policy without Envoy: %v", err)
	}
	st, _ := h.a.Status(context.Background())
	if st.Proxy.State != "unavailable" || !strings.Contains(st.Proxy.Error, "envoy not found") {
		t.Fatalf("proxy status: %+v", st.Proxy)
	}
}

func TestL7AccessLogBecomesFlow(t *testing.T) {
	h := newHarness(t)
	tie, ds, _ := starwars(h)
	if _, err := h.apply("l7.yaml", l7Deathstar); err != nil {
		t.Fatal(err)
	}
	pols, _ := h.a.ListPolicies(context.Background())
	ruleID := pols[0].Rules[0].ID
	now := time.Now()
	h.proxyLog(flow.AccessLog{
		Time: now, Chain: "in:" + ds.IP + ":80",
		Src: netip.AddrPortFrom(netip.MustParseAddr(tie.IP), 40000), Dst: netip.AddrPortFrom(netip.MustParseAddr(ds.IP), 80),
		Protocol: "HTTP/1.1", Method: "PUT", Path: "/v1/exhaust-port", Host: "deathstar", Status: 403,
		Latency: 1500 * time.Microsecond, Denied: true, Details: "rbac_access_denied_matched_policy[none]",
		Ingress: &flow.Decision{EndpointID: ds.EpID, Direction: policy.Ingress},
	})
	h.proxyLog(flow.AccessLog{
		Time: now, Chain: "in:" + ds.IP + ":80",
		Src: netip.AddrPortFrom(netip.MustParseAddr(tie.IP), 40000), Dst: netip.AddrPortFrom(netip.MustParseAddr(ds.IP), 80),
		Protocol: "HTTP/1.1", Method: "GET", Path: "/v1", Host: "deathstar", Status: 200, Upstream: true, Details: "via_upstream",
		Ingress: &flow.Decision{EndpointID: ds.EpID, Direction: policy.Ingress, Allowed: true, Grant: "rule-x", RuleID: ruleID},
	})
	var got []api.Flow
	err := h.a.Observe(context.Background(), api.ObserveRequest{Filter: api.FlowFilter{Type: "l7"}, SinceStart: true}, func(f api.Flow) error {
		got = append(got, f)
		return nil
	})
	if err != nil || len(got) != 2 {
		t.Fatalf("l7 flows: %v %+v", err, got)
	}
	d, a := got[0], got[1]
	if d.Type != "l7" || d.Verdict != "DROPPED" || d.Reason != ReasonL7Denied || d.Direction != "ingress" || d.Endpoint != "sw/deathstar" ||
		d.Source.Name != "tiefighter" || d.Source.Identity != tie.Identity || d.Dest.Name != "deathstar" || d.Dest.Port != 80 ||
		d.L7 == nil || d.L7.Method != "PUT" || d.L7.Status != 403 || d.L7.LatencyMs != 1.5 || d.Rule != nil {
		t.Fatalf("denied flow: %+v l7 %+v", d, d.L7)
	}
	if a.Verdict != "FORWARDED" || a.Rule == nil || a.Rule.Policy != "CiliumNetworkPolicy/sw/rule1" || a.L7.Path != "/v1" {
		t.Fatalf("allowed flow: %+v rule %+v", a, a.Rule)
	}
	// The l3l4 filter leaves them out.
	n := 0
	h.a.Observe(context.Background(), api.ObserveRequest{Filter: api.FlowFilter{Type: "l3l4"}, SinceStart: true}, func(f api.Flow) error {
		if f.Type == "l7" {
			n++
		}
		return nil
	})
	if n != 0 {
		t.Fatalf("%d l7 flows with --type l3l4", n)
	}
}

// A connection from the host to a port with ingress L7 rules is not steered (only endpoint
// veths steer), so the dataplane drops it: trace says so.
func TestL7TraceFromHost(t *testing.T) {
	h := newHarness(t)
	starwars(h)
	const hostL7 = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: host-l7, namespace: sw}
spec:
  endpointSelector: {matchLabels: {class: deathstar}}
  ingress:
  - fromEntities: [host]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules: {http: [{method: GET}]}
`
	if _, err := h.apply("host.yaml", hostL7); err != nil {
		t.Fatal(err)
	}
	res, err := h.a.Trace(context.Background(), api.TraceRequest{From: "198.18.0.1", To: "sw/deathstar", Port: 80, Protocol: "TCP"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Allowed || res.Redirected || !strings.Contains(res.Diagnostic, "proxy-bypass") || len(res.Sides) != 1 || !res.Sides[0].Redirected {
		t.Fatalf("trace from the host: %+v", res)
	}
	// The diagnostic is only for sources that are not endpoints: the tiefighter, which no
	// rule names, is simply denied.
	res, err = h.a.Trace(context.Background(), api.TraceRequest{From: "sw/tiefighter", To: "sw/deathstar", Port: 80, Protocol: "TCP"})
	if err != nil || res.Allowed || res.Diagnostic != "" {
		t.Fatalf("trace from the tiefighter: %+v %v", res, err)
	}
}

// L7 flows are decorated when first read, with the view of the moment they were logged:
// an endpoint deleted in between is still named in its earlier requests. A follower gets
// them decorated at once.
func TestL7FlowsDecoratedWithTheirView(t *testing.T) {
	h := newHarness(t)
	tie, ds, _ := starwars(h)
	if _, err := h.apply("l7.yaml", l7Deathstar); err != nil {
		t.Fatal(err)
	}
	request := func(path string) flow.AccessLog {
		return flow.AccessLog{
			Time: time.Now(), Chain: "in:" + ds.IP + ":80",
			Src: netip.AddrPortFrom(netip.MustParseAddr(tie.IP), 40000), Dst: netip.AddrPortFrom(netip.MustParseAddr(ds.IP), 80),
			Protocol: "HTTP/1.1", Method: "GET", Path: path, Status: 200, Upstream: true, Details: "via_upstream",
			Ingress: &flow.Decision{EndpointID: ds.EpID, Direction: policy.Ingress, Allowed: true},
		}
	}
	h.proxyLog(request("/v1/before")) // nobody follows: kept undecorated
	if err := h.a.DeleteEndpoint(context.Background(), "sw", "tiefighter"); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	followed := follow(ctx, h.a, api.FlowFilter{Type: "l7"})
	h.proxyLog(request("/v1/after"))
	select {
	case f := <-followed:
		if f.L7 == nil || f.L7.Path != "/v1/after" || f.Source.Name != "" || f.Dest.Name != "deathstar" || f.Verdict != "FORWARDED" {
			t.Fatalf("followed flow: %+v l7 %+v, want /v1/after from a deleted (unnamed) source to deathstar", f, f.L7)
		}
	case <-ctx.Done():
		t.Fatal("the follower got no flow")
	}

	var got []api.Flow
	if err := h.a.Observe(context.Background(), api.ObserveRequest{Filter: api.FlowFilter{Type: "l7"}, SinceStart: true}, func(f api.Flow) error {
		got = append(got, f)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d l7 flows in the history, want 2", len(got))
	}
	if b := got[0]; b.L7.Path != "/v1/before" || b.Source.Name != "tiefighter" || b.Source.Identity != tie.Identity || b.Endpoint != "sw/deathstar" {
		t.Fatalf("earlier flow: %+v, want it decorated as when logged (source tiefighter, identity %d)", b, tie.Identity)
	}
	if a := got[1]; a.L7.Path != "/v1/after" || a.Source.Name != "" {
		t.Fatalf("later flow: %+v", a)
	}
}

// BenchmarkL7AccessLog is what logging one request costs the proxy's request path:
// "lazy" as the agent does it (record kept, decorated when read), "decorated" as it did
// before (decorate, then publish), both with nobody following.
func BenchmarkL7AccessLog(b *testing.B) {
	h := newHarness(b)
	tie, ds, _ := starwars(h)
	if _, err := h.apply("l7.yaml", l7Deathstar); err != nil {
		b.Fatal(err)
	}
	l := flow.AccessLog{
		Time: time.Now(), Chain: "in:" + ds.IP + ":80",
		Src: netip.AddrPortFrom(netip.MustParseAddr(tie.IP), 40000), Dst: netip.AddrPortFrom(netip.MustParseAddr(ds.IP), 80),
		Protocol: "HTTP/1.1", Method: "GET", Path: "/v1", Host: "deathstar", Status: 200, Upstream: true, Details: "via_upstream",
		Ingress: &flow.Decision{EndpointID: ds.EpID, Direction: policy.Ingress, Allowed: true, RuleID: 1},
	}
	b.Run("lazy", func(b *testing.B) {
		for b.Loop() {
			h.a.onAccessLog(l)
		}
	})
	b.Run("decorated", func(b *testing.B) {
		for b.Loop() {
			h.a.flows.publish(decorateL7(h.a.view.Load(), l))
		}
	})
}
