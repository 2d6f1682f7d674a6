package http1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// FuzzReadRequestHead checks the fast path's request reader against the subset it
// promises (http1.go) on any input. Seeds (testdata/fuzz/FuzzReadRequestHead) are real
// requests and the request smuggling shapes: Content-Length with Transfer-Encoding, two
// lengths, obs-fold, bare LF, odd white space.
//
//   - The bytes it consumed are exactly the start of the input, and what it did not consume
//     is still in the reader: the fast path hands the connection to Envoy with both, so a
//     byte lost or added would make the two read different requests.
//   - Reading through a 16-byte and a 4 KiB buffer gives the same answer.
//   - An accepted head: ends at the first CRLF CRLF; every line ends in CRLF, none is
//     folded; an upper-case fast-path method, an origin-form normalised target and
//     HTTP/1.1; header names unique and made of letters, digits and '-'; Host present;
//     no Transfer-Encoding, TE, Upgrade, Expect or HTTP2-Settings; at most one
//     Content-Length, all digits, equal to the length it reports. Its framing is then
//     unambiguous, and net/http reads the same method, target, host and length from it,
//     with no transfer coding.
func FuzzReadRequestHead(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		h, raw, err := ReadRequestHead(bufio.NewReaderSize(bytes.NewReader(data), 16), nil)
		if !bytes.HasPrefix(data, raw) {
			t.Fatalf("consumed %q, not the start of the input", raw)
		}
		r := bufio.NewReaderSize(bytes.NewReader(data), 4096)
		h2, raw2, err2 := ReadRequestHead(r, nil)
		rest, _ := io.ReadAll(r)
		if !bytes.Equal(append(bytes.Clone(raw2), rest...), data) {
			t.Fatalf("consumed %q and left %q of %q", raw2, rest, data)
		}
		if !errors.Is(err2, err) && !(err == nil && err2 == nil) {
			t.Fatalf("16-byte buffer: %v, 4 KiB buffer: %v", err, err2)
		}
		switch {
		case errors.Is(err, ErrNotSimple):
			return
		case err != nil:
			if len(data) != 0 {
				t.Fatalf("error %v on %d bytes of input", err, len(data))
			}
			return
		}
		if !bytes.Equal(raw, raw2) || h.Method != h2.Method || h.Target != h2.Target || h.ContentLength != h2.ContentLength {
			t.Fatalf("buffers read different heads: %q and %q", raw, raw2)
		}
		checkSubset(t, h, raw)
	})
}

// checkSubset checks an accepted head against the rules of http1.go, and against net/http.
func checkSubset(t *testing.T, h RequestHead, raw []byte) {
	t.Helper()
	if !bytes.Equal(h.Raw, raw) || len(raw) > maxFastHead {
		t.Fatalf("head of %d bytes, raw %q", len(raw), h.Raw)
	}
	if i := bytes.Index(raw, []byte("\r\n\r\n")); i != len(raw)-4 {
		t.Fatalf("the head does not end at its first empty line: %q", raw)
	}
	lines := strings.Split(string(raw[:len(raw)-4]), "\r\n")
	for _, l := range lines {
		if strings.ContainsAny(l, "\r\n") {
			t.Fatalf("bare CR or LF in line %q", l)
		}
	}
	method, rest, _ := strings.Cut(lines[0], " ")
	target, version, _ := strings.Cut(rest, " ")
	if !fastMethods[method] || method != h.Method || target != h.Target || version != "HTTP/1.1" {
		t.Fatalf("request line %q read as %s %s", lines[0], h.Method, h.Target)
	}
	path, _, _ := strings.Cut(target, "?")
	if path != h.Path || !strings.HasPrefix(path, "/") || strings.Contains(path, "//") || strings.Contains(path, "%") ||
		strings.ContainsFunc(target, func(c rune) bool { return c <= 0x20 || c >= 0x7f || c == '#' || c == '\\' }) {
		t.Fatalf("target %q (path %q) is not normalised origin form", target, h.Path)
	}
	for _, seg := range strings.Split(path, "/") {
		if seg == "." || seg == ".." {
			t.Fatalf("dot segment in %q", path)
		}
	}
	seen := map[string]string{}
	for _, l := range lines[1:] {
		if l == "" || l[0] == ' ' || l[0] == '\t' {
			t.Fatalf("empty or folded header line %q", l)
		}
		name, value, ok := strings.Cut(l, ":")
		if !ok || name == "" || strings.TrimLeft(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			t.Fatalf("header name in %q", l)
		}
		name = strings.ToLower(name)
		if _, dup := seen[name]; dup {
			t.Fatalf("header %s twice", name)
		}
		seen[name] = strings.Trim(value, " \t")
	}
	for _, banned := range []string{"transfer-encoding", "te", "upgrade", "expect", "http2-settings"} {
		if _, ok := seen[banned]; ok {
			t.Fatalf("accepted a request with %s", banned)
		}
	}
	if seen["host"] == "" || seen["host"] != h.Host {
		t.Fatalf("host %q, read %q", seen["host"], h.Host)
	}
	want := int64(0)
	if cl, ok := seen["content-length"]; ok {
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || strings.Trim(cl, "0123456789") != "" {
			t.Fatalf("Content-Length %q", cl)
		}
		want = n
	}
	if h.ContentLength != want {
		t.Fatalf("length %d, want %d", h.ContentLength, want)
	}
	// net/http, a strict reader, frames the head the same way.
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil {
		// It checks Host's syntax, which the fast path leaves to the rules it matches.
		if strings.Contains(err.Error(), "malformed Host header") {
			return
		}
		t.Fatalf("net/http refuses the head the fast path accepted: %v\n%q", err, raw)
	}
	if req.Method != h.Method || req.RequestURI != h.Target || req.Host != h.Host || req.ContentLength != h.ContentLength || len(req.TransferEncoding) != 0 {
		t.Fatalf("net/http reads %s %s host %q length %d coding %v; the fast path %s %s host %q length %d",
			req.Method, req.RequestURI, req.Host, req.ContentLength, req.TransferEncoding, h.Method, h.Target, h.Host, h.ContentLength)
	}
}
