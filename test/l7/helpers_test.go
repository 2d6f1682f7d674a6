package l7

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

const (
	ns       = "l7"
	httpPort = 80    // HTTP recorder, L7 rules
	echoPort = 81    // TCP echo (testenv), plain L4 allow: never proxied
	grpcPort = 50051 // gRPC health service, L7 rules
)

// seen is one request as the server parsed it.
type seen struct {
	At     time.Time
	Method string
	URI    string // path and query as received
	Host   string
	Proto  string
	Remote string
	Header http.Header
	Body   string
}

// recorder is an HTTP server (HTTP/1.1 and h2c) that records every request it parses and
// every byte it reads, on every connection: a refused request must appear in neither.
type recorder struct {
	srv  *http.Server
	done chan struct{}

	mu    sync.Mutex
	reqs  []seen
	raw   bytes.Buffer
	conns int
}

// serveRecorder starts a recorder on port in the namespace at nsPath, over IPv4 and, when
// the namespace has IPv6 (a dual-stack endpoint), over IPv6; it stops when the test ends.
func serveRecorder(t testing.TB, nsPath string, port uint16) *recorder {
	t.Helper()
	var ls []net.Listener
	if err := testenv.InNetns(nsPath, func() error {
		l, err := net.Listen("tcp4", fmt.Sprintf(":%d", port))
		if err != nil {
			return err
		}
		ls = append(ls, l)
		if l6, err := net.Listen("tcp6", fmt.Sprintf(":%d", port)); err == nil {
			ls = append(ls, l6)
		}
		return nil
	}); err != nil {
		t.Fatalf("listening on tcp/%d in %s: %v", port, nsPath, err)
	}
	r := &recorder{done: make(chan struct{})}
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	r.srv = &http.Server{Handler: r, Protocols: &p, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.srv.Serve(&teeListener{Listener: l, r: r})
		}()
	}
	go func() {
		wg.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		r.srv.Close()
		<-r.done
	})
	return r
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.reqs = append(r.reqs, seen{
		At: time.Now(), Method: req.Method, URI: req.RequestURI, Host: req.Host, Proto: req.Proto,
		Remote: req.RemoteAddr, Header: req.Header.Clone(), Body: string(b),
	})
	r.mu.Unlock()
	w.Header().Set("X-Remote-Addr", req.RemoteAddr)
	fmt.Fprintf(w, "%s %s\n", req.Method, req.RequestURI)
}

// requests returns the requests seen so far that carry marker in their X-Req header or
// their URI.
func (r *recorder) requests(marker string) []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []seen
	for _, s := range r.reqs {
		if strings.Contains(s.URI, marker) || slices.Contains(s.Header.Values("X-Req"), marker) {
			out = append(out, s)
		}
	}
	return out
}

// byMarker counts the requests seen so far by the marker in their X-Req header: one pass,
// for checks that look up every request of a traffic run (requests scans them all).
func (r *recorder) byMarker() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := map[string]int{}
	for _, s := range r.reqs {
		for _, m := range s.Header.Values("X-Req") {
			n[m]++
		}
	}
	return n
}

// rawLen is how many bytes the server has read so far, on all connections.
func (r *recorder) rawLen() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.raw.Len()
}

// all returns every request seen so far.
func (r *recorder) all() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.reqs...)
}

// rawContains reports whether the bytes the server read on any connection contain s.
func (r *recorder) rawContains(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Contains(r.raw.Bytes(), []byte(s))
}

func (r *recorder) connCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns
}

type teeListener struct {
	net.Listener
	r *recorder
}

func (l *teeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.r.mu.Lock()
	l.r.conns++
	l.r.mu.Unlock()
	return &teeConn{Conn: c, r: l.r}, nil
}

type teeConn struct {
	net.Conn
	r *recorder
}

func (c *teeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.r.mu.Lock()
		// Bounded: the tests send far less; beyond this the check would be blind, so
		// say so loudly instead of growing without limit.
		if c.r.raw.Len() < 64<<20 {
			c.r.raw.Write(p[:n])
		} else {
			panic("recorder: more than 64 MiB received")
		}
		c.r.mu.Unlock()
	}
	return n, err
}

// env is an agent with a server endpoint (HTTP recorder on httpPort, gRPC health service
// on grpcPort, TCP echo on echoPort) and two clients with different labels. The policy
// "base" lets both clients reach echoPort (no L7) and makes the server enforce ingress;
// each test adds its own L7 policy.
type env struct {
	*agenttest.Env
	server, client, other        api.Endpoint
	serverIP                     netip.Addr
	rec                          *recorder
	grpc                         *grpcServer
	clientNS, otherNS            string
	serverKey, clientKey         string
	otherKey                     string
	httpAddr, echoAddr, grpcAddr netip.AddrPort
	// nextPort hands out client ports (see dial).
	nextPort atomic.Uint32
	// sendSide: the agent checks the L7 rules it can match on the client's socket (no
	// proxy hop, so no X-Forwarded-For on those requests; sendside_test.go).
	sendSide bool
}

// Client ports come from here, below the kernel's ephemeral range (32768-60999), each used
// once per agent.
const firstClientPort, lastClientPort = 10000, 32000

const basePolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: base, namespace: l7}
spec:
  endpointSelector: {matchLabels: {app: server}}
  ingress:
  - fromEndpoints: [{matchLabels: {role: client}}, {matchLabels: {role: other}}]
    toPorts:
    - ports: [{port: "81", protocol: TCP}]
`

func startEnv(t *testing.T) *env {
	t.Helper()
	return startEnvWith(t, agenttest.Options{})
}

// startEnvWith is startEnv with agent options (the echo port is always served).
func startEnvWith(t *testing.T, opts agenttest.Options) *env {
	t.Helper()
	agenttest.RequireEnvoy(t)
	opts.TCPPorts = []uint16{echoPort}
	te := agenttest.StartAgent(t, opts)
	e := &env{Env: te, serverKey: ns + "/server", clientKey: ns + "/client", otherKey: ns + "/other", sendSide: opts.L7SendSide}
	e.server = te.AddEndpoint(ns, "server", map[string]string{"app": "server"})
	e.client = te.AddEndpoint(ns, "client", map[string]string{"role": "client"})
	e.other = te.AddEndpoint(ns, "other", map[string]string{"role": "other"})
	e.nextPort.Store(firstClientPort)
	e.serverIP = netip.MustParseAddr(e.server.IP)
	e.clientNS, e.otherNS = e.client.Netns, e.other.Netns
	e.httpAddr = netip.AddrPortFrom(e.serverIP, httpPort)
	e.echoAddr = netip.AddrPortFrom(e.serverIP, echoPort)
	e.grpcAddr = netip.AddrPortFrom(e.serverIP, grpcPort)
	e.rec = serveRecorder(t, e.server.Netns, httpPort)
	e.grpc = serveGRPC(t, e.server.Netns, grpcPort)
	e.applyYAML(t, basePolicy)
	t.Cleanup(func() {
		if t.Failed() {
			// Not t.Context(): it is cancelled before cleanups run.
			st, _ := te.Client.Status(context.Background())
			if b, err := os.ReadFile(st.Proxy.Log); err == nil {
				t.Logf("envoy log (tail):\n%s", tail(string(b), 40))
			}
		}
	})
	return e
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// applyYAML applies policy documents; t is the (sub)test that fails if that fails.
func (e *env) applyYAML(t testing.TB, doc string) {
	t.Helper()
	if out, errs, code := e.CLIStdin(doc, "apply", "-f", "-"); code != 0 {
		t.Fatalf("rampart apply: exit %d\n%s%s\npolicy:\n%s", code, out, errs, doc)
	}
}

// deleteYAML deletes the policies doc names.
func (e *env) deleteYAML(t testing.TB, doc string) {
	t.Helper()
	if out, errs, code := e.CLIStdin(doc, "delete", "-f", "-"); code != 0 {
		t.Fatalf("rampart delete: exit %d\n%s%s", code, out, errs)
	}
}

// proxyStatus is the agent's L7 proxy status (agenttest's Env.ProxyStatus fails the test
// that started the agent, not the subtest calling it).
func (e *env) proxyStatus(t testing.TB) api.ProxyStatus {
	t.Helper()
	st, err := e.Client.Status(context.Background())
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	return st.Proxy
}

// waitProxy waits until the L7 proxy runs and has applied the latest configuration.
func (e *env) waitProxy(t testing.TB, timeout time.Duration) api.ProxyStatus {
	t.Helper()
	var p api.ProxyStatus
	if !testenv.Eventually(timeout, func() bool {
		p = e.proxyStatus(t)
		return p.State == "running" && p.AckedVersion == p.Version && p.Version > 0
	}) {
		t.Fatalf("L7 proxy not ready after %v: %+v", timeout, p)
	}
	return p
}

// l7Rule is one ingress rule of an L7 policy: peers by role, a port, HTTP rules.
type l7Rule struct {
	role string
	port uint16
	http []map[string]any
}

// l7Policy renders a CiliumNetworkPolicy named name for the server with rules.
func l7Policy(name string, rules ...l7Rule) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: %s, namespace: %s}\n", name, ns)
	b.WriteString("spec:\n  endpointSelector: {matchLabels: {app: server}}\n  ingress:\n")
	for _, r := range rules {
		fmt.Fprintf(&b, "  - fromEndpoints: [{matchLabels: {role: %s}}]\n", r.role)
		fmt.Fprintf(&b, "    toPorts:\n    - ports: [{port: \"%d\", protocol: TCP}]\n", r.port)
		if r.http != nil {
			j, err := json.Marshal(r.http) // JSON is YAML: no quoting questions
			if err != nil {
				panic(err)
			}
			fmt.Fprintf(&b, "      rules:\n        http: %s\n", j)
		}
	}
	return b.String()
}

// policy applies an L7 policy for one subtest (a fresh name) and waits until Envoy runs
// with it; the policy is deleted when the subtest ends.
func (e *env) policy(t *testing.T, rules ...l7Rule) string {
	t.Helper()
	name := "p" + testenv.Suffix(6)
	doc := l7Policy(name, rules...)
	if out, errs, code := e.CLIStdin(doc, "apply", "-f", "-"); code != 0 {
		t.Fatalf("rampart apply: exit %d\n%s%s\npolicy:\n%s", code, out, errs, doc)
	}
	t.Cleanup(func() {
		if out, errs, code := e.CLIStdin(doc, "delete", "--ignore-not-found", "-f", "-"); code != 0 {
			t.Errorf("rampart delete: exit %d\n%s%s", code, out, errs)
		}
	})
	e.waitProxy(t, 30*time.Second)
	return doc
}

// httpRule is an HTTP rule written as alternating field names and values.
func httpRule(kv ...any) map[string]any {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// raw is a raw HTTP/1.1 connection from a client namespace to the server's HTTP port.
func (e *env) raw(t testing.TB, nsPath string, timeout time.Duration) *testenv.RawHTTP {
	t.Helper()
	conn, err := e.dial(nsPath, e.httpAddr, timeout)
	if err != nil {
		t.Fatalf("connecting to %s: %v", e.httpAddr, err)
	}
	c := testenv.NewRawHTTP(conn, timeout)
	t.Cleanup(func() { c.Close() })
	return c
}

// dial connects from the namespace at nsPath to `to`, from a client port that no earlier
// connection of this agent's clients used, so each test controls exactly which client
// ports are reused: only TestL7/time-wait-port-reuse reuses one on purpose (the proxy
// closing first used to leave a TIME_WAIT socket in the node namespace that swallowed the
// next SYN from that port; the agent now runs that namespace without TIME_WAIT).
func (e *env) dial(nsPath string, to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	port := e.nextPort.Add(1) - 1
	if port > lastClientPort {
		return nil, fmt.Errorf("test client ports used up (%d connections)", lastClientPort-firstClientPort)
	}
	return dialFrom(nsPath, int(port), to, timeout)
}

// dialFrom connects from the namespace at nsPath and local port port (SO_REUSEADDR: a
// port whose earlier connection is closed can be used again at once, as the kernel's own
// port choice would).
func dialFrom(nsPath string, port int, to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := testenv.InNetns(nsPath, func() error {
		d := net.Dialer{
			Timeout:   timeout,
			LocalAddr: &net.TCPAddr{Port: port},
			Control: func(network, address string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
				})
				return errors.Join(err, serr)
			},
		}
		var err error
		network := "tcp4"
		if to.Addr().Is6() {
			network = "tcp6"
		}
		c, err = d.DialContext(context.Background(), network, to.String())
		return err
	})
	return c, err
}

// httpClient is an HTTP client whose connections start in the namespace at nsPath (see
// dial); h2c speaks HTTP/2 with prior knowledge, and keepAlive=false opens a connection per
// request.
func (e *env) httpClient(t testing.TB, nsPath string, timeout time.Duration, h2c, keepAlive bool) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return nil, err
			}
			return e.dial(nsPath, ap, timeout)
		},
		DisableCompression: true,
		DisableKeepAlives:  !keepAlive,
	}
	if h2c {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr.Protocols = &p
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: timeout, Transport: tr}
}

// connClosed reports whether the peer closes c (EOF or reset) within timeout, reading and
// discarding anything it still sends.
func connClosed(c *testenv.RawHTTP, timeout time.Duration) bool {
	c.Conn.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 4096)
	for {
		_, err := c.Conn.Read(buf)
		if err != nil {
			return isClosed(err)
		}
	}
}

func isClosed(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "connection reset")
}

// get sends one request with c and returns the status (0 and the error for a failed
// request) and the response body.
func get(c *http.Client, method, url string, hdr map[string]string) (int, string, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return 0, "", err
	}
	for k, v := range hdr {
		if strings.EqualFold(k, "host") {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// marker returns a unique string for one request, so the server's record can be searched
// for it.
func marker() string { return "m" + testenv.Suffix(10) }

// sub prepares a subtest: when it ends, every request the HTTP server received during it
// must have come through the proxy (Envoy sets X-Forwarded-For to the connection's remote
// address; the test clients never send one, so a request without it bypassed the proxy),
// from the address the server saw (source preserved).
func (e *env) sub(t *testing.T) {
	t.Helper()
	start := len(e.rec.all())
	t.Cleanup(func() {
		for _, s := range e.rec.all()[start:] {
			host, _, _ := net.SplitHostPort(s.Remote)
			xff := s.Header.Values("X-Forwarded-For")
			if e.sendSide && len(xff) == 0 {
				xff = []string{host} // checked on the client's socket: no proxy hop
			}
			if len(xff) != 1 || xff[0] != host {
				t.Errorf("the server got %s %s from %s with X-Forwarded-For %q: not through the proxy", s.Method, s.URI, s.Remote, xff)
			}
			if host != e.client.IP && host != e.other.IP {
				t.Errorf("the server got %s %s from %s, not from a client's own address", s.Method, s.URI, s.Remote)
			}
		}
	})
}

// rawReq is an HTTP/1.1 request as text: the request line, Host (unless host is "-"), an
// X-Req marker header (unless marker is ""), then hdr lines, then the empty line.
func rawReq(method, target, host, marker string, hdr ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\n", method, target)
	if host != "-" {
		fmt.Fprintf(&b, "Host: %s\r\n", host)
	}
	if marker != "" {
		fmt.Fprintf(&b, "X-Req: %s\r\n", marker)
	}
	for _, h := range hdr {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	return b.String()
}

// hcase is one request and what must happen to it.
type hcase struct {
	method, target string
	host           string   // "" = "server"; "-" = no Host header
	hdr            []string // extra header lines ("Name: value")
	h2             bool     // send over h2c instead of raw HTTP/1.1
	other          bool     // send from the other client
	want           int      // status
	seenURI        string   // for 200: the request URI the server must get ("" = target)
	seenHost       string   // for 200: the Host the server must get ("" = host)
}

func (c hcase) String() string {
	proto := "HTTP/1.1"
	if c.h2 {
		proto = "h2c"
	}
	return fmt.Sprintf("%s %s %s host %q %q", proto, c.method, c.target, c.host, c.hdr)
}

// check sends c on a fresh connection and asserts its status and, through the server's
// record, that a 200 reached the server once, as expected, and anything else never did.
func (e *env) check(t *testing.T, cases ...hcase) {
	t.Helper()
	var denied []string
	for _, c := range cases {
		if c.h2 && e.sendSide {
			continue // h2c is outside the send-side verdict's subset (sendside_test.go)
		}
		if c.host == "" {
			c.host = "server"
		}
		m := marker()
		status, body, err := e.send(t, c, m)
		if err != nil {
			t.Errorf("%v: %v", c, err)
			continue
		}
		if status != c.want && !(e.sendSide && c.want != 200 && status == 400) {
			// (The send-side verdict answers 400 to requests outside its subset that the
			// proxy would have refused otherwise: refused either way.)
			t.Errorf("%v: %d %q, want %d", c, status, body, c.want)
		}
		got := e.rec.requests(m)
		if c.want != 200 {
			denied = append(denied, m)
			if len(got) != 0 {
				t.Errorf("%v: answered %d, yet the server got it: %+v", c, status, got)
			}
			continue
		}
		if len(got) != 1 {
			t.Errorf("%v: the server got it %d times, want once", c, len(got))
			continue
		}
		wantURI, wantHost := c.seenURI, c.seenHost
		if wantURI == "" {
			wantURI = c.target
		}
		if wantHost == "" {
			wantHost = c.host
		}
		if got[0].URI != wantURI || got[0].Host != wantHost || got[0].Method != c.method {
			t.Errorf("%v: the server got %s %s host %q, want %s %s host %q", c, got[0].Method, got[0].URI, got[0].Host, c.method, wantURI, wantHost)
		}
	}
	// A refused request that slipped through would have arrived by now (its answer came
	// after it); look again, also in the raw bytes.
	for _, m := range denied {
		if len(e.rec.requests(m)) != 0 || e.rec.rawContains(m) {
			t.Errorf("request %s was refused but reached the server", m)
		}
	}
}

// send sends one request of c carrying marker m on a fresh connection and returns the
// status and body.
func (e *env) send(t *testing.T, c hcase, m string) (int, string, error) {
	t.Helper()
	from := e.clientNS
	if c.other {
		from = e.otherNS
	}
	if c.h2 {
		cl := e.httpClient(t, from, 5*time.Second, true, true)
		defer cl.CloseIdleConnections()
		req, err := http.NewRequest(c.method, "http://"+e.httpAddr.String()+c.target, nil)
		if err != nil {
			return 0, "", err
		}
		req.Host = c.host
		req.Header.Set("X-Req", m)
		for _, h := range c.hdr {
			k, v, _ := strings.Cut(h, ":")
			req.Header.Add(k, strings.TrimSpace(v))
		}
		resp, err := cl.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	nc, err := e.dial(from, e.httpAddr, 5*time.Second)
	if err != nil {
		return 0, "", err
	}
	conn := testenv.NewRawHTTP(nc, 5*time.Second)
	defer conn.Close()
	if err := conn.Send(rawReq(c.method, c.target, c.host, m, c.hdr...)); err != nil {
		return 0, "", err
	}
	resp, body, err := conn.Response(&http.Request{Method: c.method})
	if err != nil {
		return 0, "", err
	}
	return resp.StatusCode, body, nil
}
