package l7

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// TestL7SendSide runs the agent with the send-side L7 verdict (--l7-send-side): requests
// between the local client and server whose rules the kernel can match are checked on the
// client's own socket, with no proxy hop; everything else still goes through the proxy.
// The shared subtests run unchanged where their rules and requests are in the kernel's
// subset (their h2c cases are left out: HTTP/2 is not); the others state the send-side's
// own answers (docs/internals/l7-send-side.md, "Requests outside the subset").
func TestL7SendSide(t *testing.T) {
	e := startEnvWith(t, agenttest.Options{L7SendSide: true})
	t.Run("no-proxy-hop", func(t *testing.T) { testNoProxyHop(t, e) })
	t.Run("fallback-to-proxy", func(t *testing.T) { testSendSideFallback(t, e) })
	t.Run("matching", func(t *testing.T) {
		t.Run("method", func(t *testing.T) { testMethod(t, e) })
		t.Run("path", func(t *testing.T) { testPath(t, e) })
		t.Run("query", func(t *testing.T) { testQuery(t, e) })
		t.Run("host", func(t *testing.T) { testSendSideHost(t, e) })
		t.Run("host-exact", func(t *testing.T) { testSendSideHostExact(t, e) })
		t.Run("headers", func(t *testing.T) { testHeaders(t, e) })
		t.Run("peers", func(t *testing.T) { testPeers(t, e) })
	})
	t.Run("keep-alive", func(t *testing.T) { testSendSideKeepAlive(t, e) })
	t.Run("outside-subset", func(t *testing.T) { testSendSideOutsideSubset(t, e) })
	t.Run("live-changes", func(t *testing.T) { testLiveChanges(t, e) })
	t.Run("established-direct-connection", func(t *testing.T) { testEstablishedDirect(t, e) })
	t.Run("agent-restart", func(t *testing.T) { testSendSideRestart(t, e) })
}

// The verdict is pinned: while the agent is stopped, and after it started again, an open
// connection is still checked request by request, and new connections too; the restarted
// agent takes its pairs and slots back and goes on reporting.
func testSendSideRestart(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/v1")}})
	c := e.raw(t, e.clientNS, 10*time.Second)
	exchange := func(when, method string, want int) {
		t.Helper()
		m := marker()
		// Each exchange gets its own deadline: the connection outlives an agent stop and
		// start, which take longer than one exchange's budget on a loaded machine.
		c.Conn.SetDeadline(time.Now().Add(10 * time.Second))
		if err := c.Send(rawReq(method, "/v1", "server", m)); err != nil {
			t.Fatalf("%s: %s /v1: %v", when, method, err)
		}
		resp, _, err := c.Response(nil)
		if err != nil || resp.StatusCode != want {
			t.Fatalf("%s: %s /v1: %v %v, want %d", when, method, resp, err, want)
		}
		if seen := len(e.rec.requests(m)); seen != map[bool]int{true: 1, false: 0}[want == 200] {
			t.Fatalf("%s: %s /v1 reached the server %d times", when, method, seen)
		}
	}
	exchange("before", "GET", 200)
	exchange("before", "DELETE", 403)
	e.Stop()
	exchange("agent stopped", "GET", 200)
	exchange("agent stopped", "DELETE", 403)
	e.Start()
	e.waitProxy(t, 30*time.Second)
	exchange("after the restart", "GET", 200)
	exchange("after the restart", "DELETE", 403)
	e.checkVia(t, 0,
		hcase{method: "GET", target: "/v1", want: 200},
		hcase{method: "DELETE", target: "/v1", want: 403},
	)
	st, err := e.Client.Status(t.Context())
	if err != nil || st.SendSide == nil || st.SendSide.Pairs != 1 {
		t.Fatalf("status after the restart: %+v %v, want the pair back", st.SendSide, err)
	}
}

// fastPathRequests is how many requests the proxy's fast path has checked.
func (e *env) fastPathRequests(t *testing.T) uint64 {
	t.Helper()
	p := e.proxyStatus(t)
	if p.FastPath == nil {
		t.Fatal("no fast path status")
	}
	return p.FastPath.Requests
}

// checkVia is check, and that the proxy's fast path checked viaProxy of the cases (0: the
// send-side verdict checked them all).
func (e *env) checkVia(t *testing.T, viaProxy uint64, cases ...hcase) {
	t.Helper()
	before := e.fastPathRequests(t)
	e.check(t, cases...)
	if n := e.fastPathRequests(t) - before; n != viaProxy {
		t.Fatalf("the proxy's fast path checked %d requests, want %d", n, viaProxy)
	}
}

// The send-side verdict, not the proxy, checks a pair whose rules the kernel matches: the
// proxy counts none of its requests, the server gets them straight from the client, and
// the L7 flows say so.
func testNoProxyHop(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/v1")}})
	e.checkVia(t, 0,
		hcase{method: "GET", target: "/v1", want: 200},
		hcase{method: "DELETE", target: "/v1", want: 403},
	)
	for _, s := range e.rec.all() {
		if s.URI == "/v1" && len(s.Header.Values("X-Forwarded-For")) != 0 {
			t.Fatalf("GET /v1 reached the server through the proxy (X-Forwarded-For %q)", s.Header.Values("X-Forwarded-For"))
		}
	}
	st, err := e.Client.Status(t.Context())
	if err != nil || st.SendSide == nil || st.SendSide.Pairs < 1 || st.SendSide.Passed < 1 || st.SendSide.Refused < 1 {
		t.Fatalf("status: %+v %v, want a pair, a passed and a refused request", st.SendSide, err)
	}
	if out := e.MustCLI("status"); !strings.Contains(out, "L7 send-side:") {
		t.Fatalf("rampart status does not show the send-side verdict:\n%s", out)
	}
	var flows string
	if !testenv.Eventually(5*time.Second, func() bool {
		flows, _, _ = e.CLI("observe", "--since-start", "--type", "l7", "--last", "20", "-o", "json")
		return strings.Contains(flows, `"detail":"send_side_passed"`) && strings.Contains(flows, `"detail":"send_side_access_denied"`)
	}) {
		t.Fatalf("no send-side L7 flows in:\n%s", flows)
	}
	// observe says the send-side verdict checked them: the dataplane's new flow from the
	// client to the server, and the requests.
	newFlow := fmt.Sprintf("%s:%d egress FORWARDED (L7 send-side verdict)", e.server.IP, httpPort)
	var l3, l7 string
	if !testenv.Eventually(5*time.Second, func() bool {
		l3, _, _ = e.CLI("observe", "--since-start", "--type", "l3l4", "--endpoint", e.clientKey)
		l7, _, _ = e.CLI("observe", "--since-start", "--type", "l7", "--endpoint", e.clientKey)
		return hasLine(l3, newFlow) && hasLine(l7, "GET", " /v1 200 ", "(L7 send-side verdict)")
	}) {
		t.Fatalf("observe does not show the send-side flows as such:\n%s\n%s", l3, l7)
	}
}

// hasLine reports whether one line of out contains every part.
func hasLine(out string, parts ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}

// A rule that is neither a literal nor a literal prefix: the pair goes through the proxy.
func testSendSideFallback(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/v[0-9]")}})
	e.checkVia(t, 2,
		hcase{method: "GET", target: "/v1", want: 200},
		hcase{method: "GET", target: "/vx", want: 403},
	)
}

// Host rules the kernel matches are exact host names; what testHost checks beyond that
// (an optional port, case folding) takes regular expressions, so the proxy's.
func testSendSideHost(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{
		httpRule("host", `server\.example`, "path", "/h"),
		httpRule("host", `server.example:80`, "path", "/hp"), // "." matches any byte: the proxy's
	}})
	e.check(t,
		hcase{method: "GET", target: "/h", host: "server.example", want: 200},
		hcase{method: "GET", target: "/hp", host: "server.example:80", want: 200},
		hcase{method: "GET", target: "/hp", host: "serverXexample:80", want: 200},
		hcase{method: "GET", target: "/h", host: "server.example:80", want: 403},
		hcase{method: "GET", target: "/h", host: "SERVER.example", want: 403},
		hcase{method: "GET", target: "/h", host: "server.example.evil", want: 403},
		hcase{method: "GET", target: "/h", host: "-", want: 400},
	)
}

// Exact host names alone: the send-side verdict's.
func testSendSideHostExact(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("host", `server\.example`, "path", "/h")}})
	e.checkVia(t, 0,
		hcase{method: "GET", target: "/h", host: "server.example", want: 200},
		hcase{method: "GET", target: "/h", host: "server.example:80", want: 403},
		hcase{method: "GET", target: "/h", host: "SERVER.example", want: 403},
		hcase{method: "GET", target: "/h", host: "xserver.example", want: 403},
		hcase{method: "GET", target: "/h", host: "-", want: 400},
		// Outside the subset (the proxy would merge the two, or take the host from the
		// target): refused with 400.
		hcase{method: "GET", target: "/h", host: "server.example", hdr: []string{"Host: evil"}, want: 400},
		hcase{method: "GET", target: "http://server.example/h", host: "server.example", want: 400},
	)
}

// Allowed and refused requests mixed on one kept-alive connection, one at a time: every
// request is checked on its own, refusals are 403 from the client's own socket and the
// connection goes on; bodies pass whole.
func testSendSideKeepAlive(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{
		httpRule("method", "GET", "path", "/v1"),
		httpRule("method", "POST", "path", "/v1/upload"),
	}})
	steps := []struct {
		method, path, body string
		want               int
	}{
		{"GET", "/v1", "", 200}, {"GET", "/admin", "", 403}, {"POST", "/v1/upload", "hello", 200},
		{"DELETE", "/v1", "", 403}, {"GET", "/v1", "", 200}, {"POST", "/admin", "", 403},
		{"GET", "/v1/x", "", 403}, {"HEAD", "/v1", "", 403}, {"GET", "/v1", "", 200},
		{"POST", "/admin", "refused body", 403}, {"GET", "/v1", "", 200},
	}
	c := e.raw(t, e.clientNS, 10*time.Second)
	for i, s := range steps {
		m := marker()
		var hdr []string
		if s.method == "POST" {
			hdr = append(hdr, "Content-Length: "+itoa(len(s.body)))
		}
		if err := c.Send(rawReq(s.method, s.path, "server", m, hdr...) + s.body); err != nil {
			t.Fatalf("request %d (%s %s): %v", i, s.method, s.path, err)
		}
		resp, body, err := c.Response(&http.Request{Method: s.method})
		if err != nil {
			t.Fatalf("request %d (%s %s): %v (the connection must stay open)", i, s.method, s.path, err)
		}
		if resp.StatusCode != s.want || resp.Close {
			t.Fatalf("request %d (%s %s): %d %q close=%v, want %d on an open connection", i, s.method, s.path, resp.StatusCode, body, resp.Close, s.want)
		}
		got := e.rec.requests(m)
		if want := map[bool]int{true: 1, false: 0}[s.want == 200]; len(got) != want {
			t.Fatalf("request %d (%s %s): the server got it %d times, want %d", i, s.method, s.path, len(got), want)
		}
		if s.want == 200 && s.method == "POST" && got[0].Body != s.body {
			t.Fatalf("request %d: the server got body %q", i, got[0].Body)
		}
		if s.want != 200 && s.body != "" && e.rec.rawContains(s.body) {
			t.Fatalf("request %d: the refused body reached the server", i)
		}
	}
}

// Request smuggling attempts, malformed requests and bytes that are not HTTP: the kernel
// cannot hand them to Envoy halfway through a connection, so it answers 400 (or fails
// the send, when an answer could come out of order) and lets nothing more through on
// that connection. Nothing of them reaches the server.
func testSendSideOutsideSubset(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: smugglingRules})
	for _, c := range []struct{ name, data string }{
		{"cl-te", front("m1", "Content-Length: 40", "Transfer-Encoding: chunked") + "0\r\n\r\n" + smuggled("s1")},
		{"te-cl", front("m2", "Transfer-Encoding: chunked", "Content-Length: 4") + "5c\r\n" + smuggled("s2") + "\r\n0\r\n\r\n"},
		{"te-only", front("m3", "Transfer-Encoding: chunked") + "0\r\n\r\n" + smuggled("s3")},
		{"duplicate-cl", front("m4", "Content-Length: 0", "Content-Length: 41") + smuggled("s4")},
		{"cl-list", front("m5", "Content-Length: 0, 41") + smuggled("s5")},
		{"space-before-colon", front("m6", "Content-Length : 41") + smuggled("s6")},
		{"obs-fold", front("m7", "X-A: 1", " Content-Length: 41") + smuggled("s7")},
		{"bare-lf", strings.ReplaceAll(front("m8", "Content-Length: 0"), "\r\n", "\n") + smuggled("s8")},
		{"http10", strings.Replace(rawReq("GET", "/v1", "server", "m9"), "HTTP/1.1", "HTTP/1.0", 1)},
		{"tls-client-hello", string(clientHello(t))},
		{"ssh-banner", "SSH-2.0-OpenSSH_9.6p1 Debian-4\r\n"},
		{"http2-preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"},
		{"oversized-head", rawReq("GET", "/v1", "server", "m10", "X-Pad: "+strings.Repeat("a", 3000))},
	} {
		t.Run(c.name, func(t *testing.T) {
			bytesIn := e.rec.rawLen()
			conn := e.raw(t, e.clientNS, 5*time.Second)
			if err := conn.Send(c.data); err == nil {
				resp, _, err := conn.Response(nil)
				if err != nil || resp.StatusCode != 400 || !resp.Close {
					t.Fatalf("answer %v %v, want 400 with Connection: close", resp, err)
				}
			} else if !errors.Is(err, syscall.EACCES) {
				t.Fatalf("send: %v, want a 400 or a refused send", err)
			}
			if err := conn.Send(rawReq("GET", "/v1", "server", marker())); !errors.Is(err, syscall.EACCES) {
				t.Fatalf("a request after it: %v, want a refused send", err)
			}
			if n := e.rec.rawLen() - bytesIn; n != 0 {
				t.Fatalf("the server read %d bytes", n)
			}
		})
	}
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}
