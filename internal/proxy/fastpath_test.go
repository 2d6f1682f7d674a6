package proxy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv"
)

// fastPathRig is a fast path on loopback: its listener, a server its upstream connections
// go to (instead of the original destination, which on loopback is the listener itself),
// and a stand-in for Envoy that records what it is handed.
type fastPathRig struct {
	f      *fastPath
	m      *Manager
	server *httptest
	envoy  net.Listener
	handed chan string
	mu     sync.Mutex
	logs   []flow.AccessLog
}

// httptest is a plain HTTP server that answers with what it got.
type httptest struct {
	addr netip.AddrPort
	srv  *http.Server
	mu   sync.Mutex
	got  []string // "METHOD URI xff=..."
}

func startHTTPTest(t *testing.T) *httptest {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &httptest{addr: addrPortOf(l.Addr())}
	h.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		line := fmt.Sprintf("%s %s xff=%s", r.Method, r.RequestURI, strings.Join(r.Header.Values("X-Forwarded-For"), ","))
		h.mu.Lock()
		h.got = append(h.got, line)
		h.mu.Unlock()
		if r.URL.Path == "/chunked" {
			io.WriteString(w, "part one, ")
			w.(http.Flusher).Flush() // no length known: chunked
			io.WriteString(w, "part two")
			return
		}
		io.WriteString(w, line)
	})}
	go h.srv.Serve(l)
	t.Cleanup(func() { h.srv.Close() })
	return h
}

func (h *httptest) requests() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

func startFastPathRig(t *testing.T, rules []policy.HTTPRule) *fastPathRig {
	testenv.RequireRoot(t) // transparent sockets and socket marks
	r := &fastPathRig{server: startHTTPTest(t), handed: make(chan string, 4)}
	var err error
	if r.envoy, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.envoy.Close() })
	go r.serveEnvoy()
	r.m = &Manager{log: slog.Default()}
	r.m.cfg.Options = Options{
		Listen: netip.MustParseAddrPort("127.0.0.1:0"), EnvoyListen: addrPortOf(r.envoy.Addr()),
		UpstreamMark: DefaultUpstreamMark, FastPath: true,
	}
	r.m.cfg.OnAccessLog = func(l flow.AccessLog) {
		r.mu.Lock()
		r.logs = append(r.logs, l)
		r.mu.Unlock()
	}
	r.m.plan.Store(&l7plan.Plan{})
	if r.f, err = startFastPath(r.m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.f.close)
	r.f.redirect = func(netip.AddrPort) netip.AddrPort { return r.server.addr }
	lo := netip.MustParseAddr("127.0.0.1")
	r.m.plan.Store(&l7plan.Plan{Chains: []l7plan.Chain{{
		Name: "in:test", Port: r.f.listen.Port(), Dst: lo,
		Ingress: &l7plan.Authz{EndpointID: 2, Direction: policy.Ingress, Port: r.f.listen.Port(), Grants: []l7plan.Grant{{
			Name: "rule-7-0", RuleID: 7, Peers: l7plan.AddrSet{{Prefix: netip.PrefixFrom(lo, 32)}}, HTTP: rules,
		}}},
	}}})
	return r
}

// serveEnvoy stands in for Envoy: it reads what a handed-over connection brings until the
// end of the first request's chunked body, reports it, and answers 299.
func (r *fastPathRig) serveEnvoy() {
	for {
		c, err := r.envoy.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			var got strings.Builder
			for !strings.HasSuffix(got.String(), "0\r\n\r\n") {
				b, err := br.ReadByte()
				if err != nil {
					break
				}
				got.WriteByte(b)
			}
			r.handed <- got.String()
			io.WriteString(c, "HTTP/1.1 299 Handed\r\ncontent-length: 0\r\n\r\n")
		}()
	}
}

// waitLogs returns the access logs once there are n of them, or what there is after 5 s.
func (r *fastPathRig) waitLogs(n int) []flow.AccessLog {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		r.mu.Lock()
		logs := append([]flow.AccessLog(nil), r.logs...)
		r.mu.Unlock()
		if len(logs) >= n || time.Now().After(deadline) {
			return logs
		}
	}
}

func (r *fastPathRig) dial(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp4", r.f.listen.String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c, bufio.NewReader(c)
}

func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, method, target string) (int, string) {
	t.Helper()
	if _, err := fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: server\r\n\r\n", method, target); err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, target, err)
	}
	if resp.Close {
		t.Fatalf("%s %s: %d, connection closed", method, target, resp.StatusCode)
	}
	return resp.StatusCode, string(body)
}

// Allowed and refused requests on one kept-alive connection, a chunked response, HEAD, the
// headers the server gets, and the access log of each request.
func TestFastPathRequests(t *testing.T) {
	r := startFastPathRig(t, []policy.HTTPRule{{Method: "GET|HEAD", Path: "/v1"}, {Method: "GET", Path: "/chunked"}})
	c, br := r.dial(t)
	steps := []struct {
		method, target string
		status         int
		body           string
	}{
		{"GET", "/v1?q=1", 200, "GET /v1?q=1 xff=127.0.0.1"},
		{"GET", "/admin", 403, forbiddenBody},
		{"HEAD", "/admin", 403, ""},
		{"HEAD", "/v1", 200, ""},
		{"POST", "/v1", 403, forbiddenBody},
		{"GET", "/chunked", 200, "part one, part two"},
		{"GET", "/v1", 200, "GET /v1 xff=127.0.0.1"},
	}
	for _, s := range steps {
		status, body := roundTrip(t, c, br, s.method, s.target)
		if status != s.status || body != s.body {
			t.Errorf("%s %s: %d %q, want %d %q", s.method, s.target, status, body, s.status, s.body)
		}
	}
	want := []string{"GET /v1?q=1 xff=127.0.0.1", "HEAD /v1 xff=127.0.0.1", "GET /chunked xff=127.0.0.1", "GET /v1 xff=127.0.0.1"}
	if got := r.server.requests(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the server got %q, want %q", got, want)
	}
	// A request is logged once its response is out, as Envoy does: the client can read the
	// last response before its log is written.
	logs := r.waitLogs(len(steps))
	if len(logs) != len(steps) {
		t.Fatalf("%d access logs, want %d", len(logs), len(steps))
	}
	for i, l := range logs {
		s := steps[i]
		d := l.Ingress
		if l.Method != s.method || l.Path != s.target || l.Status != uint32(s.status) || l.Chain != "in:test" || d == nil ||
			d.Allowed != (s.status == 200) || l.Denied == d.Allowed || l.Upstream != d.Allowed {
			t.Errorf("log %d: %+v (ingress %+v), want %s %s %d", i, l, d, s.method, s.target, s.status)
		}
		if d != nil && d.Allowed && (d.Grant != "rule-7-0" || d.RuleID != 7) {
			t.Errorf("log %d: grant %q rule %d, want rule-7-0 of rule 7", i, d.Grant, d.RuleID)
		}
	}
	if st := r.f.status(); st.Requests != uint64(len(steps)) || st.Denied != 3 || st.HandedOver != 0 {
		t.Errorf("status %+v", st)
	}
}

// A request outside the fast path's subset goes to Envoy with a PROXY protocol header and
// exactly the bytes the client sent; with no Envoy to take it, the connection is closed.
func TestFastPathHandsOverToEnvoy(t *testing.T) {
	r := startFastPathRig(t, []policy.HTTPRule{{Method: "GET", Path: "/v1"}})
	c, br := r.dial(t)
	if status, _ := roundTrip(t, c, br, "GET", "/v1"); status != 200 {
		t.Fatalf("GET /v1: %d", status)
	}
	req := "POST /v1 HTTP/1.1\r\nHost: server\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
	io.WriteString(c, req)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 299 {
		t.Fatalf("handed-over request: %v %v", resp, err)
	}
	local := addrPortOf(c.LocalAddr())
	wantHeader := fmt.Sprintf("PROXY TCP4 127.0.0.1 127.0.0.1 %d %d\r\n", local.Port(), r.f.listen.Port())
	if got := <-r.handed; got != wantHeader+req {
		t.Errorf("envoy got %q, want %q", got, wantHeader+req)
	}
	if n := len(r.server.requests()); n != 1 {
		t.Errorf("the server got %d requests, want 1 (the handed-over one is Envoy's)", n)
	}

	// No Envoy: closed, nothing answered, nothing forwarded.
	r.envoy.Close()
	c2, br2 := r.dial(t)
	io.WriteString(c2, req)
	if b, err := br2.ReadByte(); err == nil {
		t.Errorf("with no Envoy the connection answered %q", b)
	}
	if st := r.f.status(); st.HandedOver != 2 {
		t.Errorf("status %+v, want 2 connections handed over", st)
	}
}

// A connection that matches no chain of the plan is closed without an answer.
func TestFastPathNoChain(t *testing.T) {
	r := startFastPathRig(t, []policy.HTTPRule{{Method: "GET", Path: "/v1"}})
	r.m.plan.Store(&l7plan.Plan{})
	c, br := r.dial(t)
	io.WriteString(c, "GET /v1 HTTP/1.1\r\nHost: server\r\n\r\n")
	if b, err := br.ReadByte(); err == nil {
		t.Errorf("a connection with no chain answered %q", b)
	}
	if n := len(r.server.requests()); n != 0 {
		t.Errorf("the server got %d requests", n)
	}
}
