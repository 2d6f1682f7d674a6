package l7

import (
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestL7 runs the request-level suite against one agent: every subtest applies its own
// policy and removes it when it ends.
func TestL7(t *testing.T) {
	e := startEnv(t)
	t.Run("matching", func(t *testing.T) {
		t.Run("method", func(t *testing.T) { testMethod(t, e) })
		t.Run("path", func(t *testing.T) { testPath(t, e) })
		t.Run("query", func(t *testing.T) { testQuery(t, e) })
		t.Run("normalisation", func(t *testing.T) { testNormalisation(t, e) })
		t.Run("host", func(t *testing.T) { testHost(t, e) })
		t.Run("headers", func(t *testing.T) { testHeaders(t, e) })
		t.Run("peers", func(t *testing.T) { testPeers(t, e) })
	})
	t.Run("keep-alive", func(t *testing.T) { testKeepAlive(t, e) })
	t.Run("h2c-multiplexed", func(t *testing.T) { testH2CMultiplexed(t, e) })
	t.Run("smuggling", func(t *testing.T) { testSmuggling(t, e) })
	t.Run("malformed", func(t *testing.T) { testMalformed(t, e) })
	t.Run("non-http", func(t *testing.T) { testNonHTTP(t, e) })
	t.Run("grpc", func(t *testing.T) { testGRPC(t, e) })
	t.Run("live-changes", func(t *testing.T) { testLiveChanges(t, e) })
	t.Run("established-direct-connection", func(t *testing.T) { testEstablishedDirect(t, e) })
	t.Run("time-wait-port-reuse", func(t *testing.T) { testTimeWaitPortReuse(t, e) })
}

// Allowed and denied requests mixed on one kept-alive HTTP/1.1 connection: every request is
// checked on its own, a 403 for a request without a body does not close the connection,
// and a denied request in a pipelined batch does not take the others with it. A refused
// request with a body gets its 403 and then the connection is closed (Envoy does not read
// a body it refused; docs/architecture.md).
func testKeepAlive(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{
		httpRule("method", "GET", "path", "/v1"),
		httpRule("method", "POST", "path", "/v1/upload"),
	}})
	type step struct {
		method, path, body string
		want               int
	}
	steps := []step{
		{"GET", "/v1", "", 200}, {"GET", "/admin", "", 403}, {"POST", "/v1/upload", "hello", 200},
		{"DELETE", "/v1", "", 403}, {"GET", "/v1", "", 200}, {"POST", "/admin", "", 403},
		{"GET", "/v1/x", "", 403}, {"HEAD", "/v1", "", 403}, {"GET", "/v1", "", 200},
	}
	reqText := func(s step, m string) string {
		var hdr []string
		if s.method == "POST" { // Content-Length: 0 for an empty body
			hdr = append(hdr, fmt.Sprintf("Content-Length: %d", len(s.body)))
		}
		r := rawReq(s.method, s.path, "server", m, hdr...)
		return r + s.body
	}
	c := e.raw(t, e.clientNS, 10*time.Second)
	var markers []string
	// One by one.
	for i, s := range steps {
		m := marker()
		markers = append(markers, m)
		if err := c.Send(reqText(s, m)); err != nil {
			t.Fatalf("request %d (%s %s): %v", i, s.method, s.path, err)
		}
		resp, body, err := c.Response(&http.Request{Method: s.method})
		if err != nil {
			t.Fatalf("request %d (%s %s): %v (the connection must stay open)", i, s.method, s.path, err)
		}
		if resp.StatusCode != s.want || resp.Close {
			t.Fatalf("request %d (%s %s): %d %q close=%v, want %d on an open connection", i, s.method, s.path, resp.StatusCode, body, resp.Close, s.want)
		}
	}
	// Pipelined: all written at once. Envoy answers in order, but it refuses to queue more
	// than two responses that are not yet written (its HTTP/1 codec's limit): when a 403,
	// answered at once, follows another answer in the same read, it closes the connection
	// ("Too many responses queued") and the rest is neither answered nor forwarded. So every
	// answer must be the right one; anything after the last answer must not have reached
	// the server, and the connection must then be closed.
	var batch strings.Builder
	first := len(markers)
	for _, s := range steps {
		m := marker()
		markers = append(markers, m)
		batch.WriteString(reqText(s, m))
	}
	if err := c.Send(batch.String()); err != nil {
		t.Fatal(err)
	}
	answered := 0
	for i, s := range steps {
		resp, body, err := c.Response(&http.Request{Method: s.method})
		if err != nil {
			if !isClosed(err) {
				t.Fatalf("pipelined request %d (%s %s): %v, want an answer or the connection closed", i, s.method, s.path, err)
			}
			break
		}
		answered++
		if resp.StatusCode != s.want {
			t.Fatalf("pipelined request %d (%s %s): %d %q, want %d", i, s.method, s.path, resp.StatusCode, body, s.want)
		}
	}
	t.Logf("pipelined: %d of %d requests answered", answered, len(steps))
	if answered == 0 {
		t.Fatal("no pipelined request answered")
	}
	for i := answered; i < len(steps); i++ {
		if m := markers[first+i]; len(e.rec.requests(m)) != 0 {
			t.Errorf("pipelined request %d was not answered, yet the server got it", i)
		}
	}
	markers = markers[:first+answered]
	if answered < len(steps) {
		c = e.raw(t, e.clientNS, 10*time.Second)
	} else {
		// Still open.
		if err := c.Send(rawReq("GET", "/v1", "server", "")); err != nil {
			t.Fatal(err)
		}
		if resp, _, err := c.Response(nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("after the batch: %v %v, want 200 on the same connection", resp, err)
		}
	}
	// A refused request with a body: 403, then the connection is closed, and neither the
	// request nor its body reach the server.
	m := marker()
	if err := c.Send(rawReq("POST", "/admin", "server", m, "Content-Length: 5") + "hello"); err != nil {
		t.Fatal(err)
	}
	if resp, _, err := c.Response(nil); err != nil || resp.StatusCode != 403 || !resp.Close {
		t.Fatalf("POST /admin with a body: %v %v, want 403 with Connection: close", resp, err)
	}
	if !connClosed(c, 5*time.Second) {
		t.Error("the connection stays open after a refused request with a body")
	}
	if len(e.rec.requests(m)) != 0 || e.rec.rawContains(m) {
		t.Error("the refused POST reached the server")
	}
	for i, m := range markers {
		s := steps[i%len(steps)]
		got := e.rec.requests(m)
		switch {
		case s.want == 200 && (len(got) != 1 || got[0].Body != s.body):
			t.Errorf("request %d (%s %s): the server got %+v, want it once with body %q", i, s.method, s.path, got, s.body)
		case s.want != 200 && (len(got) != 0 || e.rec.rawContains(m)):
			t.Errorf("request %d (%s %s) was refused but reached the server", i, s.method, s.path)
		}
	}
}

// Allowed and denied requests multiplexed on one h2c connection, concurrently: each stream
// is checked on its own.
func testH2CMultiplexed(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/v1")}})
	cl := e.httpClient(t, e.clientNS, 10*time.Second, true, true)
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[string]bool{}
	errs := make(chan error, 40)
	for i := range 40 {
		path := "/v1"
		want := 200
		if i%2 == 1 {
			path, want = "/admin", 403
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := marker()
			req, _ := http.NewRequest("GET", "http://"+e.httpAddr.String()+path, nil)
			req.Header.Set("X-Req", m)
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
				GotConn: func(i httptrace.GotConnInfo) {
					mu.Lock()
					conns[i.Conn.LocalAddr().String()] = true
					mu.Unlock()
				},
			}))
			resp, err := cl.Do(req)
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
			if resp.StatusCode != want || resp.ProtoMajor != 2 {
				errs <- fmt.Errorf("%s: %s %s, want %d over HTTP/2", path, resp.Proto, resp.Status, want)
			}
			got := len(e.rec.requests(m))
			if (want == 200) != (got == 1) || got > 1 {
				errs <- fmt.Errorf("%s answered %d: the server got it %d times", path, resp.StatusCode, got)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(conns) != 1 {
		t.Errorf("the requests used %d connections, want one: %v", len(conns), conns)
	}
}
