package l7

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/proxy"
)

// smugglingRules allow a front request (POST /v1/upload) and GET /v1; the smuggled request
// (GET /admin) is refused by them.
var smugglingRules = []map[string]any{
	httpRule("method", "POST", "path", "/v1/upload"),
	httpRule("method", "GET", "path", "/v1"),
}

// smuggled is the request an attacker hides behind the front one.
func smuggled(s string) string { return rawReq("GET", "/admin", "server", s) }

// front is the allowed request's head with extra header lines (the framing under test),
// ending with the empty line.
func front(m string, hdr ...string) string { return rawReq("POST", "/v1/upload", "server", m, hdr...) }

type smuggleCase struct {
	name string
	data func(m, s string) string // m marks the front request, s the smuggled one
	// status of the first response; closed: the proxy closes the connection after it
	status int
	closed bool
	// next: the status of a second response on the connection (0: none is read)
	next int
	// forwarded: the front request reaches the server; maybe: it may (the proxy streams
	// the head before it finds the body broken)
	forwarded, maybe bool
	// inBody: the smuggled text is the front request's body, properly framed: the server
	// gets it as a body, never as a request
	inBody bool
}

func testSmuggling(t *testing.T, e *env) {
	e.policy(t, l7Rule{role: "client", port: httpPort, http: smugglingRules})
	cases := []smuggleCase{
		// Content-Length and Transfer-Encoding together: refused, whatever the order.
		{name: "cl-te", status: 400, closed: true, data: func(m, s string) string {
			body := "0\r\n\r\n" + smuggled(s)
			return front(m, fmt.Sprintf("Content-Length: %d", len(body)), "Transfer-Encoding: chunked") + body
		}},
		{name: "te-cl", status: 400, closed: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding: chunked", "Content-Length: 4") + "5c\r\n" + smuggled(s) + "\r\n0\r\n\r\n"
		}},
		{name: "te-cl-underscore-te", status: 200, next: 403, forwarded: true, data: func(m, s string) string {
			// Transfer_Encoding is not Transfer-Encoding: Content-Length frames the body,
			// and what follows is a request of its own, checked as such.
			return front(m, "Transfer_Encoding: chunked", "Content-Length: 5") + "hello" + smuggled(s)
		}},
		// Duplicate or malformed Content-Length.
		{name: "duplicate-cl", status: 400, closed: true, data: func(m, s string) string {
			return front(m, "Content-Length: 5", fmt.Sprintf("Content-Length: %d", 5+len(smuggled(s)))) + "hello" + smuggled(s)
		}},
		{name: "duplicate-cl-same", status: 400, closed: true, data: func(m, s string) string {
			return front(m, "Content-Length: 5", "Content-Length: 5") + "hello" + smuggled(s)
		}},
		{name: "cl-list", status: 400, closed: true, data: func(m, s string) string {
			return front(m, fmt.Sprintf("Content-Length: 5, %d", 5+len(smuggled(s)))) + "hello" + smuggled(s)
		}},
		{name: "cl-plus", status: 400, closed: true, data: func(m, s string) string {
			return front(m, "Content-Length: +5") + "hello" + smuggled(s)
		}},
		{name: "cl-negative", status: 400, closed: true, data: func(m, s string) string {
			return front(m, "Content-Length: -1") + "hello" + smuggled(s)
		}},
		{name: "cl-overflow", status: 400, closed: true, data: func(m, s string) string {
			return front(m, "Content-Length: 99999999999999999999999") + "hello" + smuggled(s)
		}},
		// Obfuscated Transfer-Encoding.
		{name: "te-chunked-identity", status: 501, closed: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding: chunked, identity") + "0\r\n\r\n" + smuggled(s)
		}},
		{name: "te-twice", status: 501, closed: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding: chunked", "Transfer-Encoding: identity") + "0\r\n\r\n" + smuggled(s)
		}},
		{name: "te-xchunked", status: 501, closed: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding: xchunked") + "0\r\n\r\n" + smuggled(s)
		}},
		{name: "te-identity-cl", status: 400, closed: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding: identity", "Content-Length: 5") + "hello" + smuggled(s)
		}},
		{name: "te-space-before-colon", status: 400, closed: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding : chunked") + "0\r\n\r\n" + smuggled(s)
		}},
		// White space around the value, and letter case, do not change what it means: the
		// body is chunked for the proxy and the server alike, and what follows the last
		// chunk is a request of its own, checked as such.
		{name: "te-leading-space", status: 200, next: 403, forwarded: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding:    chunked") + "0\r\n\r\n" + smuggled(s)
		}},
		{name: "te-tab", status: 200, next: 403, forwarded: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding:\tchunked") + "0\r\n\r\n" + smuggled(s)
		}},
		{name: "te-upper-case", status: 200, next: 403, forwarded: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding: CHUNKED") + "0\r\n\r\n" + smuggled(s)
		}},
		// A folded line (obs-fold) is part of the previous header's value, for the proxy
		// and for the server (which gets it unfolded): the front request has no body, and
		// the chunk that follows is garbage: 400, closed.
		{name: "te-obs-fold", status: 200, next: 400, forwarded: true, data: func(m, s string) string {
			return front(m, "X-Foo: bar", " Transfer-Encoding: chunked") + "0\r\n\r\n" + smuggled(s)
		}},
		// Broken chunked bodies: refused; the head may already be on its way.
		{name: "chunk-size-hex-prefix", status: 400, closed: true, maybe: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding: chunked") + "0x5\r\nhello\r\n0\r\n\r\n" + smuggled(s)
		}},
		{name: "chunk-size-overflow", status: 400, closed: true, maybe: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding: chunked") + "fffffffffffffffff1\r\nhello\r\n0\r\n\r\n" + smuggled(s)
		}},
		{name: "chunk-bare-lf", status: 400, closed: true, maybe: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding: chunked") + "5\nhello\n0\n\n" + smuggled(s)
		}},
		// A request inside a properly framed body is a body.
		{name: "request-in-cl-body", status: 200, next: 200, forwarded: true, inBody: true, data: func(m, s string) string {
			return front(m, fmt.Sprintf("Content-Length: %d", len(smuggled(s)))) + smuggled(s) + rawReq("GET", "/v1", "server", "")
		}},
		{name: "request-in-chunked-body", status: 200, next: 200, forwarded: true, inBody: true, data: func(m, s string) string {
			return front(m, "Transfer-Encoding: chunked") + fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(smuggled(s)), smuggled(s)) + rawReq("GET", "/v1", "server", "")
		}},
		// A body shorter than what follows: the rest is the next request, checked.
		{name: "request-after-cl-body", status: 200, next: 403, forwarded: true, data: func(m, s string) string {
			return front(m, "Content-Length: 5") + "hello" + smuggled(s)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // independent connections; most wait for the proxy's delayed close
			e.sub(t)
			m, s := marker(), marker()
			conn := e.raw(t, e.clientNS, 10*time.Second)
			// The proxy may answer and close before it read everything: a write error is
			// then expected; the response is still there to read.
			conn.Send(c.data(m, s))
			resp, body, err := conn.Response(nil)
			if err != nil {
				t.Fatalf("no response: %v", err)
			}
			if resp.StatusCode != c.status {
				t.Errorf("status %d %q, want %d", resp.StatusCode, body, c.status)
			}
			if c.next != 0 {
				resp2, body2, err := conn.Response(nil)
				if err != nil || resp2.StatusCode != c.next {
					t.Errorf("second response: %v %q %v, want %d", resp2, body2, err, c.next)
				}
			}
			if c.closed && !connClosed(conn, 5*time.Second) {
				t.Errorf("the connection stays open after %d", c.status)
			}
			// The smuggled request never reaches the server as a request; nor do its bytes
			// unless they were a body.
			if got := e.rec.requests(s); len(got) != 0 {
				t.Errorf("the server got the smuggled request: %+v", got)
			}
			if !c.inBody && e.rec.rawContains(s) {
				t.Errorf("the smuggled request's bytes reached the server")
			}
			got := e.rec.requests(m)
			switch {
			case c.forwarded && len(got) != 1:
				t.Errorf("the server got the front request %d times, want once", len(got))
			case !c.forwarded && !c.maybe && (len(got) != 0 || e.rec.rawContains(m)):
				t.Errorf("the server got the refused front request: %+v", got)
			case c.maybe && len(got) > 1:
				t.Errorf("the server got the front request %d times", len(got))
			}
			if c.inBody && len(got) == 1 && got[0].Body != smuggled(s) {
				t.Errorf("the server got body %q, want the smuggled text", got[0].Body)
			}
		})
	}
}

// Malformed and oversized requests are refused (and their connection closed); a few
// harmless irregularities are tolerated, and the server then gets a well-formed request.
func testMalformed(t *testing.T, e *env) {
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("path", "/v1")}})
	big := strings.Repeat("a", 70<<10)
	cases := []struct {
		name   string
		data   func(m string) string
		status int // 0: tolerated (200, forwarded)
	}{
		{"extra-token", func(m string) string { return "GET /v1 HTTP/1.1 x\r\nHost: s\r\nX-Req: " + m + "\r\n\r\n" }, 400},
		{"no-version", func(m string) string { return "GET /v1?" + m + "\r\n\r\n" }, 426},
		{"http10", func(m string) string { return "GET /v1?" + m + " HTTP/1.0\r\nHost: s\r\n\r\n" }, 426},
		{"http99", func(m string) string { return "GET /v1?" + m + " HTTP/9.9\r\nHost: s\r\n\r\n" }, 426},
		{"no-host", func(m string) string { return rawReq("GET", "/v1", "-", m) }, 400},
		{"header-without-colon", func(m string) string { return rawReq("GET", "/v1", "s", m, "NoColon") }, 400},
		{"space-in-header-name", func(m string) string { return rawReq("GET", "/v1", "s", m, "X Bad: 1") }, 400},
		{"nul-in-header-value", func(m string) string { return rawReq("GET", "/v1", "s", m, "X-Bad: a\x00b") }, 400},
		{"asterisk-target", func(m string) string { return rawReq("GET", "*", "s", m) }, 400},
		{"relative-target", func(m string) string { return rawReq("GET", "v1", "s", m) }, 400},
		{"fragment", func(m string) string { return rawReq("GET", "/v1#f", "s", m) }, 400},
		{"long-uri", func(m string) string { return rawReq("GET", "/v1?"+m+big, "s", "") }, 431},
		{"long-header", func(m string) string { return rawReq("GET", "/v1", "s", m, "X-Big: "+big) }, 431},
		{"many-headers", func(m string) string {
			return rawReq("GET", "/v1", "s", m, strings.Split(strings.Repeat("X-H: a\n", 150), "\n")[:150]...)
		}, 431},
		// Tolerated: the proxy parses these unambiguously and sends the server a request
		// of its own making.
		{"double-space", func(m string) string { return "GET  /v1 HTTP/1.1\r\nHost: s\r\nX-Req: " + m + "\r\n\r\n" }, 0},
		{"bare-lf", func(m string) string { return "GET /v1 HTTP/1.1\nHost: s\nX-Req: " + m + "\n\n" }, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // independent connections; most wait for the proxy's delayed close
			e.sub(t)
			m := marker()
			conn := e.raw(t, e.clientNS, 10*time.Second)
			conn.Send(c.data(m))
			resp, body, err := conn.Response(nil)
			if err != nil {
				t.Fatalf("no response: %v", err)
			}
			got := e.rec.requests(m)
			if c.status == 0 {
				if resp.StatusCode != 200 || len(got) != 1 || got[0].URI != "/v1" || got[0].Proto != "HTTP/1.1" {
					t.Errorf("%d %q; the server got %+v; want 200 and a well-formed GET /v1", resp.StatusCode, body, got)
				}
				return
			}
			if resp.StatusCode != c.status {
				t.Errorf("status %d %q, want %d", resp.StatusCode, body, c.status)
			}
			if !connClosed(conn, 5*time.Second) {
				t.Errorf("the connection stays open after %d", resp.StatusCode)
			}
			if len(got) != 0 || e.rec.rawContains(m) {
				t.Errorf("the refused request reached the server: %+v", got)
			}
		})
	}
}

// Bytes that are not HTTP on an L7 port: the proxy closes the connection and nothing
// reaches the server (no connection, no byte).
func testNonHTTP(t *testing.T, e *env) {
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("path", "/v1")}})
	rnd := make([]byte, 4096)
	r := rand.New(rand.NewPCG(7, 7))
	for i := range rnd {
		rnd[i] = byte(r.Uint32())
	}
	if !bytes.ContainsRune(rnd, '\n') {
		t.Fatal("the random bytes hold no line end: pick another seed")
	}
	h2junk := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 4, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	h2junk = append(h2junk, "not a frame"...)
	cases := []struct {
		name string
		data []byte
		// reply: what the proxy may send before closing ("" = nothing); "goaway": an
		// HTTP/2 GOAWAY frame
		reply string
		// wait: how long the proxy may take to close
		wait time.Duration
	}{
		{"tls-client-hello", clientHello(t), "HTTP/1.1 400 ", 5 * time.Second},
		{"ssh-banner", []byte("SSH-2.0-OpenSSH_9.6p1 Debian-4\r\n"), "HTTP/1.1 400 ", 5 * time.Second},
		{"random-binary", rnd, "HTTP/1.1 400 ", 5 * time.Second},
		// No line end at all: the proxy waits for the rest of the request line, up to its
		// request header timeout.
		{"binary-without-line-end", []byte("\x8f\x01\x02\xff\xfe\x00\x10abc"), "HTTP/1.1 408 ", proxy.RequestHeadersTimeout + 5*time.Second},
		{"http2-preface-then-garbage", h2junk, "goaway", 5 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // independent connections; most wait for the proxy's delayed close
			e.sub(t)
			conns, bytesIn := e.rec.connCount(), e.rec.rawLen()
			conn, err := e.dial(e.clientNS, e.httpAddr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			conn.Write(c.data)
			conn.SetReadDeadline(time.Now().Add(c.wait))
			got, err := io.ReadAll(conn)
			if err != nil && !isClosed(err) {
				t.Fatalf("the connection is still open after %v (read %q): %v", time.Since(start).Round(time.Millisecond), trim(got), err)
			}
			switch {
			case c.reply == "goaway":
				if !hasGoAway(got) {
					t.Errorf("reply %q, want an HTTP/2 GOAWAY frame", trim(got))
				}
			case !bytes.HasPrefix(got, []byte(c.reply)):
				t.Errorf("reply %q, want %q", trim(got), c.reply)
			}
			if e.rec.connCount() != conns || e.rec.rawLen() != bytesIn {
				t.Errorf("the server got a connection or bytes: %d -> %d connections, %d -> %d bytes", conns, e.rec.connCount(), bytesIn, e.rec.rawLen())
			}
		})
	}
}

func trim(b []byte) string {
	if len(b) > 120 {
		b = b[:120]
	}
	return string(b)
}

// hasGoAway reports whether b, the server side of an HTTP/2 connection, holds a GOAWAY
// frame.
func hasGoAway(b []byte) bool {
	for len(b) >= 9 {
		n := int(binary.BigEndian.Uint32(append([]byte{0}, b[:3]...)))
		if b[3] == 0x7 {
			return true
		}
		if len(b) < 9+n {
			return false
		}
		b = b[9+n:]
	}
	return false
}

// clientHello returns the first flight of a real TLS client.
func clientHello(t *testing.T) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, &tls.Config{ServerName: "server.example", InsecureSkipVerify: true}).Handshake()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16<<10)
	n, err := b.Read(buf)
	if err != nil || n < 5 || buf[0] != 0x16 {
		t.Fatalf("no TLS ClientHello: %d bytes, %v", n, err)
	}
	return buf[:n]
}
