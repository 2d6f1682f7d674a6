package proxy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/proxy"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

var (
	clientIP = netip.MustParseAddr("198.18.0.10")
	serverIP = netip.MustParseAddr("198.18.0.20")
)

const (
	clientID identity.Identity = 300
	serverID identity.Identity = 301
)

// starwarsState: the server (ep 2) lets the client (ep 1) send GET /v1 and POST
// /v1/request-landing on port 80, through the proxy.
func starwarsState(rules []policy.HTTPRule) mapstate.State {
	return mapstate.State{
		Endpoints: map[uint32]mapstate.EndpointPolicy{
			1: {},
			2: {EnforceIngress: true, Entries: map[mapstate.Key]mapstate.Value{
				{Identity: clientID, Direction: policy.Ingress, Protocol: policy.ProtoTCP, Port: 80, PortPrefixLen: 16}: {RuleID: 7, Redirect: true},
			}},
		},
		IPCache: map[netip.Prefix]mapstate.IPCacheEntry{
			netip.MustParsePrefix("0.0.0.0/0"):      {Identity: identity.World},
			netip.MustParsePrefix("198.18.0.1/32"):  {Identity: identity.Host},
			netip.MustParsePrefix("198.18.0.10/32"): {Identity: clientID, EndpointID: 1},
			netip.MustParsePrefix("198.18.0.20/32"): {Identity: serverID, EndpointID: 2},
		},
		L7: []mapstate.L7Rule{{EndpointID: 2, Direction: policy.Ingress, Port: 80, Peers: []identity.Identity{clientID}, RuleID: 7, HTTP: rules}},
	}
}

// plan is the proxy plan of st, as the agent builds it.
func plan(st mapstate.State) *l7plan.Plan {
	p := l7plan.BuildPlan(st, nil)
	return &p
}

var landingRules = []policy.HTTPRule{{Method: "GET", Path: "/v1"}, {Method: "POST", Path: "/v1/request-landing"}}

type logSink struct {
	mu   sync.Mutex
	logs []flow.AccessLog
}

func (s *logSink) add(l flow.AccessLog) {
	s.mu.Lock()
	s.logs = append(s.logs, l)
	s.mu.Unlock()
}

func (s *logSink) find(fn func(flow.AccessLog) bool) *flow.AccessLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.logs {
		if fn(s.logs[i]) {
			l := s.logs[i]
			return &l
		}
	}
	return nil
}

// proxyEnv is a bare node with a client and a server endpoint, TPROXY steering of the
// client's port-80 connections, an HTTP server in the server endpoint, and a Manager.
type proxyEnv struct {
	node   *agenttest.BareNode
	client string // client netns path
	mgr    *proxy.Manager
	logs   *logSink
}

func startProxyEnv(t *testing.T) *proxyEnv {
	envoy := agenttest.RequireEnvoy(t)
	n := agenttest.NewBareNode(t)
	c := n.Add("client", clientIP)
	s := n.Add("server", serverIP)
	srv, err := testenv.ServeHTTP(s.NetnsPath, 80, testenv.EchoHTTP())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if err := testenv.TPROXY(n.Path, c.HostIfName, []string{s.HostIfName}, 80, proxy.DefaultListen); err != nil {
		t.Fatal(err)
	}
	run, err := os.MkdirTemp("", "rpx-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	logs := &logSink{}
	mgr, err := proxy.New(proxy.Config{
		Instance:    n.Node.Instance,
		Envoy:       envoy,
		NetnsPath:   n.Path,
		RunDir:      run,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnAccessLog: logs.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mgr.Close()
		if t.Failed() {
			if b, err := os.ReadFile(mgr.LogPath()); err == nil {
				t.Logf("envoy log:\n%s", tail(string(b), 60))
			}
		}
	})
	return &proxyEnv{node: n, client: c.NetnsPath, mgr: mgr, logs: logs}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (e *proxyEnv) ready(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.mgr.WaitReady(ctx); err != nil {
		t.Fatalf("proxy not ready: %v (status %+v)", err, e.mgr.Status())
	}
}

func do(t *testing.T, c *http.Client, method, url string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func TestEnvoyEnforcesAndRecovers(t *testing.T) {
	e := startProxyEnv(t)
	if err := e.mgr.Update(context.Background(), plan(starwarsState(landingRules))); err != nil {
		t.Fatal(err)
	}
	e.mgr.Start()
	e.ready(t)
	st := e.mgr.Status()
	if !st.Running || st.PID == 0 || st.Chains != 1 || st.AckedVersion != st.Version {
		t.Fatalf("status after start: %+v", st)
	}
	// One worker per CPU this process may use (Envoy's own default would count the
	// machine's).
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", st.PID))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("\x00--concurrency\x00%d\x00", runtime.NumCPU()); !strings.Contains(string(cmdline), want) {
		t.Errorf("envoy command line %q, want %q", cmdline, want)
	}

	c := testenv.HTTPClient(e.client, 5*time.Second)
	defer c.CloseIdleConnections()
	base := "http://" + serverIP.String()

	// Allowed, with the client's own address at the server.
	code, body, hdr := do(t, c, "GET", base+"/v1")
	if code != 200 || !strings.HasPrefix(hdr.Get("X-Remote-Addr"), clientIP.String()+":") {
		t.Fatalf("GET /v1: %d %q remote %q; want 200 from %v", code, body, hdr.Get("X-Remote-Addr"), clientIP)
	}
	if code, _, _ := do(t, c, "POST", base+"/v1/request-landing"); code != 200 {
		t.Fatalf("POST /v1/request-landing: %d, want 200", code)
	}
	// Denied, on the same kept-alive connection.
	code, body, _ = do(t, c, "PUT", base+"/v1/exhaust-port")
	if code != 403 || !strings.Contains(body, "access denied") {
		t.Fatalf("PUT /v1/exhaust-port: %d %q, want 403 access denied", code, body)
	}
	if code, _, _ := do(t, c, "GET", base+"/v1?x=1"); code != 200 {
		t.Fatalf("GET /v1?x=1: %d, want 200 (query ignored)", code)
	}
	for _, p := range []string{"/v1/", "/v2", "/V1"} {
		if code, _, _ := do(t, c, "GET", base+p); code != 403 {
			t.Fatalf("GET %s: %d, want 403", p, code)
		}
	}

	// Access logs: the denial and the allowed request with the rule that let it.
	if !testenv.Eventually(5*time.Second, func() bool {
		return e.logs.find(func(l flow.AccessLog) bool { return l.Method == "PUT" }) != nil &&
			e.logs.find(func(l flow.AccessLog) bool { return l.Method == "GET" && l.Path == "/v1" }) != nil
	}) {
		t.Fatalf("access logs missing: %+v", e.logs.logs)
	}
	put := e.logs.find(func(l flow.AccessLog) bool { return l.Method == "PUT" })
	if !put.Denied || put.Status != 403 || put.Src.Addr() != clientIP || put.Dst != netip.AddrPortFrom(serverIP, 80) ||
		put.Ingress == nil || put.Ingress.Allowed || put.Ingress.EndpointID != 2 || put.Chain != "in:198.18.0.20:80" {
		t.Fatalf("PUT log: %+v ingress %+v", *put, put.Ingress)
	}
	get := e.logs.find(func(l flow.AccessLog) bool { return l.Method == "GET" && l.Path == "/v1" })
	if get.Denied || get.Status != 200 || !get.Upstream || get.Protocol != "HTTP/1.1" || get.Ingress == nil ||
		!get.Ingress.Allowed || get.Ingress.RuleID != 7 || get.Latency <= 0 {
		t.Fatalf("GET log: %+v ingress %+v", *get, get.Ingress)
	}

	// A rule change applies to the next request of an open connection.
	if err := e.mgr.Update(context.Background(), plan(starwarsState([]policy.HTTPRule{{Method: "PUT|GET"}}))); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := do(t, c, "PUT", base+"/v1/exhaust-port"); code != 200 {
		t.Fatalf("PUT after the rule allows it: %d, want 200", code)
	}
	if code, _, _ := do(t, c, "POST", base+"/v1/request-landing"); code != 403 {
		t.Fatalf("POST after the rule no longer allows it: %d, want 403", code)
	}

	// Envoy killed: restarted and reconfigured.
	old := e.mgr.PID()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !testenv.Eventually(15*time.Second, func() bool {
		s := e.mgr.Status()
		return s.Restarts == 1 && s.PID != 0 && s.PID != old
	}) {
		t.Fatalf("envoy not restarted: %+v", e.mgr.Status())
	}
	e.ready(t)
	c.CloseIdleConnections()
	var got int
	if !testenv.Eventually(10*time.Second, func() bool {
		got, _, _ = do(t, c, "PUT", base+"/v1/exhaust-port")
		return got == 200
	}) {
		t.Fatalf("PUT after restart: %d, want 200", got)
	}
	if code, _, _ := do(t, c, "POST", base+"/v1/request-landing"); code != 403 {
		t.Fatalf("POST after restart: %d, want 403", code)
	}

	// Stopped: nothing listens, steered connections fail.
	e.mgr.Stop()
	c.CloseIdleConnections()
	short := testenv.HTTPClient(e.client, 1*time.Second)
	if resp, err := short.Get(base + "/v1"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET with the proxy stopped: %s, want a failure", resp.Status)
	}
}

// An endpoint without L7 rules has no chain: connections steered to the proxy anyway are
// closed (default chain), never forwarded.
func TestEnvoyClosesUnknownChains(t *testing.T) {
	e := startProxyEnv(t)
	st := starwarsState(landingRules)
	st.L7[0].Port = 8080 // the steered port 80 has no chain
	st.Endpoints[2].Entries[mapstate.Key{Identity: clientID, Direction: policy.Ingress, Protocol: policy.ProtoTCP, Port: 8080, PortPrefixLen: 16}] = mapstate.Value{RuleID: 7, Redirect: true}
	if err := e.mgr.Update(context.Background(), plan(st)); err != nil {
		t.Fatal(err)
	}
	e.mgr.Start()
	e.ready(t)
	c := testenv.HTTPClient(e.client, 3*time.Second)
	defer c.CloseIdleConnections()
	if resp, err := c.Get("http://" + serverIP.String() + "/v1"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET on a port without a chain: %s, want the connection closed", resp.Status)
	}
}

// h2c (HTTP/2 with prior knowledge, as gRPC uses) goes through the same chain; a gRPC
// request no rule allows gets PERMISSION_DENIED (grpc-status 7).
func TestEnvoyH2CAndGRPCDenial(t *testing.T) {
	e := startProxyEnv(t)
	rules := []policy.HTTPRule{{Method: "POST", Path: "/empire.Deathstar/RequestLanding"}, {Method: "GET", Path: "/v1"}}
	if err := e.mgr.Update(context.Background(), plan(starwarsState(rules))); err != nil {
		t.Fatal(err)
	}
	e.mgr.Start()
	e.ready(t)
	c := testenv.H2CClient(e.client, 5*time.Second)
	defer c.CloseIdleConnections()
	base := "http://" + serverIP.String()
	resp, err := c.Get(base + "/v1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("h2c GET /v1: %s %s", resp.Proto, resp.Status)
	}
	grpc := func(method string) (int, string) {
		req, _ := http.NewRequest("POST", base+"/empire.Deathstar/"+method, strings.NewReader("\x00\x00\x00\x00\x00"))
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("TE", "trailers")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("gRPC %s: %v", method, err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		st := resp.Header.Get("Grpc-Status")
		if st == "" {
			st = resp.Trailer.Get("Grpc-Status")
		}
		return resp.StatusCode, st
	}
	// The echo server is not a gRPC server: an allowed call reaches it and gets its 200
	// without grpc-status; a denied one is answered by the proxy.
	if code, st := grpc("RequestLanding"); code != 200 || st != "" {
		t.Fatalf("allowed gRPC call: %d grpc-status %q, want the server's answer", code, st)
	}
	if code, st := grpc("ExhaustPort"); code != 200 || st != "7" {
		t.Fatalf("denied gRPC call: %d grpc-status %q, want 200 with grpc-status 7", code, st)
	}
	if !testenv.Eventually(5*time.Second, func() bool {
		return e.logs.find(func(l flow.AccessLog) bool { return l.Path == "/empire.Deathstar/ExhaustPort" }) != nil
	}) {
		t.Fatal("no access log for the denied gRPC call")
	}
	l := e.logs.find(func(l flow.AccessLog) bool { return l.Path == "/empire.Deathstar/ExhaustPort" })
	if !l.Denied || l.Protocol != "HTTP/2" {
		t.Fatalf("denied gRPC log: %+v", *l)
	}
}

// Paths are normalised before the rules see them and the server gets the normalised path;
// escaped slashes are refused (docs/architecture.md, "L7 path").
func TestEnvoyPathNormalisation(t *testing.T) {
	e := startProxyEnv(t)
	if err := e.mgr.Update(context.Background(), plan(starwarsState([]policy.HTTPRule{{Method: "GET", Path: "/v1(/public/.*)?"}}))); err != nil {
		t.Fatal(err)
	}
	e.mgr.Start()
	e.ready(t)
	to := netip.AddrPortFrom(serverIP, 80)
	cases := []struct {
		path   string
		status int
		seen   string // the path the server got, for 200
	}{
		{"/v1", 200, "/v1"},
		{"/%76%31", 200, "/v1"},
		{"//v1", 200, "/v1"},
		{"/v2/../v1", 200, "/v1"},
		{"/v1/public/../../admin", 403, ""},
		{"/v1/public/%2e%2e/%2e%2e/admin", 403, ""},
		{"/v1/public/a%2Fb", 400, ""},
		{"/v1/public/a%5Cb", 400, ""},
		{"/V1", 403, ""},
		{"/v1/", 403, ""},
	}
	for _, c := range cases {
		conn, err := testenv.DialRawHTTP(e.client, to, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.Send("GET " + c.path + " HTTP/1.1\r\nHost: deathstar\r\n\r\n")
		resp, body, err := conn.Response(nil)
		conn.Close()
		if err != nil {
			t.Fatalf("GET %s: %v", c.path, err)
		}
		if resp.StatusCode != c.status {
			t.Errorf("GET %s: %d %q, want %d", c.path, resp.StatusCode, body, c.status)
			continue
		}
		if c.status == 200 && !strings.HasPrefix(body, "GET "+c.seen+" from ") {
			t.Errorf("GET %s: the server got %q, want path %s", c.path, body, c.seen)
		}
	}
}
