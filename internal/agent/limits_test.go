package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv/alloc"
)

// These tests send every kind of oversized or hostile request through the agent's API
// socket (the real handler and the real parser, over a fake dataplane) and check the
// named error, that refusing it costs little memory, and that the agent still answers.

// serveAPI serves the harness' agent on its socket until the test ends.
func serveAPI(t *testing.T, h *harness) *api.Client {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("agent did not stop")
		}
	})
	c := api.NewClient(h.cfg.Socket)
	t.Cleanup(c.Close)
	return c
}

// wantAPIError checks that err is an *api.Error with status and a message containing
// every part.
func wantAPIError(t *testing.T, err error, status int, parts ...string) {
	t.Helper()
	var e *api.Error
	if !errors.As(err, &e) || e.Status != status {
		t.Fatalf("got %v (%T), want status %d", err, err, status)
	}
	for _, p := range parts {
		if !strings.Contains(e.Message, p) {
			t.Errorf("message %q does not contain %q", e.Message, p)
		}
	}
	if len(e.Message) > 1024 {
		t.Errorf("message of %d bytes, want a short one", len(e.Message))
	}
}

// stillAnswers checks that the agent serves requests after a refused one.
func stillAnswers(t *testing.T, c *api.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Status(ctx); err != nil {
		t.Fatalf("the agent does not answer after the refused request: %v", err)
	}
}

// raw sends a request written by hand on a new connection to the socket and returns the
// status and body of the answer.
func raw(t *testing.T, socket string, req []byte) (int, string) {
	t.Helper()
	conn, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	go conn.Write(req) // the server may answer before reading all of it
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// TestAPIDeepJSONManifest is issue 15's crasher: `rampart apply -f` of a JSON file of a
// few million '[' overflowed the agent's stack, and a million levels took 800 MB.
func TestAPIDeepJSONManifest(t *testing.T) {
	h := newHarness(t)
	c := serveAPI(t, h)
	for _, tc := range []struct {
		name   string
		data   string
		status int
		parts  []string
	}{
		{"3M open", strings.Repeat("[", 3_000_000), http.StatusRequestEntityTooLarge,
			[]string{"deep.json: document 1", "document size 3000000 bytes exceeds the limit of 2097152 bytes"}},
		{"2M open", strings.Repeat("[", 2_000_000), http.StatusBadRequest,
			[]string{"deep.json: document 1 (line 1): nesting depth 65 exceeds the limit of 64"}},
		{"1M balanced", strings.Repeat("[", 1_000_000) + strings.Repeat("]", 1_000_000), http.StatusBadRequest,
			[]string{"deep.json: document 1 (line 1): nesting depth 65 exceeds the limit of 64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			start := time.Now()
			n := alloc.Bytes(func() {
				_, err = c.Apply(context.Background(), api.ApplyRequest{Documents: []api.Document{{Source: "deep.json", Data: tc.data}}})
			})
			wantAPIError(t, err, tc.status, tc.parts...)
			// Client and server together: encoding, sending, reading and refusing a few MB.
			if n > alloc.Bound(64<<20) {
				t.Errorf("refusing it allocated %d MiB, want < 64", n>>20)
			}
			t.Logf("refused in %v, %d MiB allocated", time.Since(start), n>>20)
			stillAnswers(t, c)
		})
	}
}

// TestAPIManifestLimits: the other limits on manifests, each refused with its name and the
// value seen, and nothing applied.
func TestAPIManifestLimits(t *testing.T) {
	h := newHarness(t)
	c := serveAPI(t, h)
	policyDoc := func(i int) string {
		return fmt.Sprintf("apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p%d, namespace: x}\nspec: {endpointSelector: {}}\n", i)
	}
	many := func(from, n int) string {
		var b strings.Builder
		for i := from; i < from+n; i++ {
			b.WriteString("---\n" + policyDoc(i))
		}
		return b.String()
	}
	var billion strings.Builder
	billion.WriteString("apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: lol, namespace: x}\nspec:\n  endpointSelector: {}\n  ingress: &a0 [{}]\n")
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&billion, "  x%d: &a%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d,", i-1), 10), ","))
	}
	billion.WriteString("  egress: *a9\n")

	for _, tc := range []struct {
		name   string
		docs   []api.Document
		status int
		parts  []string
		parses int // policies parsed before the refusal, whose cost is not the limit's
	}{
		{"millions of empty documents", []api.Document{{Source: "empty.yaml", Data: strings.Repeat("---\n", 1_500_000)}},
			http.StatusBadRequest, []string{"empty.yaml: document 10001", "number of documents 10001 exceeds the limit of 10000"}, 0},
		{"many policies over two files", []api.Document{{Source: "a.yaml", Data: many(0, 6000)}, {Source: "b.yaml", Data: many(6000, 6000)}},
			http.StatusBadRequest, []string{"b.yaml: number of policies and CIDR groups in the request 12000 exceeds the limit of 10000"}, 12000},
		{"manifest size", []api.Document{{Source: "big.yaml", Data: strings.Repeat("#\n", policy.MaxManifestBytes/2+1)}},
			http.StatusRequestEntityTooLarge, []string{"big.yaml: manifest size 8388610 bytes exceeds the limit of 8388608 bytes"}, 0},
		{"request size", []api.Document{{Source: "a.yaml", Data: strings.Repeat("#\n", policy.MaxManifestBytes/4)}, {Source: "b.yaml", Data: strings.Repeat("#\n", policy.MaxManifestBytes/4+1)}},
			http.StatusRequestEntityTooLarge, []string{"request (2 manifests): manifest size 8388610 bytes exceeds the limit of 8388608 bytes"}, 0},
		{"deep YAML", []api.Document{{Source: "deep.yaml", Data: "a: " + strings.Repeat("[", 1_000_000)}},
			http.StatusBadRequest, []string{"deep.yaml: document 1", "nesting depth 10001 exceeds the limit of 64"}, 0},
		{"alias bomb", []api.Document{{Source: "lol.yaml", Data: billion.String()}},
			http.StatusBadRequest, []string{"lol.yaml: document 1 (CiliumNetworkPolicy x/lol): spec.egress", "YAML aliases are not supported"}, 0},
		{"long source name", []api.Document{{Source: strings.Repeat("s", 1<<20), Data: policyDoc(0)}},
			http.StatusBadRequest, []string{"sss... (1048576 bytes): source name length 1048576 bytes exceeds the limit of 4096 bytes"}, 0},
		{"many manifests", make([]api.Document, policy.MaxSources+1),
			http.StatusBadRequest, []string{"request: number of manifests in the request 10001 exceeds the limit of 10000"}, 0},
		{"long name", []api.Document{{Source: "name.yaml", Data: strings.Replace(policyDoc(0), "p0", strings.Repeat("n", 1<<20), 1)}},
			http.StatusBadRequest, []string{"name.yaml: document 1", "metadata.name", "invalid name", "(1048576 bytes)"}, 0},
		{"long label key", []api.Document{{Source: "label.json", Data: `{"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy", "metadata": {"name": "p"}, "spec": {"endpointSelector": {"matchLabels": {"` + strings.Repeat("k", 1<<20) + `": "v"}}}}`}},
			http.StatusBadRequest, []string{"label.json: document 1 (CiliumNetworkPolicy default/p)", "invalid label key", "(1048576 bytes)"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			n := alloc.Bytes(func() {
				_, err = c.Apply(context.Background(), api.ApplyRequest{Documents: tc.docs})
			})
			wantAPIError(t, err, tc.status, tc.parts...)
			size := 0
			for _, d := range tc.docs {
				size += len(d.Data)
			}
			// Encoding, escaping, sending, receiving and unescaping the request take a few
			// copies of it (client and server count here together); parsing what it holds
			// without the limits took a hundred times its size or more.
			if tc.parses == 0 && n > alloc.Bound(uint64(64<<20+24*size)) {
				t.Errorf("refusing %d bytes allocated %d MiB", size, n>>20)
			}
			t.Logf("%d bytes refused, %d MiB allocated", size, n>>20)
			stillAnswers(t, c)
			if ps, _ := c.ListPolicies(context.Background()); len(ps) != 0 {
				t.Fatalf("%d policies applied by a refused request", len(ps))
			}
		})
	}
	// Under the limits, the same kind of request applies.
	res, err := c.Apply(context.Background(), api.ApplyRequest{Documents: []api.Document{{Source: "a.yaml", Data: many(0, 100)}}})
	if err != nil || len(res.Changes) != 100 {
		t.Fatalf("100 policies: %v", err)
	}
}

// TestAPIRequestLimits: bodies, URLs and headers over their limits are refused before the
// agent reads more of them, with a named error.
func TestAPIRequestLimits(t *testing.T) {
	h := newHarness(t)
	c := serveAPI(t, h)
	sock := h.cfg.Socket
	post := func(path string, contentLength int64, body string) []byte {
		return fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: rampart\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, contentLength, body)
	}
	for _, tc := range []struct {
		name   string
		req    []byte
		status int
		parts  []string
	}{
		{"manifest body announced too large", post("/v1/policies/apply", api.MaxManifestBodyBytes+1, ""),
			413, []string{"request body of POST /v1/policies/apply: size 67108865 bytes exceeds the limit of 67108864 bytes"}},
		{"endpoint body announced too large", post("/v1/endpoints", 1<<30, ""),
			413, []string{"request body of POST /v1/endpoints: size 1073741824 bytes exceeds the limit of 1048576 bytes"}},
		{"label body announced too large", post("/v1/namespaces/x/labels", api.MaxBodyBytes+1, ""),
			413, []string{"request body of POST /v1/namespaces/x/labels: size 1048577 bytes exceeds the limit of 1048576 bytes"}},
		{"trace body too large, chunked", fmt.Appendf(nil, "POST /v1/trace HTTP/1.1\r\nHost: rampart\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", api.MaxBodyBytes+1, strings.Repeat(" ", api.MaxBodyBytes+1)),
			413, []string{"request body of POST /v1/trace: size more than 1048576 bytes exceeds the limit of 1048576 bytes"}},
		{"deep endpoint body", post("/v1/endpoints", 2_000_000, strings.Repeat("[", 1_000_000)+strings.Repeat("]", 1_000_000)),
			413, []string{"request body of POST /v1/endpoints: size 2000000 bytes"}},
		{"deep observe body", post("/v1/observe", 200_000, strings.Repeat("[", 100_000)+strings.Repeat("]", 100_000)),
			400, []string{"request body of POST /v1/observe: nesting depth 17 (at byte 16) exceeds the limit of 16"}},
		{"deep apply body", post("/v1/policies/apply", 34, `{"documents":[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]}`[:34]),
			400, []string{"request body of POST /v1/policies/apply: nesting depth 17 (at byte 28) exceeds the limit of 16"}},
		{"long URL", fmt.Appendf(nil, "GET /v1/endpoints/x/%s HTTP/1.1\r\nHost: rampart\r\n\r\n", strings.Repeat("n", 1<<20)),
			431, nil},
		{"many headers", fmt.Appendf(nil, "GET /v1/status HTTP/1.1\r\nHost: rampart\r\n%s\r\n", strings.Repeat("X-A: b\r\n", 100_000)),
			431, nil},
		{"prefix body announced too large", fmt.Appendf(nil, "PUT /v1/cidrsets/s HTTP/1.1\r\nHost: rampart\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", api.PrefixContentType, int64(api.MaxPrefixBodyBytes)+1),
			413, []string{fmt.Sprintf("request body of PUT /v1/cidrsets/s: size %d bytes exceeds the limit of %d bytes", int64(api.MaxPrefixBodyBytes)+1, int64(api.MaxPrefixBodyBytes))}},
		{"prefix count claimed, not sent", prefixRequest(api.MaxPrefixes, 0, nil),
			400, []string{"request body of PUT /v1/cidrsets/s: decoding prefixes: malformed prefix list: reading IPv4 prefix 0: EOF"}},
		{"too many IPv4 prefixes", prefixRequest(api.MaxPrefixes+1, 0, nil),
			400, []string{"134217729 IPv4 prefixes exceed the limit of 134217728"}},
		{"too many IPv6 prefixes", prefixRequest(0, api.MaxPrefixesV6+1, nil),
			400, []string{"1048577 IPv6 prefixes exceed the limit of 1048576"}},
		{"data after the prefixes", prefixRequest(1, 0, []byte{198, 18, 0, 0, 16, 'x'}),
			400, []string{"data after the last prefix"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var status int
			var body string
			n := alloc.Bytes(func() { status, body = raw(t, sock, tc.req) })
			if status != tc.status {
				t.Fatalf("status %d (%s), want %d", status, body, tc.status)
			}
			for _, p := range tc.parts {
				if !strings.Contains(body, p) {
					t.Errorf("answer %q does not contain %q", body, p)
				}
			}
			if n > alloc.Bound(uint64(64<<20+4*len(tc.req))) {
				t.Errorf("refusing a request of %d bytes allocated %d MiB", len(tc.req), n>>20)
			}
			stillAnswers(t, c)
		})
	}
}

// prefixRequest is a prefix list upload whose header claims n4 and n6 prefixes, followed by
// body.
func prefixRequest(n4, n6 uint64, body []byte) []byte {
	var hdr [24]byte
	copy(hdr[:], "RPFX\x01")
	binary.LittleEndian.PutUint64(hdr[8:], n4)
	binary.LittleEndian.PutUint64(hdr[16:], n6)
	b := append(hdr[:], body...)
	return append(fmt.Appendf(nil, "PUT /v1/cidrsets/s HTTP/1.1\r\nHost: rampart\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", api.PrefixContentType, len(b)), b...)
}

// TestAPILongStrings: endpoint and label requests with very long names and labels are
// refused by validation, with a message that does not repeat the megabyte.
func TestAPILongStrings(t *testing.T) {
	h := newHarness(t)
	c := serveAPI(t, h)
	long := strings.Repeat("a", 900<<10)
	ctx := context.Background()
	_, err := c.AddEndpoint(ctx, api.EndpointSpec{Namespace: "x", Name: long})
	wantAPIError(t, err, http.StatusBadRequest, "(921600 bytes)")
	_, err = c.AddEndpoint(ctx, api.EndpointSpec{Namespace: long, Name: "a"})
	wantAPIError(t, err, http.StatusBadRequest, "(921600 bytes)")
	_, err = c.AddEndpoint(ctx, api.EndpointSpec{Namespace: "x", Name: "a", Labels: map[string]string{long: "v"}})
	wantAPIError(t, err, http.StatusBadRequest, "(921600 bytes)")
	_, err = c.AddEndpoint(ctx, api.EndpointSpec{Namespace: "x", Name: "a", Labels: map[string]string{"k": long}})
	wantAPIError(t, err, http.StatusBadRequest, "(921600 bytes)")
	_, err = c.LabelNamespace(ctx, "x", api.LabelChange{Set: map[string]string{long: "v"}})
	wantAPIError(t, err, http.StatusBadRequest, "(921600 bytes)")
	// Over the body limit: refused before decoding.
	_, err = c.AddEndpoint(ctx, api.EndpointSpec{Namespace: "x", Name: long + long})
	wantAPIError(t, err, http.StatusRequestEntityTooLarge, "exceeds the limit of 1048576 bytes")
	stillAnswers(t, c)
	if eps, _ := c.ListEndpoints(ctx); len(eps) != 0 {
		t.Fatalf("%d endpoints made by refused requests", len(eps))
	}
}

// TestAPIConcurrentLargeRequests: many large requests at once are served maxBulk at a
// time, all refused with their own error, and the agent answers throughout.
func TestAPIConcurrentLargeRequests(t *testing.T) {
	h := newHarness(t)
	c := serveAPI(t, h)
	data := strings.Repeat("[", 2_000_000)
	errs := make(chan error, 8)
	for range cap(errs) {
		go func() {
			_, err := c.Apply(context.Background(), api.ApplyRequest{Documents: []api.Document{{Source: "deep.json", Data: data}}})
			errs <- err
		}()
	}
	for range cap(errs) {
		wantAPIError(t, <-errs, http.StatusBadRequest, "nesting depth 65 exceeds the limit of 64")
	}
	stillAnswers(t, c)
}
