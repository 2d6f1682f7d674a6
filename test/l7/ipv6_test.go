package l7

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// TestL7OverIPv6: on a dual-stack node, L7 rules apply to IPv6 connections as to IPv4
// ones. With the fast path, it checks plain HTTP/1.1 on its IPv6 listener and hands h2c to
// Envoy (a PROXY protocol header with IPv6 addresses); with Envoy alone, Envoy's listener
// has an IPv6 address too. The server sees the client's own IPv6 address; a refused
// request never reaches it; and IPv4 keeps working beside it.
func TestL7OverIPv6(t *testing.T) {
	for _, envoyOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "fast-path", true: "envoy-only"}[envoyOnly], func(t *testing.T) {
			testL7OverIPv6(t, envoyOnly)
		})
	}
}

func testL7OverIPv6(t *testing.T, envoyOnly bool) {
	e := startEnvWith(t, agenttest.Options{PodCIDR6: netip.MustParsePrefix("2001:2::/64"), ProxyEnvoyOnly: envoyOnly})
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/v1")}})
	st := e.waitProxy(t, 30*time.Second)
	if !envoyOnly && (st.FastPath == nil || !strings.Contains(st.FastPath.Listen, "[::1]:")) {
		t.Fatalf("the fast path has no IPv6 listener: %+v", st.FastPath)
	}
	cases := []hcase{
		{method: "GET", target: "/v1", want: 200},
		{method: "GET", target: "/admin", want: 403},
		{method: "POST", target: "/v1", want: 403},
		{method: "GET", target: "/v1", h2: true, want: 200},
		{method: "GET", target: "/admin", h2: true, want: 403},
	}
	v4 := e.httpAddr
	e.httpAddr = netip.AddrPortFrom(e.IP6(e.serverKey), httpPort)
	t.Cleanup(func() { e.httpAddr = v4 })
	e.check(t, cases...)
	client6 := e.IP6(e.clientKey)
	for _, r := range e.rec.all() {
		if r.URI == "/v1" && !strings.HasPrefix(r.Remote, "["+client6.String()+"]:") {
			t.Errorf("the server saw a request over IPv6 from %s, want the client's %s", r.Remote, client6)
		}
	}
	if n := len(e.rec.all()); n != 2 {
		t.Errorf("the server got %d requests over IPv6, want the 2 allowed", n)
	}
	// The same rules over IPv4, beside.
	e.httpAddr = v4
	e.check(t, cases...)
}
