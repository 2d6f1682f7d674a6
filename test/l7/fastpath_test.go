package l7

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// With the fast path, plain HTTP/1.1 is checked by the agent, not by Envoy: Envoy killed
// while requests flow changes nothing for them (every request gets exactly what the rules
// say, before, during and after the restart), the fast path counts them, and h2c requests,
// which the fast path hands to Envoy, are served again once Envoy is back.
func TestL7FastPathWithoutEnvoy(t *testing.T) {
	e := startEnv(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/v1")}})
	before := e.waitProxy(t, 30*time.Second)
	if before.FastPath == nil {
		t.Fatalf("no fast path in the proxy status: %+v", before)
	}
	workers := e.clientsFor(t, e.clientNS, 1500*time.Millisecond)
	names := []string{"keep-alive", "new-connection"}
	tr := startTraffic("http://"+e.httpAddr.String(), []string{"/v1", "/admin"}, workers)
	start := time.Now()
	tr.waitRequests(t, names, start, 6, time.Second)

	killed := time.Now()
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("killing envoy (pid %d): %v", before.PID, err)
	}
	if !testenv.Eventually(30*time.Second, func() bool {
		p := e.proxyStatus(t)
		return p.State == "running" && p.PID != before.PID && p.PID != 0 && p.AckedVersion == p.Version
	}) {
		t.Fatalf("envoy not restarted and configured: %+v", e.proxyStatus(t))
	}
	restarted := time.Now()
	tr.waitRequests(t, names, restarted, 6, time.Second)
	outs := tr.Stop()
	for _, c := range workers {
		c.CloseIdleConnections()
	}
	seenBy := e.rec.byMarker()
	var during int
	for _, o := range outs {
		want := map[string]int{"/v1": 200, "/admin": 403}[o.path]
		seen := seenBy[o.m]
		if o.err != nil || o.status != want {
			t.Errorf("%s GET %s sent %s: %d %v, want %d", o.worker, o.path, o.sent.Format("15:04:05.000"), o.status, o.err, want)
		}
		if wantSeen := map[bool]int{true: 1, false: 0}[want == 200]; seen != wantSeen {
			t.Errorf("%s GET %s: the server got it %d times, want %d", o.worker, o.path, seen, wantSeen)
		}
		if !o.sent.Before(killed) && o.sent.Before(restarted) {
			during++
		}
	}
	t.Logf("%d requests, %d of them while Envoy was down or starting (%v)", len(outs), during, restarted.Sub(killed).Round(time.Millisecond))
	// Every request reached the server through the proxy (it adds X-Forwarded-For).
	for _, s := range e.rec.all() {
		host, _, _ := net.SplitHostPort(s.Remote)
		if s.Header.Get("X-Forwarded-For") != host {
			t.Errorf("the server got %s %s from %s without the proxy", s.Method, s.URI, s.Remote)
		}
	}
	after := e.proxyStatus(t)
	if f := after.FastPath; f == nil || f.Requests < uint64(len(outs)) || f.Denied == 0 {
		t.Errorf("fast path status after %d requests: %+v", len(outs), f)
	}
	// h2c needs Envoy: handed over, and served by the restarted one.
	if !testenv.Eventually(10*time.Second, func() bool {
		status, _, err := e.send(t, hcase{method: "GET", target: "/v1", host: "server", h2: true}, marker())
		return err == nil && status == 200
	}) {
		t.Errorf("h2c GET /v1 not served after Envoy's restart")
	}
	if status, _, err := e.send(t, hcase{method: "GET", target: "/admin", host: "server", h2: true}, marker()); err != nil || status != 403 {
		t.Errorf("h2c GET /admin: %d %v, want 403", status, err)
	}
	if f := e.proxyStatus(t).FastPath; f == nil || f.HandedOver == 0 {
		t.Errorf("no connection handed to Envoy: %+v", f)
	}
}
