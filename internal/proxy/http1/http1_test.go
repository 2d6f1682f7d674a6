package http1

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestReadRequestHeadSubset(t *testing.T) {
	simple := []struct {
		name, in           string
		method, path, host string
		length             int64
		close              bool
	}{
		{"get", "GET /v1 HTTP/1.1\r\nHost: server\r\n\r\n", "GET", "/v1", "server", 0, false},
		{"query", "GET /v1?a=b%20c HTTP/1.1\r\nHost: server\r\nX-Req: 1\r\n\r\n", "GET", "/v1", "server", 0, false},
		{"body", "POST /v1/upload HTTP/1.1\r\nhost:server:80\r\nContent-Length: 5\r\n\r\nhello", "POST", "/v1/upload", "server:80", 5, false},
		{"close", "DELETE / HTTP/1.1\r\nHost: s\r\nConnection: Close\r\n\r\n", "DELETE", "/", "s", 0, true},
		{"value space", "PUT /x HTTP/1.1\r\nHost: s\r\nX-A:  a b\t\r\n\r\n", "PUT", "/x", "s", 0, false},
	}
	for _, c := range simple {
		t.Run(c.name, func(t *testing.T) {
			r := bufio.NewReaderSize(strings.NewReader(c.in), 64)
			h, raw, err := ReadRequestHead(r, nil)
			if err != nil {
				t.Fatalf("%q: %v", c.in, err)
			}
			if h.Method != c.method || h.Path != c.path || h.Host != c.host || h.ContentLength != c.length || h.Close != c.close {
				t.Errorf("%q: got %+v", c.in, h)
			}
			// The head is exactly the bytes up to the body.
			rest, _ := io.ReadAll(r)
			if string(raw)+string(rest) != c.in || !strings.HasSuffix(string(raw), "\r\n\r\n") {
				t.Errorf("%q: head %q then %q", c.in, raw, rest)
			}
		})
	}
	notSimple := map[string]string{
		"lower-case method":     "get / HTTP/1.1\r\nHost: s\r\n\r\n",
		"unknown method":        "GETX / HTTP/1.1\r\nHost: s\r\n\r\n",
		"HTTP/1.0":              "GET / HTTP/1.0\r\nHost: s\r\n\r\n",
		"h2 preface":            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"absolute target":       "GET http://s/ HTTP/1.1\r\nHost: s\r\n\r\n",
		"dot-dot":               "GET /v1/../admin HTTP/1.1\r\nHost: s\r\n\r\n",
		"dot":                   "GET /v1/./x HTTP/1.1\r\nHost: s\r\n\r\n",
		"trailing dot-dot":      "GET /v1/.. HTTP/1.1\r\nHost: s\r\n\r\n",
		"double slash":          "GET /v1//x HTTP/1.1\r\nHost: s\r\n\r\n",
		"percent in path":       "GET /v1%2fx HTTP/1.1\r\nHost: s\r\n\r\n",
		"backslash":             "GET /v1\\x HTTP/1.1\r\nHost: s\r\n\r\n",
		"fragment":              "GET /v1#x HTTP/1.1\r\nHost: s\r\n\r\n",
		"obs-fold":              "GET / HTTP/1.1\r\nHost: s\r\nX-A: a\r\n b\r\n\r\n",
		"bare LF":               "GET / HTTP/1.1\nHost: s\n\n",
		"bare LF in header":     "GET / HTTP/1.1\r\nHost: s\nX: y\r\n\r\n",
		"chunked":               "POST / HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"duplicate header":      "GET / HTTP/1.1\r\nHost: s\r\nX-A: 1\r\nx-a: 2\r\n\r\n",
		"duplicate host":        "GET / HTTP/1.1\r\nHost: s\r\nHost: t\r\n\r\n",
		"length plus":           "POST / HTTP/1.1\r\nHost: s\r\nContent-Length: +5\r\n\r\nhello",
		"length list":           "POST / HTTP/1.1\r\nHost: s\r\nContent-Length: 5, 5\r\n\r\nhello",
		"length too long":       "POST / HTTP/1.1\r\nHost: s\r\nContent-Length: 9999999999999999999\r\n\r\n",
		"space before colon":    "GET / HTTP/1.1\r\nHost: s\r\nX-A : 1\r\n\r\n",
		"underscore":            "GET / HTTP/1.1\r\nHost: s\r\nTransfer_Encoding: chunked\r\n\r\n",
		"no host":               "GET / HTTP/1.1\r\nX-A: 1\r\n\r\n",
		"upgrade":               "GET / HTTP/1.1\r\nHost: s\r\nUpgrade: h2c\r\n\r\n",
		"connection upgrade":    "GET / HTTP/1.1\r\nHost: s\r\nConnection: Upgrade\r\n\r\n",
		"expect":                "POST / HTTP/1.1\r\nHost: s\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
		"x-forwarded-for":       "GET / HTTP/1.1\r\nHost: s\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n",
		"non-ASCII value":       "GET / HTTP/1.1\r\nHost: s\r\nX-A: \xff\r\n\r\n",
		"control in value":      "GET / HTTP/1.1\r\nHost: s\r\nX-A: a\x00b\r\n\r\n",
		"TLS hello":             "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
		"binary":                "\x00\x01\x02GET",
		"head too large":        "GET / HTTP/1.1\r\nHost: s\r\nX-A: " + strings.Repeat("a", maxFastHead) + "\r\n\r\n",
		"too many headers":      "GET / HTTP/1.1\r\nHost: s\r\n" + manyHeaders(maxFastHeaders+1) + "\r\n",
		"eof in head":           "GET / HTTP/1.1\r\nHost: s\r\n",
		"space in target":       "GET /a b HTTP/1.1\r\nHost: s\r\n\r\n",
		"extra space":           "GET  / HTTP/1.1\r\nHost: s\r\n\r\n",
		"transfer-encoding too": "POST / HTTP/1.1\r\nHost: s\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
	}
	for name, in := range notSimple {
		t.Run(name, func(t *testing.T) {
			r := bufio.NewReaderSize(strings.NewReader(in), 64)
			_, raw, err := ReadRequestHead(r, nil)
			if !errors.Is(err, ErrNotSimple) {
				t.Fatalf("%q: err %v, want ErrNotSimple", in, err)
			}
			// Nothing is lost: what was read and what is left make the input, so Envoy gets
			// the connection's bytes exactly.
			rest, _ := io.ReadAll(r)
			if string(raw)+string(rest) != in {
				t.Errorf("%q: read %q, left %q", in, raw, rest)
			}
		})
	}
}

func manyHeaders(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "X-H%d: 1\r\n", i)
	}
	return b.String()
}
