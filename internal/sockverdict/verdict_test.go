package sockverdict

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/l7table"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv"
)

// The send-side verdict, with real sockets: a client and a server in a namespace of the
// test's own, the client's requests checked by sv_request as they are sent.

var (
	svClient = netip.MustParseAddr("198.18.77.1")
	svServer = netip.MustParseAddr("198.18.77.2")
)

// svWorld is one test's namespace, server and verdict.
type svWorld struct {
	t      *testing.T
	ns     string
	sv     *Verdict
	port   uint16
	cookie uint64
	srv    *svServerRec
}

// svServerRec is an HTTP server that records what reached it: the requests its handler
// saw, and every byte its connections read (so that a test can tell that refused bytes
// never arrived).
type svServerRec struct {
	mu       sync.Mutex
	requests []string // "METHOD /path body"
	bytesIn  int
}

func (s *svServerRec) seen() ([]string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...), s.bytesIn
}

type countingConn struct {
	net.Conn
	s *svServerRec
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.s.mu.Lock()
	c.s.bytesIn += n
	c.s.mu.Unlock()
	return n, err
}

type countingListener struct {
	net.Listener
	s *svServerRec
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.s}, nil
}

// svRules is the table of the tests: the Star Wars deathstar's L7 policy.
var svRules = []policy.HTTPRule{{Method: "GET", Path: "/v1"}, {Method: "POST", Path: "/v1/request-landing"}, {Method: "GET", Path: "/big/.*"}}

func svTable(t *testing.T, rules []policy.HTTPRule) *l7table.Table {
	t.Helper()
	plan := &l7plan.Plan{Chains: []l7plan.Chain{{Name: "c", Port: 80, Dst: svServer, Ingress: &l7plan.Authz{
		Direction: policy.Ingress, Port: 80,
		Grants: []l7plan.Grant{{Name: "rule-1-0", RuleID: 1, Peers: l7plan.AddrSet{{Prefix: netip.PrefixFrom(svClient, 32)}}, HTTP: rules}},
	}}}}
	tab, err := l7table.Compile(plan, svClient, svServer, 80)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// svNetns makes a namespace with the client's and the server's addresses on its loopback.
func svNetns(t *testing.T) string {
	t.Helper()
	ns := testenv.NewNetns(t, "rsv-"+testenv.Suffix(8))
	h := testenv.NetlinkHandle(t, ns)
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{svClient, svServer} {
		if err := h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

// openTestSockVerdict opens the verdict pinned in pinDir and removes it at cleanup.
func openTestSockVerdict(t *testing.T, pinDir string) *Verdict {
	t.Helper()
	cg, err := Cgroup2Root()
	if err != nil {
		t.Fatal(err)
	}
	// The pins go whatever happens: a load that fails halfway leaves maps pinned.
	t.Cleanup(func() { os.RemoveAll(pinDir) })
	sv, err := Open(cg, pinDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sv.Remove(); err != nil {
			t.Errorf("removing the send-side verdict: %v", err)
		}
	})
	return sv
}

func newSVWorld(t *testing.T) *svWorld {
	t.Helper()
	return newSVWorldOn(t, "tcp4", netip.AddrPortFrom(svServer, 0).String())
}

// newSVWorldOn is newSVWorld with the server listening on network and address.
func newSVWorldOn(t *testing.T, network, address string) *svWorld {
	t.Helper()
	testenv.RequireRoot(t)
	w := &svWorld{t: t, ns: svNetns(t), srv: &svServerRec{}}
	var ln net.Listener
	if err := testenv.InNetns(w.ns, func() (err error) {
		ln, err = net.Listen(network, address)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	w.port = uint16(ln.Addr().(*net.TCPAddr).Port)
	server := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.srv.mu.Lock()
		w.srv.requests = append(w.srv.requests, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+string(body)))
		w.srv.mu.Unlock()
		switch r.URL.Path {
		case "/big/chunked":
			rw.Write(bytes.Repeat([]byte("x"), 100000)) // chunked, several sends
			return
		case "/big/length":
			// A Content-Length body in two sends, the second after a pause.
			rw.Header().Set("Content-Length", "100000")
			rw.Write(bytes.Repeat([]byte("y"), 50000))
			rw.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond)
			rw.Write(bytes.Repeat([]byte("y"), 50000))
			return
		}
		fmt.Fprintf(rw, "ok %s %s\n", r.Method, r.URL.Path)
	})}
	go server.Serve(countingListener{ln, w.srv})
	t.Cleanup(func() { server.Close() })

	w.sv = openTestSockVerdict(t, filepath.Join("/sys/fs/bpf", "rampart-test-"+testenv.Suffix(8)))
	var err error
	if w.cookie, err = NetnsCookie(w.ns); err != nil {
		t.Fatal(err)
	}
	if err := w.sv.SetSlot(1, svTable(t, svRules)); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		local, remote netip.Addr
		side          int
	}{{svClient, svServer, SideClient}, {svServer, svClient, SideServer}} {
		if err := w.sv.SetTarget(w.cookie, s.local, s.remote, w.port, s.side, 1); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// dial connects from the client's address; the verdict takes the connection.
func (w *svWorld) dial() *svConn {
	w.t.Helper()
	var c net.Conn
	if err := testenv.InNetns(w.ns, func() (err error) {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: svClient.AsSlice()}}
		c, err = d.Dial("tcp4", netip.AddrPortFrom(svServer, w.port).String())
		return err
	}); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return &svConn{t: w.t, c: c, r: bufio.NewReader(c)}
}

type svConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func (c *svConn) send(parts ...string) error {
	for _, p := range parts {
		if _, err := c.c.Write([]byte(p)); err != nil {
			return err
		}
	}
	return nil
}

// roundTrip sends a request (in parts: one write each) and reads the response.
func (c *svConn) roundTrip(parts ...string) (int, string) {
	c.t.Helper()
	if err := c.send(parts...); err != nil {
		c.t.Fatalf("sending %q: %v", parts, err)
	}
	return c.read()
}

func (c *svConn) read() (int, string) {
	c.t.Helper()
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		c.t.Errorf("reading a response: %v", err)
		return 0, ""
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		c.t.Fatalf("reading a response body: %v", err)
	}
	return resp.StatusCode, string(b)
}

func get(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: deathstar\r\n\r\n" }

func (w *svWorld) wantSeen(want ...string) {
	w.t.Helper()
	got, _ := w.srv.seen()
	if strings.Join(got, "|") != strings.Join(want, "|") {
		w.t.Fatalf("server saw %q, want %q", got, want)
	}
}

func (w *svWorld) counts() Counts {
	w.t.Helper()
	c, err := w.sv.Counts()
	if err != nil {
		w.t.Fatal(err)
	}
	return c
}

// TestSockVerdictKeepAlive: allowed and refused requests mixed on one kept-alive
// connection; the refused one is answered from the client's own socket and never reaches
// the server; bodies pass whole, heads and bodies split across writes too.
func TestSockVerdictKeepAlive(t *testing.T) {
	w := newSVWorld(t)
	c := w.dial()
	if st, body := c.roundTrip(get("/v1")); st != 200 || body != "ok GET /v1\n" {
		t.Fatalf("GET /v1: %d %q", st, body)
	}
	if st, body := c.roundTrip("PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nboom"); st != 403 || body != "RBAC: access denied" {
		t.Fatalf("PUT /v1/exhaust-port: %d %q", st, body)
	}
	// A head in three writes, and a body in two: held until the head is whole.
	if st, _ := c.roundTrip("POST /v1/request-la", "nding HTTP/1.1\r\nHo", "st: deathstar\r\nContent-Length: 9\r\n\r\nxwi", "ng-ok!"); st != 200 {
		t.Fatalf("POST in pieces: %d", st)
	}
	if st, _ := c.roundTrip(get("/v1/")); st != 403 {
		t.Fatalf("GET /v1/ (a rule is the whole path): %d", st)
	}
	if st, _ := c.roundTrip(get("/v1?query=1")); st != 200 {
		t.Fatalf("GET /v1?query=1 (the query is not part of the path): %d", st)
	}
	// A response whose Content-Length body spans sends: the tracker follows it, and
	// the next refusal is answered in order.
	if st, body := c.roundTrip(get("/big/length")); st != 200 || len(body) != 100000 {
		t.Fatalf("GET /big/length: %d, %d bytes", st, len(body))
	}
	if st, _ := c.roundTrip(get("/v2")); st != 403 {
		t.Fatalf("GET /v2 after a long response: %d", st)
	}
	// A chunked response: the tracker does not follow chunks, so it cannot tell that the
	// client has it all; a refusal after it fails the send rather than risk answering out
	// of order, and the connection is shut.
	if st, body := c.roundTrip(get("/big/chunked")); st != 200 || len(body) != 100000 {
		t.Fatalf("GET /big/chunked: %d, %d bytes", st, len(body))
	}
	if st, _ := c.roundTrip(get("/v1")); st != 200 {
		t.Fatalf("GET /v1 after a chunked response: %d", st)
	}
	if err := c.send(get("/v2")); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("GET /v2 after a chunked response: %v, want EACCES", err)
	}
	if err := c.send(get("/v1")); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("GET /v1 after the failed send: %v, want EACCES", err)
	}
	w.wantSeen("GET /v1", "POST /v1/request-landing xwing-ok!", "GET /v1", "GET /big/length", "GET /big/chunked", "GET /v1")
	got := w.counts()
	// One failed send counted: after a drop the kernel keeps the verdict for the
	// socket's later sends without running the program.
	if got != (Counts{Passed: 6, Refused: 3, SendFailed: 1}) {
		t.Fatalf("counters %+v, want 6 passed, 3 refused, 1 failed send", got)
	}
}

// TestSockVerdictSplitWrites: heads and bodies cut anywhere across writes; each request
// is decided once, on its whole head.
func TestSockVerdictSplitWrites(t *testing.T) {
	w := newSVWorld(t)
	const post = "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 9\r\n\r\nxwing-ok!"
	c := w.dial()
	for _, cuts := range [][]int{{19}, {19, 37}, {19, 76}, {19, 76, 79}, {73}, {73, 76}, {1, 2, 3, 4}} {
		var parts []string
		from := 0
		for _, at := range cuts {
			parts = append(parts, post[from:at])
			from = at
		}
		parts = append(parts, post[from:])
		if st, body := c.roundTrip(parts...); st != 200 || body != "ok POST /v1/request-landing\n" {
			t.Fatalf("cut at %v: %d %q", cuts, st, body)
		}
		if st, _ := c.roundTrip("PUT /v1/exhaust-port HTTP/1.1\r\nHost: de", "athstar\r\n\r\n"); st != 403 {
			t.Fatalf("PUT after the cut at %v: %d", cuts, st)
		}
	}
	if got := w.counts(); got.Passed != 7 || got.Refused != 7 {
		t.Fatalf("counters %+v, want 7 passed and 7 refused", got)
	}
}

// TestSockVerdictHeaders: header matches in the kernel: names in any case, exact values,
// presence, every match of a rule, and a name sent twice.
func TestSockVerdictHeaders(t *testing.T) {
	w := newSVWorld(t)
	if err := w.sv.SetSlot(1, svTable(t, []policy.HTTPRule{
		{Method: "GET", Path: "/hdr", Headers: []policy.HeaderMatch{{Name: "x-mode", Value: "landing"}}},
		{Method: "GET", Path: "/present", Headers: []policy.HeaderMatch{{Name: "x-token"}}},
		{Method: "GET", Path: "/two", Headers: []policy.HeaderMatch{{Name: "x-a", Value: "1"}, {Name: "x-b", Value: "2"}}},
	})); err != nil {
		t.Fatal(err)
	}
	req := func(path string, hdr ...string) string {
		return "GET " + path + " HTTP/1.1\r\nHost: deathstar\r\n" + strings.Join(append(hdr, ""), "\r\n") + "\r\n"
	}
	c := w.dial()
	for _, tc := range []struct {
		req  string
		want int
	}{
		{req("/hdr", "X-Mode: landing"), 200},
		{req("/hdr", "x-mode:landing "), 200},
		{req("/hdr", "X-MODE: Landing"), 403},
		{req("/hdr", "X-Mode: landing2"), 403},
		{req("/hdr"), 403},
		{req("/hdr", "X-Other: landing"), 403},
		{req("/present", "X-Token: anything"), 200},
		{req("/present", "X-Token:"), 200},
		{req("/present"), 403},
		{req("/two", "X-A: 1", "X-B: 2"), 200},
		{req("/two", "X-B: 2", "User-Agent: t", "X-A: 1"), 200},
		{req("/two", "X-A: 1"), 403},
		{req("/two", "X-A: 1", "X-B: 3"), 403},
		{req("/hdr", "X-Token: t", "X-Mode: landing"), 200},
	} {
		if st, _ := c.roundTrip(tc.req); st != tc.want {
			t.Fatalf("%q: %d, want %d", tc.req, st, tc.want)
		}
	}
	// A name sent twice: every line must have the value (as the proxy matches).
	for _, tc := range []struct {
		req  string
		want int
	}{
		{req("/hdr", "X-Mode: landing", "x-mode: landing"), 200},
		{req("/hdr", "X-Mode: landing", "X-Mode: attack"), 403},
		{req("/hdr", "X-Mode: attack", "X-Mode: landing"), 403},
		{req("/present", "X-Token: a", "X-Token: b"), 200},
	} {
		if st, _ := c.roundTrip(tc.req); st != tc.want {
			t.Fatalf("%q: %d, want %d", tc.req, st, tc.want)
		}
	}
}

// TestSockVerdictDualStackServer: a server listening on [::] gets its IPv4 connections on
// IPv6 sockets; the tracker follows them all the same, so refusals after a passed request
// are answered in order and responses are reported with their status.
func TestSockVerdictDualStackServer(t *testing.T) {
	w := newSVWorldOn(t, "tcp", ":0")
	c := w.dial()
	for _, step := range []struct {
		req  string
		want int
	}{{get("/v1"), 200}, {get("/v2"), 403}, {get("/v1"), 200}, {get("/v2"), 403}} {
		if st, _ := c.roundTrip(step.req); st != step.want {
			t.Fatalf("%q: %d, want %d", step.req, st, step.want)
		}
	}
	if got := w.counts(); got != (Counts{Passed: 2, Refused: 2}) {
		t.Fatalf("counters %+v", got)
	}
}

// TestSockVerdictEvents: each request is reported once, with its status and latency.
func TestSockVerdictEvents(t *testing.T) {
	w := newSVWorld(t)
	rd, err := w.sv.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	c := w.dial()
	c.roundTrip(get("/v1"))
	c.roundTrip("DELETE /v1 HTTP/1.1\r\nHost: deathstar\r\n\r\n")
	c.roundTrip(get("/v1"))
	c.c.Close() // the last passed request is reported when its response is seen
	var evs []Event
	rd.SetDeadline(time.Now().Add(5 * time.Second))
	for len(evs) < 3 {
		e, err := rd.Read()
		if err != nil {
			t.Fatalf("after %d events: %v", len(evs), err)
		}
		evs = append(evs, e)
	}
	want := []struct {
		method  string
		verdict Kind
		status  int
	}{{"GET", Passed, 200}, {"DELETE", Refused, 403}, {"GET", Passed, 200}}
	for i, e := range evs {
		wt := want[i]
		if e.Method != wt.method || e.Verdict != wt.verdict || e.Status != wt.status || e.Path != "/v1" ||
			e.Host != "deathstar" || e.Client.Addr() != svClient || e.Server != netip.AddrPortFrom(svServer, w.port) {
			t.Errorf("event %d: %+v, want %+v", i, e, wt)
		}
		if wt.verdict == Passed && (e.Latency <= 0 || e.Rules[l7table.Ingress] != 1) {
			t.Errorf("event %d: latency %v, rules %#x", i, e.Latency, e.Rules)
		}
	}
	rd.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if e, err := rd.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a fourth event: %+v %v", e, err)
	}
}

// TestSockVerdictOutsideSubset: request smuggling attempts, malformed and oversized heads
// and bytes that are not HTTP are answered 400 (or their send fails) and never reach the
// server, and nothing more can be sent on the connection.
func TestSockVerdictOutsideSubset(t *testing.T) {
	w := newSVWorld(t)
	const h = "GET /v1 HTTP/1.1\r\nHost: deathstar\r\n"
	for _, tc := range []struct{ name, req string }{
		{"content-length and transfer-encoding", "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{"transfer-encoding", "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{"duplicate content-length", "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx"},
		{"content-length with a space", "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 1 0\r\n\r\nx"},
		{"signed content-length", "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: +1\r\n\r\nx"},
		{"space before the colon", "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length : 1\r\n\r\nx"},
		{"duplicate host", h + "Host: other\r\n\r\n"},
		{"no host", "GET /v1 HTTP/1.1\r\n\r\n"},
		{"bare LF", "GET /v1 HTTP/1.1\nHost: deathstar\n\n"},
		{"obs-fold", h + "X-A: 1\r\n  2\r\n\r\n"},
		{"HTTP/1.0", "GET /v1 HTTP/1.0\r\nHost: deathstar\r\n\r\n"},
		{"dot segment", get("/v1/../v1")},
		{"percent", get("/v%31")},
		{"double slash", get("//v1")},
		{"absolute form", "GET http://deathstar/v1 HTTP/1.1\r\nHost: deathstar\r\n\r\n"},
		{"unknown method", "PROPFIND /v1 HTTP/1.1\r\nHost: deathstar\r\n\r\n"},
		{"lower-case method", "get /v1 HTTP/1.1\r\nHost: deathstar\r\n\r\n"},
		{"upgrade", h + "Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n"},
		{"expect", h + "Expect: 100-continue\r\n\r\n"},
		{"head larger than read", h + "X-Pad: " + strings.Repeat("a", 2100) + "\r\n\r\n"},
		{"not HTTP", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 binary"},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := w.dial()
			if err := c.send(tc.req); err == nil {
				st, _ := c.read()
				if st != 400 {
					t.Fatalf("status %d, want 400", st)
				}
			} else if !errors.Is(err, syscall.EACCES) {
				t.Fatalf("send: %v, want EACCES or a 400", err)
			}
			if err := c.send(get("/v1")); !errors.Is(err, syscall.EACCES) {
				t.Fatalf("a send after it: %v, want EACCES", err)
			}
		})
	}
	if got, n := w.srv.seen(); len(got) != 0 || n != 0 {
		t.Fatalf("the server read %d bytes, requests %q", n, got)
	}
}

// TestSockVerdictLiveChange: a rule changed while a connection is open applies to its
// next request; a slot without a table refuses everything.
func TestSockVerdictLiveChange(t *testing.T) {
	w := newSVWorld(t)
	c := w.dial()
	if st, _ := c.roundTrip(get("/v2")); st != 403 {
		t.Fatalf("GET /v2 before: %d", st)
	}
	if err := w.sv.SetSlot(1, svTable(t, []policy.HTTPRule{{Method: "GET", Path: "/v2"}})); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.roundTrip(get("/v2")); st != 200 {
		t.Fatalf("GET /v2 after: %d", st)
	}
	if st, _ := c.roundTrip(get("/v1")); st != 403 {
		t.Fatalf("GET /v1 after: %d", st)
	}
	if err := w.sv.SetSlot(1, nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.roundTrip(get("/v2")); st != 403 {
		t.Fatalf("GET /v2 with no table: %d", st)
	}
	w.wantSeen("GET /v2")
	// Old tables' entries are gone: only the slot's current one (none) remains.
	var k sockverdictSvPathKey
	var v sockverdictSvMasks
	if it := w.sv.objs.SvPaths.Iterate(); it.Next(&k, &v) {
		t.Fatalf("a path entry is left: table %d %q", k.Table, k.Path[:8])
	}
}

// TestSockVerdictPipelined: a refused request sent behind an allowed one before its
// response cannot be answered in order: its send fails, the allowed one's response
// arrives whole, and the server never sees the refused one.
func TestSockVerdictPipelined(t *testing.T) {
	w := newSVWorld(t)
	c := w.dial()
	err := c.send(get("/v1") + "DELETE /v1 HTTP/1.1\r\nHost: deathstar\r\n\r\n")
	if st, body := c.read(); st != 200 || body != "ok GET /v1\n" {
		t.Fatalf("the first response: %d %q (send: %v)", st, body, err)
	}
	if err := c.send(get("/v1")); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("a send after the failed one: %v, want EACCES", err)
	}
	w.wantSeen("GET /v1")
}

// TestSockVerdictOtherNamespace: a connection between the same addresses and port in
// another namespace is not the verdict's.
func TestSockVerdictOtherNamespace(t *testing.T) {
	w := newSVWorld(t)
	other := &svWorld{t: t, ns: svNetns(t), srv: &svServerRec{}}
	var ln net.Listener
	if err := testenv.InNetns(other.ns, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(svServer, w.port).String())
		return err
	}); err != nil {
		t.Fatalf("listening on port %d in a fresh namespace: %v", w.port, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { fmt.Fprint(rw, "other") })}
	go srv.Serve(ln)
	defer srv.Close()
	other.port = w.port
	c := other.dial()
	if st, body := c.roundTrip("DELETE /v1 HTTP/1.1\r\nHost: deathstar\r\n\r\n"); st != 200 || body != "other" {
		t.Fatalf("DELETE in the other namespace: %d %q", st, body)
	}
	if got := w.counts(); got != (Counts{}) {
		t.Fatalf("the verdict counted %+v", got)
	}
}
