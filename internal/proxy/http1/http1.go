// Package http1 is the L7 fast path's HTTP/1.1 reader (package proxy, fastpath.go), a
// package of its own so that it is fuzzed without the proxy's dependencies. It accepts
// only a conservative subset of HTTP/1.1: a request outside it is not refused here but
// handed to Envoy, whose parser then decides. The subset is chosen so that the fast path
// and Envoy cannot read one request two ways:
//
//   - request line: an upper-case method, an origin-form target whose path is already in
//     the form Envoy normalises to (no dot segments, no repeated or escaped slashes, no
//     percent sign), and exactly HTTP/1.1;
//   - header lines: names of letters, digits and '-', the colon right after the name, a
//     value of visible ASCII, space and tab, and CRLF line ends (no obs-fold, no bare LF);
//   - each header name at most once; Host present; Content-Length at most once and only
//     digits; no Transfer-Encoding (chunked bodies go to Envoy), no Upgrade, Expect,
//     HTTP2-Settings, X-Forwarded-For or X-Forwarded-Proto; Connection only keep-alive
//     or close.
//
// Anything else, including a head larger than maxFastHead, goes to Envoy with the bytes
// read so far.
package http1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

const (
	maxFastHead    = 8 << 10 // bytes of request head the fast path reads before giving up
	maxFastHeaders = 64
)

// fastMethods are the methods the fast path checks itself. Envoy's HTTP/1.1 codec refuses
// methods it does not know (400) before any rule: those, and the rarer ones it knows, go
// to Envoy.
var fastMethods = map[string]bool{
	"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true, "OPTIONS": true, "PATCH": true,
}

// ErrNotSimple marks a request head outside the fast path's subset.
var ErrNotSimple = errors.New("request outside the fast path's HTTP/1.1 subset")

// RequestHead is a request head in the fast path's subset.
type RequestHead struct {
	Raw           []byte // the head as received, through the final CRLF
	Method        string
	Target        string // as sent (path and query)
	Path          string // without the query
	Host          string
	Header        map[string]string // lower-case name -> value, every header
	ContentLength int64
	Close         bool // Connection: close
}

// ReadRequestHead reads one request head from r, appending the bytes it consumed to
// raw[:0]. It returns ErrNotSimple (with the bytes consumed so far) for a request outside
// the subset, or the read error.
func ReadRequestHead(r *bufio.Reader, raw []byte) (RequestHead, []byte, error) {
	h := RequestHead{}
	raw = raw[:0]
	// A first byte that cannot start a method (TLS, HTTP/2's preface starts with 'P' and
	// fails at its target) goes to Envoy before the fast path waits for a line end that a
	// binary protocol may never send.
	b, err := r.Peek(1)
	if err != nil {
		return h, raw, err
	}
	if b[0] < 'A' || b[0] > 'Z' {
		return h, raw, ErrNotSimple
	}
	line, raw, err := readLine(r, raw)
	if err != nil {
		return h, raw, err
	}
	if !parseRequestLine(line, &h) {
		return h, raw, ErrNotSimple
	}
	h.Header = make(map[string]string, 8)
	for n := 0; ; n++ {
		if n > maxFastHeaders {
			return h, raw, ErrNotSimple
		}
		line, raw, err = readLine(r, raw)
		if err != nil {
			return h, raw, err
		}
		if len(line) == 0 {
			break
		}
		name, value, ok := parseHeaderLine(line)
		if !ok {
			return h, raw, ErrNotSimple
		}
		if _, dup := h.Header[name]; dup {
			return h, raw, ErrNotSimple
		}
		h.Header[name] = value
		switch name {
		case "host":
			h.Host = value
		case "content-length":
			if h.ContentLength, ok = parseLength(value); !ok {
				return h, raw, ErrNotSimple
			}
		case "connection":
			switch lowerASCII(value) {
			case "close":
				h.Close = true
			case "keep-alive":
			default:
				return h, raw, ErrNotSimple
			}
		case "transfer-encoding", "upgrade", "expect", "http2-settings", "x-forwarded-for", "x-forwarded-proto", "te":
			return h, raw, ErrNotSimple
		}
	}
	if h.Host == "" {
		return h, raw, ErrNotSimple
	}
	h.Raw = raw
	return h, raw, nil
}

// readLine reads one CRLF-terminated line, appends it to raw and returns it without the
// CRLF. A bare LF, a line that does not fit the head limit, or EOF in a line is not simple.
func readLine(r *bufio.Reader, raw []byte) ([]byte, []byte, error) {
	start := len(raw)
	for {
		frag, err := r.ReadSlice('\n')
		raw = append(raw, frag...)
		if len(raw) > maxFastHead {
			return nil, raw, ErrNotSimple
		}
		switch {
		case err == nil:
			line := raw[start:]
			if len(line) < 2 || line[len(line)-2] != '\r' {
				return nil, raw, ErrNotSimple
			}
			return line[:len(line)-2], raw, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(raw) > 0:
			// Part of a request, then EOF: let Envoy answer what it makes of it.
			return nil, raw, ErrNotSimple
		default:
			return nil, raw, err
		}
	}
}

func parseRequestLine(line []byte, h *RequestHead) bool {
	sp := bytes.IndexByte(line, ' ')
	if sp < 1 || !fastMethods[string(line[:sp])] {
		return false
	}
	rest := line[sp+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 < 1 || string(rest[sp2+1:]) != "HTTP/1.1" {
		return false
	}
	target := rest[:sp2]
	if target[0] != '/' {
		return false
	}
	path := target
	if q := bytes.IndexByte(target, '?'); q >= 0 {
		path = target[:q]
	}
	for _, c := range target {
		if c <= 0x20 || c >= 0x7f || c == '#' || c == '\\' {
			return false
		}
	}
	if !normalPath(path) {
		return false
	}
	h.Method = string(line[:sp])
	h.Target = string(target)
	h.Path = string(path)
	return true
}

// normalPath reports whether p is already what Envoy's path normalisation (RFC 3986 dot
// segments, percent-decoding, merged slashes) leaves unchanged.
func normalPath(p []byte) bool {
	if bytes.IndexByte(p, '%') >= 0 || bytes.Contains(p, []byte("//")) {
		return false
	}
	for seg := range bytes.SplitSeq(p[1:], []byte("/")) {
		if string(seg) == "." || string(seg) == ".." {
			return false
		}
	}
	return true
}

// parseHeaderLine splits "Name: value" (value without surrounding white space); the name
// comes back lower-case.
func parseHeaderLine(line []byte) (string, string, bool) {
	colon := bytes.IndexByte(line, ':')
	if colon < 1 {
		return "", "", false
	}
	for _, c := range line[:colon] {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return "", "", false
		}
	}
	v := line[colon+1:]
	for _, c := range v {
		if c != '\t' && (c < 0x20 || c >= 0x7f) {
			return "", "", false
		}
	}
	return lowerASCII(string(line[:colon])), string(bytes.Trim(v, " \t")), true
}

// parseLength parses a Content-Length value: 1 to 18 digits and nothing else.
func parseLength(v string) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// ResponseHead is what the fast path needs to know about a response to relay it.
type ResponseHead struct {
	Status  int
	Chunked bool
	Length  int64 // -1: until the server closes (unless chunked or no body)
	Close   bool
}

// ErrBadResponse is a response the fast path cannot frame; the connection is closed.
var ErrBadResponse = errors.New("malformed response from the server")

// CopyResponseHead reads a response head from r, writes it unchanged to w and parses its
// framing.
func CopyResponseHead(r *bufio.Reader, w *bufio.Writer) (ResponseHead, error) {
	rh := ResponseHead{Length: -1}
	var scratch [256]byte
	line, raw, err := readRespLine(r, scratch[:0])
	if err != nil {
		return rh, err
	}
	if len(line) < 12 || !(bytes.HasPrefix(line, []byte("HTTP/1.1 ")) || bytes.HasPrefix(line, []byte("HTTP/1.0 "))) {
		return rh, ErrBadResponse
	}
	rh.Status, err = strconv.Atoi(string(line[9:12]))
	if err != nil || rh.Status < 100 || (len(line) > 12 && line[12] != ' ') {
		return rh, ErrBadResponse
	}
	rh.Close = line[7] == '0'
	w.Write(raw)
	seenLength := false
	for n := 0; ; n++ {
		if n > 256 {
			return rh, ErrBadResponse
		}
		line, raw, err = readRespLine(r, scratch[:0])
		if err != nil {
			return rh, err
		}
		w.Write(raw)
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 1 {
			return rh, ErrBadResponse
		}
		name := lowerASCII(string(line[:colon]))
		value := lowerASCII(string(bytes.Trim(line[colon+1:], " \t")))
		switch name {
		case "content-length":
			l, ok := parseLength(value)
			if !ok || seenLength && l != rh.Length {
				return rh, ErrBadResponse
			}
			rh.Length, seenLength = l, true
		case "transfer-encoding":
			if value != "chunked" {
				return rh, ErrBadResponse
			}
			rh.Chunked = true
		case "connection":
			if value == "close" {
				rh.Close = true
			}
		}
	}
	if rh.Chunked && seenLength {
		return rh, ErrBadResponse
	}
	return rh, nil
}

// readRespLine reads one line of a response head (LF or CRLF), appended to raw; it returns
// the line without its end.
func readRespLine(r *bufio.Reader, raw []byte) ([]byte, []byte, error) {
	start := len(raw)
	for {
		frag, err := r.ReadSlice('\n')
		raw = append(raw, frag...)
		if len(raw)-start > 16<<10 {
			return nil, raw, ErrBadResponse
		}
		if err == nil {
			return bytes.TrimRight(raw[start:], "\r\n"), raw, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, raw, err
		}
	}
}

// CopyChunked relays a chunked body, chunk by chunk, through the last chunk and trailers.
func CopyChunked(r *bufio.Reader, w *bufio.Writer) error {
	var scratch [128]byte
	for {
		line, raw, err := readRespLine(r, scratch[:0])
		if err != nil {
			return err
		}
		w.Write(raw)
		size := line
		if i := bytes.IndexByte(size, ';'); i >= 0 {
			size = size[:i]
		}
		size = bytes.TrimRight(size, " \t")
		if len(size) == 0 || len(size) > 15 {
			return ErrBadResponse
		}
		n, err := strconv.ParseInt(string(size), 16, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%w: chunk size %q", ErrBadResponse, size)
		}
		if n == 0 {
			for {
				line, raw, err := readRespLine(r, scratch[:0])
				if err != nil {
					return err
				}
				w.Write(raw)
				if len(line) == 0 {
					return nil
				}
			}
		}
		if _, err := io.CopyN(w, r, n); err != nil {
			return err
		}
		line, raw, err = readRespLine(r, scratch[:0])
		if err != nil {
			return err
		}
		if len(line) != 0 {
			return ErrBadResponse
		}
		w.Write(raw)
	}
}
