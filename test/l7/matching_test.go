package l7

import (
	"strings"
	"testing"
	"time"
)

// Rules are RE2 expressions matched against the whole method, path and host
// (docs/policy-language.md, "L7 HTTP rules"); these subtests run against one agent.

func testMethod(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{
		httpRule("method", "GET", "path", "/m"),
		httpRule("method", "GET|HEAD", "path", "/alt"),
		httpRule("method", "P.*", "path", "/p"),
	}})
	e.check(t,
		hcase{method: "GET", target: "/m", want: 200},
		hcase{method: "HEAD", target: "/m", want: 403},
		hcase{method: "POST", target: "/m", want: 403},
		// Over HTTP/1.1 Envoy refuses methods it does not know, and lower case ones, before
		// any rule (400); over h2c they reach the rules, which are anchored and case-sensitive.
		hcase{method: "GETX", target: "/m", want: 400},
		hcase{method: "get", target: "/m", want: 400},
		hcase{method: "GETX", target: "/m", h2: true, want: 403},
		hcase{method: "XGET", target: "/m", h2: true, want: 403},
		hcase{method: "get", target: "/m", h2: true, want: 403},
		hcase{method: "GET", target: "/m", h2: true, want: 200},
		// Alternation is anchored as a whole: ^(?:GET|HEAD)$, not ^GET|HEAD$.
		hcase{method: "GET", target: "/alt", want: 200},
		hcase{method: "HEAD", target: "/alt", want: 200},
		hcase{method: "POST", target: "/alt", want: 403},
		hcase{method: "GETHEAD", target: "/alt", h2: true, want: 403},
		hcase{method: "XHEAD", target: "/alt", h2: true, want: 403},
		hcase{method: "HEADX", target: "/alt", h2: true, want: 403},
		hcase{method: "POST", target: "/p", want: 200},
		hcase{method: "PUT", target: "/p", want: 200},
		hcase{method: "PATCH", target: "/p", want: 200},
		hcase{method: "GET", target: "/p", want: 403},
		hcase{method: "OPTIONS", target: "/p", want: 403},
	)
}

func testPath(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{
		httpRule("path", "/v1"),
		httpRule("path", "/a|/b"),
		httpRule("path", "/pub/.*"),
		httpRule("path", "/end$"), // an anchor is allowed and redundant
	}})
	e.check(t,
		hcase{method: "GET", target: "/v1", want: 200},
		hcase{method: "GET", target: "/v1", h2: true, want: 200},
		hcase{method: "GET", target: "/v1/x", want: 403},
		hcase{method: "GET", target: "/v1/", want: 403},
		hcase{method: "GET", target: "/xv1", want: 403},
		hcase{method: "GET", target: "/v1x", want: 403},
		hcase{method: "GET", target: "/v1/x", h2: true, want: 403},
		// Paths are case-sensitive.
		hcase{method: "GET", target: "/V1", want: 403},
		hcase{method: "GET", target: "/V1", h2: true, want: 403},
		hcase{method: "GET", target: "/a", want: 200},
		hcase{method: "GET", target: "/b", want: 200},
		hcase{method: "GET", target: "/a/x", want: 403},
		hcase{method: "GET", target: "/x/b", want: 403},
		hcase{method: "GET", target: "/ab", want: 403},
		hcase{method: "GET", target: "/pub/", want: 200},
		hcase{method: "GET", target: "/pub/x/y", want: 200},
		hcase{method: "GET", target: "/pub", want: 403},
		hcase{method: "GET", target: "/public", want: 403},
		hcase{method: "GET", target: "/end", want: 200},
		hcase{method: "GET", target: "/end/x", want: 403},
	)
}

// The path is matched without the query string, which the server still receives.
func testQuery(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/v1")}})
	e.check(t,
		hcase{method: "GET", target: "/v1?x=1", want: 200},
		hcase{method: "GET", target: "/v1?", want: 200},
		hcase{method: "GET", target: "/v1?x=1&y=/admin", want: 200},
		hcase{method: "GET", target: "/v1?x=1", h2: true, want: 200},
		hcase{method: "GET", target: "/v1/x?y=1", want: 403},
		hcase{method: "GET", target: "/admin?p=/v1", want: 403},
		// An encoded '?' is part of the path, not a query.
		hcase{method: "GET", target: "/v1%3Fx=1", want: 403},
	)
}

// Paths are normalised before the rules see them and the server gets the normalised path
// (docs/policy-language.md "Path and query", docs/architecture.md "Paths are normalised").
func testNormalisation(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/v1(/public/.*)?")}})
	e.check(t,
		// Dot segments are resolved.
		hcase{method: "GET", target: "/v2/../v1", want: 200, seenURI: "/v1"},
		hcase{method: "GET", target: "/../v1", want: 200, seenURI: "/v1"},
		hcase{method: "GET", target: "/v1/public/./x", want: 200, seenURI: "/v1/public/x"},
		hcase{method: "GET", target: "/v1/public/../../admin", want: 403},
		hcase{method: "GET", target: "/v1/public/../../admin", h2: true, want: 403},
		// Percent-encoded unreserved characters are decoded (dots too, then resolved);
		// others stay encoded.
		hcase{method: "GET", target: "/%76%31", want: 200, seenURI: "/v1"},
		hcase{method: "GET", target: "/v1/public/%7e%61", want: 200, seenURI: "/v1/public/~a"},
		hcase{method: "GET", target: "/v1/public/%2e%2e/%2e%2e/admin", want: 403},
		hcase{method: "GET", target: "/v1/public/%20", want: 200, seenURI: "/v1/public/%20"},
		// Repeated slashes are merged.
		hcase{method: "GET", target: "//v1", want: 200, seenURI: "/v1"},
		hcase{method: "GET", target: "/v1/public//x", want: 200, seenURI: "/v1/public/x"},
		// Encoded slashes and backslashes are refused.
		hcase{method: "GET", target: "/v1/public/a%2Fb", want: 400},
		hcase{method: "GET", target: "/v1/public/a%2fb", want: 400},
		hcase{method: "GET", target: "/v1/public/..%2f..%2fadmin", want: 400},
		hcase{method: "GET", target: "/v1/public/a%5Cb", want: 400},
		// The query is not normalised, and kept.
		hcase{method: "GET", target: "/v2/../v1?a=//b/../c", want: 200, seenURI: "/v1?a=//b/../c"},
	)
}

// The host rule sees the Host header (HTTP/2 :authority) as sent, port included.
func testHost(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{
		httpRule("host", `server\.example`, "path", "/h"),
		httpRule("host", `server\.example(:80)?`, "path", "/hp"),
		httpRule("host", `(?i)server\.example`, "path", "/hi"),
	}})
	e.check(t,
		hcase{method: "GET", target: "/h", host: "server.example", want: 200},
		hcase{method: "GET", target: "/h", host: "server.example", h2: true, want: 200},
		hcase{method: "GET", target: "/h", host: "server.example:80", want: 403},
		hcase{method: "GET", target: "/h", host: "server.example:80", h2: true, want: 403},
		hcase{method: "GET", target: "/h", host: "SERVER.example", want: 403},
		hcase{method: "GET", target: "/h", host: "xserver.example", want: 403},
		hcase{method: "GET", target: "/h", host: "server.example.evil", want: 403},
		hcase{method: "GET", target: "/h", host: "serverXexample", want: 403},
		hcase{method: "GET", target: "/h", host: "-", want: 400}, // HTTP/1.1 needs Host
		// Two Host headers are merged into one value ("server.example,evil"), which is what
		// the rule sees: refused.
		hcase{method: "GET", target: "/h", host: "server.example", hdr: []string{"Host: evil"}, want: 403},
		// An absolute-form target's authority is the host, for the rule and for the server.
		hcase{method: "GET", target: "http://server.example/h", host: "evil", want: 200, seenURI: "/h", seenHost: "server.example"},
		hcase{method: "GET", target: "http://evil/h", host: "server.example", want: 403},
		hcase{method: "GET", target: "/hp", host: "server.example", want: 200},
		hcase{method: "GET", target: "/hp", host: "server.example:80", want: 200},
		hcase{method: "GET", target: "/hp", host: "server.example:8080", want: 403},
		hcase{method: "GET", target: "/hi", host: "SERVER.Example", want: 200},
		hcase{method: "GET", target: "/hi", host: "SERVER.Example:80", want: 403},
	)
}

// Header names are case-insensitive; values are compared exactly, and a header sent more
// than once must have the value in every occurrence.
func testHeaders(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{
		httpRule("path", "/hdr", "headers", []string{"X-Mode: landing"}),
		httpRule("path", "/present", "headers", []string{"X-Token"}),
		httpRule("path", "/hm", "headerMatches", []map[string]any{{"name": "x-ship", "value": "TIE"}}),
		httpRule("path", "/two", "headers", []string{"X-A: 1", "X-B: 2"}),
	}})
	e.check(t,
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode: landing"}, want: 200},
		hcase{method: "GET", target: "/hdr", hdr: []string{"x-mode: landing"}, want: 200},
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-MODE: landing"}, want: 200},
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode: landing"}, h2: true, want: 200},
		// Optional white space around a value is not part of it (HTTP).
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode:   landing  "}, want: 200},
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode: Landing"}, want: 403},
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode: LANDING"}, h2: true, want: 403},
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode: landing2"}, want: 403},
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode: land"}, want: 403},
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode: landing,attack"}, want: 403},
		hcase{method: "GET", target: "/hdr", want: 403},
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode-X: landing"}, want: 403},
		// Repeated: every occurrence must have the value, in either order and protocol.
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode: landing", "X-Mode: attack"}, want: 403},
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode: attack", "X-Mode: landing"}, want: 403},
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode: attack", "x-mode: landing"}, h2: true, want: 403},
		hcase{method: "GET", target: "/hdr", hdr: []string{"X-Mode: landing", "X-Mode: landing"}, want: 200},
		hcase{method: "GET", target: "/present", hdr: []string{"X-Token: anything"}, want: 200},
		hcase{method: "GET", target: "/present", hdr: []string{"x-TOKEN: x"}, want: 200},
		hcase{method: "GET", target: "/present", want: 403},
		hcase{method: "GET", target: "/hm", hdr: []string{"X-Ship: TIE"}, want: 200},
		hcase{method: "GET", target: "/hm", hdr: []string{"X-Ship: tie"}, want: 403},
		hcase{method: "GET", target: "/two", hdr: []string{"X-A: 1", "X-B: 2"}, want: 200},
		hcase{method: "GET", target: "/two", hdr: []string{"X-A: 1"}, want: 403},
		hcase{method: "GET", target: "/two", hdr: []string{"X-A: 2", "X-B: 1"}, want: 403},
	)
}

// Each peer gets its own rules; a peer without any rule for the port is not let in.
func testPeers(t *testing.T, e *env) {
	t.Run("own-rules", func(t *testing.T) {
		e.sub(t)
		e.policy(t,
			l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/c")}},
			l7Rule{role: "other", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/o")}},
		)
		e.check(t,
			hcase{method: "GET", target: "/c", want: 200},
			hcase{method: "GET", target: "/o", want: 403},
			hcase{method: "GET", target: "/o", other: true, want: 200},
			hcase{method: "GET", target: "/c", other: true, want: 403},
			hcase{method: "GET", target: "/c", other: true, h2: true, want: 403},
		)
		// The server saw each client's own address (the proxy kept it).
		for _, s := range e.rec.all() {
			if s.URI == "/o" && !strings.HasPrefix(s.Remote, e.other.IP+":") {
				t.Errorf("the server got /o from %s, want %s", s.Remote, e.other.IP)
			}
		}
	})
	t.Run("unlisted-peer", func(t *testing.T) {
		e.sub(t)
		e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/c")}})
		e.check(t, hcase{method: "GET", target: "/c", want: 200})
		// The other client has no rule for the port: the dataplane drops its connection
		// (it never reaches the proxy, so there is no 403).
		if c, err := e.dial(e.otherNS, e.httpAddr, 700*time.Millisecond); err == nil {
			c.Close()
			t.Fatal("the other client connected to the L7 port without any rule for it")
		}
	})
}
