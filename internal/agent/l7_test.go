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
	_, ds, _ := starwars(h)
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
	if len(up.st.L7) != 1 || up.st.L7[0].EndpointID != ds.EpID || up.keep == nil || len(up.keep.L7) != 0 {
		t.Fatalf("proxy update: L7 %+v keep %v", up.st.L7, up.keep)
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
	if len(first.st.L7) != 0 || first.keep == nil || len(first.keep.L7) != 1 || second.keep != nil {
		t.Fatalf("removal updates: keep %v then %v", first.keep, second.keep)
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
	if last := h.prox.last(); len(last.st.L7) != 0 {
		t.Fatalf("proxy left with L7 rules %+v", last.st.L7)
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
	h.proxyLog(proxy.AccessLog{
		Time: now, Chain: "in:" + ds.IP + ":80",
		Src: netip.AddrPortFrom(netip.MustParseAddr(tie.IP), 40000), Dst: netip.AddrPortFrom(netip.MustParseAddr(ds.IP), 80),
		Protocol: "HTTP/1.1", Method: "PUT", Path: "/v1/exhaust-port", Host: "deathstar", Status: 403,
		Latency: 1500 * time.Microsecond, Denied: true, Details: "rbac_access_denied_matched_policy[none]",
		Ingress: &proxy.Decision{EndpointID: ds.EpID, Direction: policy.Ingress},
	})
	h.proxyLog(proxy.AccessLog{
		Time: now, Chain: "in:" + ds.IP + ":80",
		Src: netip.AddrPortFrom(netip.MustParseAddr(tie.IP), 40000), Dst: netip.AddrPortFrom(netip.MustParseAddr(ds.IP), 80),
		Protocol: "HTTP/1.1", Method: "GET", Path: "/v1", Host: "deathstar", Status: 200, Upstream: true, Details: "via_upstream",
		Ingress: &proxy.Decision{EndpointID: ds.EpID, Direction: policy.Ingress, Allowed: true, Grant: "rule-x", RuleID: ruleID},
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
	request := func(path string) proxy.AccessLog {
		return proxy.AccessLog{
			Time: time.Now(), Chain: "in:" + ds.IP + ":80",
			Src: netip.AddrPortFrom(netip.MustParseAddr(tie.IP), 40000), Dst: netip.AddrPortFrom(netip.MustParseAddr(ds.IP), 80),
			Protocol: "HTTP/1.1", Method: "GET", Path: path, Status: 200, Upstream: true, Details: "via_upstream",
			Ingress: &proxy.Decision{EndpointID: ds.EpID, Direction: policy.Ingress, Allowed: true},
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
	l := proxy.AccessLog{
		Time: time.Now(), Chain: "in:" + ds.IP + ":80",
		Src: netip.AddrPortFrom(netip.MustParseAddr(tie.IP), 40000), Dst: netip.AddrPortFrom(netip.MustParseAddr(ds.IP), 80),
		Protocol: "HTTP/1.1", Method: "GET", Path: "/v1", Host: "deathstar", Status: 200, Upstream: true, Details: "via_upstream",
		Ingress: &proxy.Decision{EndpointID: ds.EpID, Direction: policy.Ingress, Allowed: true, RuleID: 1},
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
