package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/rampartnet/rampart/internal/testenv/root"
)

// verdictRig is an HTTP server on loopback that records what it gets, with the prototype
// verdict (msg.bpf.c: request_or_refuse) on every client connection to it.
type verdictRig struct {
	server netip.AddrPort
	mu     sync.Mutex
	seen   []string // "METHOD PATH" of each request the server got
}

func startVerdictRig(t *testing.T) *verdictRig {
	t.Helper()
	root.Require(t)
	obj := compileBPF(t, "msg", t.TempDir())
	r := &verdictRig{}
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

	coll, err := loadObject(obj, map[string]any{"server_port": uint32(r.server.Port())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coll.Close() })
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: coll.Maps["clients"].FD(), Program: coll.Programs["request_or_refuse"], Attach: ebpf.AttachSkMsgVerdict,
	}); err != nil {
		t.Fatal(err)
	}
	cg, err := cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	ops, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: coll.Programs["track"]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ops.Close() })
	return r
}

func (r *verdictRig) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// TestRefusalAtSender checks the refusal a send-side verdict would give (msg.bpf.c,
// request_or_refuse): on one kept-alive connection, allowed requests reach the server and
// a refused one is answered 403 from the client's own socket, never reaching the server.
func TestRefusalAtSender(t *testing.T) {
	r := startVerdictRig(t)
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
