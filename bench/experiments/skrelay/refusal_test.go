package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// verdictRig is an HTTP server on loopback that records what it gets, with an sk_msg
// program of msg.bpf.c on every client connection to it.
type verdictRig struct {
	server netip.AddrPort
	coll   *ebpf.Collection
	mu     sync.Mutex
	seen   []string // "METHOD PATH" of each request the server got
}

func startVerdictRig(t *testing.T, program string) *verdictRig {
	t.Helper()
	r := &verdictRig{}
	r.start(t, compileBPF(t, "msg", t.TempDir()), "clients", program, "track")
	return r
}

// start starts the server and loads obj with its port, with sk_msg program on sockhash m
// and sockops program track (which fills it) on the cgroup v2 root.
func (r *verdictRig) start(t *testing.T, obj, m, program, track string) {
	t.Helper()
	testenv.RequireRoot(t)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.seen = append(r.seen, req.Method+" "+req.URL.Path)
		r.mu.Unlock()
		io.WriteString(w, "hello from the server")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	r.server = netip.MustParseAddrPort(l.Addr().String())

	consts, err := verdictConsts(r.server.Port())
	if err != nil {
		t.Fatal(err)
	}
	coll, err := loadObject(obj, consts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coll.Close() })
	r.coll = coll
	attachMsg(t, coll, m, program, track)
}

// attachMsg attaches sk_msg program to sockhash m of coll, and sockops program track (which
// fills m) to the cgroup v2 root until the test ends.
func attachMsg(t *testing.T, coll *ebpf.Collection, m, program, track string) {
	t.Helper()
	attachMsgTo(t, coll, m, program)
	cg, err := cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	ops, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: coll.Programs[track]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ops.Close() })
}

// attachMsgTo attaches sk_msg program to sockhash m of coll (for as long as m lives).
func attachMsgTo(t *testing.T, coll *ebpf.Collection, m, program string) {
	t.Helper()
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: coll.Maps[m].FD(), Program: coll.Programs[program], Attach: ebpf.AttachSkMsgVerdict,
	}); err != nil {
		t.Fatal(err)
	}
}

func (r *verdictRig) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// dial opens a connection to the server (closed when the test ends), with a 5 s deadline.
func (r *verdictRig) dial(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp4", r.server.String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c, bufio.NewReader(c)
}

// counts returns the allowed and other verdicts the counting programs gave.
func (r *verdictRig) counts(t *testing.T) (allowed, other uint64) {
	t.Helper()
	var a, o []uint64
	if err := r.coll.Maps["counts"].Lookup(uint32(0), &a); err != nil {
		t.Fatal(err)
	}
	if err := r.coll.Maps["counts"].Lookup(uint32(1), &o); err != nil {
		t.Fatal(err)
	}
	return sum(a), sum(o)
}

// TestParsedVerdictWaitsForWholeHeads sends request heads in pieces (one write each) to
// the parsing verdict (msg.bpf.c, request_parsed): it must hold the pieces until the head
// is whole (cork) and give one verdict per request.
func TestParsedVerdictWaitsForWholeHeads(t *testing.T) {
	r := startVerdictRig(t, "request_parsed")
	c, br := r.dial(t)
	for _, pieces := range [][]string{
		{"GET /v1 HTTP/1.1\r\nHost: server\r\n\r\n"},
		{"GET /v", "1 HTTP/1.1\r\nHo", "st: server\r\n", "\r\n"},
		{"GET /admin HTTP/1.1\r\nHost: server\r\n\r", "\n"},
	} {
		for _, p := range pieces {
			if _, err := io.WriteString(c, p); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%q: %v", pieces, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// This program only counts: every request reaches the server.
	if got, want := r.requests(), []string{"GET /v1", "GET /v1", "GET /admin"}; !slices.Equal(got, want) {
		t.Errorf("the server saw %q, want %q", got, want)
	}
	if allowed, other := r.counts(t); allowed != 2 || other != 1 {
		t.Errorf("verdicts: %d allowed, %d other; want 2 and 1 (one per request)", allowed, other)
	}
}

// TestRefusalAtSender checks the refusal a send-side verdict would give (msg.bpf.c,
// request_or_refuse): on one kept-alive connection, allowed requests reach the server and
// a refused one is answered 403 from the client's own socket, never reaching the server.
func TestRefusalAtSender(t *testing.T) {
	r := startVerdictRig(t, "request_or_refuse")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	steps := []struct {
		method, path string
		status       int
		body         string
	}{
		{"GET", "/v1", 200, "hello from the server"},
		{"GET", "/admin", 403, "Access denied\r\n"},
		{"DELETE", "/v1", 403, "Access denied\r\n"},
		{"GET", "/v1", 200, "hello from the server"},
	}
	for i, s := range steps {
		reused := false
		req, _ := http.NewRequest(s.method, "http://"+r.server.String()+s.path, nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(c httptrace.GotConnInfo) { reused = c.Reused },
		}))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", s.method, s.path, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != s.status || string(body) != s.body {
			t.Errorf("%s %s: %d %q %v, want %d %q", s.method, s.path, resp.StatusCode, body, err, s.status, s.body)
		}
		if i > 0 && !reused {
			t.Errorf("%s %s: on a new connection, want the kept-alive one", s.method, s.path)
		}
	}
	if got, want := r.requests(), []string{"GET /v1", "GET /v1"}; !slices.Equal(got, want) {
		t.Errorf("the server saw %q, want %q", got, want)
	}
}

// TestVerdictStaysInItsNamespace: the sockops program sits on the cgroup root and sees
// every namespace's sockets, so it must take only connections in the server's namespace.
// A client in another namespace, calling a server there on the same port number, is not
// checked: its refused-looking request reaches its own server.
func TestVerdictStaysInItsNamespace(t *testing.T) {
	r := startVerdictRig(t, "request_or_refuse")
	node := agenttest.NewBareNode(t)
	other := node.Add("other", netip.MustParseAddr("198.18.0.20"))
	srv, err := testenv.ServeHTTP(other.NetnsPath, r.server.Port(), testenv.EchoHTTP())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	client := testenv.HTTPClient(other.NetnsPath, 3*time.Second)
	defer client.CloseIdleConnections()
	req, _ := http.NewRequest("DELETE", fmt.Sprintf("http://127.0.0.1:%d/v1", r.server.Port()), nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "DELETE /v1 from ") {
		t.Errorf("DELETE in the other namespace: %d %q, want 200 from its own server", resp.StatusCode, body)
	}
	if got := r.requests(); len(got) != 0 {
		t.Errorf("the rig's server saw %q", got)
	}
}
