package l7

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
)

// outcome is one request of a traffic loop.
type outcome struct {
	worker     string
	path, m    string
	sent, done time.Time
	status     int // 0: failed (err)
	err        error
}

// traffic sends GET requests for paths in turn from workers until stop is closed: each
// worker is an HTTP client, and every request carries a unique X-Req marker.
type traffic struct {
	mu   sync.Mutex
	outs []outcome
	stop chan struct{}
	wg   sync.WaitGroup
}

func startTraffic(url string, paths []string, workers map[string]*http.Client) *traffic {
	tr := &traffic{stop: make(chan struct{})}
	for name, c := range workers {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-tr.stop:
					return
				default:
				}
				o := outcome{worker: name, path: paths[i%len(paths)], m: marker(), sent: time.Now()}
				o.status, _, o.err = get(c, "GET", url+o.path, map[string]string{"X-Req": o.m})
				o.done = time.Now()
				tr.mu.Lock()
				tr.outs = append(tr.outs, o)
				tr.mu.Unlock()
			}
		}()
	}
	return tr
}

// Stop stops the workers and returns every outcome.
func (tr *traffic) Stop() []outcome {
	close(tr.stop)
	tr.wg.Wait()
	return tr.outcomes()
}

func (tr *traffic) outcomes() []outcome {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]outcome(nil), tr.outs...)
}

// countSince is how many requests each worker sent at or after t and has finished.
func (tr *traffic) countSince(t time.Time) map[string]int {
	n := map[string]int{}
	for _, o := range tr.outcomes() {
		if !o.sent.Before(t) {
			n[o.worker]++
		}
	}
	return n
}

// waitRequests waits until every worker finished at least n requests sent at or after t,
// and at least min has passed since t.
func (tr *traffic) waitRequests(t *testing.T, workers []string, since time.Time, n int, min time.Duration) {
	t.Helper()
	if !testenv.Eventually(30*time.Second, func() bool {
		c := tr.countSince(since)
		for _, w := range workers {
			if c[w] < n {
				return false
			}
		}
		return time.Since(since) >= min
	}) {
		t.Fatalf("traffic stalled: requests per worker since %v: %v", since.Format("15:04:05.000"), tr.countSince(since))
	}
}

// clientsFor returns the traffic workers: one kept-alive HTTP/1.1 connection (opened again
// when it breaks) and a new connection for every request.
func (e *env) clientsFor(t testing.TB, nsPath string, timeout time.Duration) map[string]*http.Client {
	return map[string]*http.Client{
		"keep-alive":     e.httpClient(t, nsPath, timeout, false, true),
		"new-connection": e.httpClient(t, nsPath, timeout, false, false),
	}
}

// An L7 rule added, changed and removed while a client sends requests all the time, on a
// kept-alive connection and on new connections: between changes every outcome is the one
// the policy in force gives; across a change a request may get the old or the new outcome,
// but one that both refuse is never answered 200 and never reaches the server.
func testLiveChanges(t *testing.T, e *env) {
	e.sub(t)
	name := func(s string) string { return "live-" + s + "-" + testenv.Suffix(4) }
	polA, polB := name("a"), name("b")
	ruleFor := func(pol, path string) string {
		return l7Policy(pol, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", path)}})
	}
	t.Cleanup(func() {
		e.CLIStdin(ruleFor(polA, "/v1")+"\n---\n"+ruleFor(polB, "/v2"), "delete", "--ignore-not-found", "-f", "-")
	})
	type phase struct {
		name    string
		change  func()
		allowed []string // nil: the port is not allowed at all
		min     int      // requests per worker inside the phase
		// start: the change began; done: the change was applied and the proxy acknowledged
		// it
		start, done time.Time
	}
	apply := func(doc string) func() { return func() { e.applyYAML(t, doc) } }
	del := func(doc string) func() { return func() { e.deleteYAML(t, doc) } }
	phases := []*phase{
		{name: "initial", change: apply(ruleFor(polA, "/v1")), allowed: []string{"/v1"}, min: 8},
		{name: "rule added", change: apply(ruleFor(polB, "/v2")), allowed: []string{"/v1", "/v2"}, min: 8},
		{name: "rule changed", change: apply(ruleFor(polB, "/v3")), allowed: []string{"/v1", "/v3"}, min: 8},
		{name: "rule removed", change: del(ruleFor(polB, "/v3")), allowed: []string{"/v1"}, min: 8},
		// The port loses its last rule: new connections are dropped by the dataplane, open
		// ones get 403 until the proxy closes them.
		{name: "all rules removed", change: del(ruleFor(polA, "/v1")), allowed: nil, min: 1},
		{name: "rule added again", change: apply(ruleFor(polA, "/v1")), allowed: []string{"/v1"}, min: 8},
	}
	paths := []string{"/v1", "/v2", "/v3", "/admin"}
	workers := e.clientsFor(t, e.clientNS, 2*time.Second)
	names := []string{"keep-alive", "new-connection"}
	var tr *traffic
	for i, p := range phases {
		p.start = time.Now()
		p.change()
		e.waitProxy(t, 30*time.Second)
		p.done = time.Now()
		t.Logf("phase %q applied in %v", p.name, p.done.Sub(p.start).Round(time.Millisecond))
		if i == 0 {
			tr = startTraffic("http://"+e.httpAddr.String(), paths, workers)
		}
		tr.waitRequests(t, names, p.done, p.min, time.Second)
	}
	outs := tr.Stop()
	stopped := time.Now()
	for _, c := range workers {
		c.CloseIdleConnections()
	}

	allows := func(p *phase, path string) bool {
		for _, a := range p.allowed {
			if a == path {
				return true
			}
		}
		return false
	}
	// end of phase k's influence: when phase k+1 was fully applied
	until := func(k int) time.Time {
		if k+1 < len(phases) {
			return phases[k+1].done
		}
		return time.Now().Add(time.Hour)
	}
	seenBy := e.rec.byMarker()
	var wrong []string
	perPhase := map[string]map[string]int{}
	for _, o := range outs {
		var possible []int
		for k, p := range phases {
			if o.sent.Before(until(k)) && !o.done.Before(p.start) {
				possible = append(possible, k)
			}
		}
		anyAllows := false
		for _, k := range possible {
			anyAllows = anyAllows || allows(phases[k], o.path)
		}
		seen := seenBy[o.m]
		desc := fmt.Sprintf("%s GET %s sent %s done %s: status %d err %v (phases %v)", o.worker, o.path,
			o.sent.Format("15:04:05.000"), o.done.Format("15:04:05.000"), o.status, o.err, possible)
		if !anyAllows && (o.status == 200 || seen != 0) {
			wrong = append(wrong, desc+": refused by every policy in force, yet answered or seen by the server")
			continue
		}
		if o.status == 200 && seen != 1 {
			wrong = append(wrong, fmt.Sprintf("%s: answered 200 but the server got it %d times", desc, seen))
		}
		if len(possible) != 1 {
			continue
		}
		k := possible[0]
		p := phases[k]
		if o.sent.Before(p.done) || (k+1 < len(phases) && !o.done.Before(phases[k+1].start)) {
			continue // overlaps a change
		}
		want := "403"
		switch {
		case allows(p, o.path):
			want = "200"
		case p.allowed == nil:
			want = "403 or no answer"
		}
		got := fmt.Sprint(o.status)
		if o.err != nil {
			got = "no answer"
		}
		if perPhase[p.name] == nil {
			perPhase[p.name] = map[string]int{}
		}
		perPhase[p.name][o.path+" "+got]++
		if !strings.Contains(want, got) || (got == "no answer" && p.allowed != nil) {
			wrong = append(wrong, desc+": want "+want)
		}
	}
	for k, p := range phases {
		end := stopped
		if k+1 < len(phases) {
			end = phases[k+1].start
		}
		t.Logf("phase %q (%v): %v", p.name, end.Sub(p.done).Round(time.Millisecond), sortedCounts(perPhase[p.name]))
		if len(perPhase[p.name]) == 0 {
			t.Errorf("phase %q: no request fell inside it", p.name)
		}
	}
	for _, o := range outs {
		if o.path == "/admin" && seenBy[o.m] != 0 {
			t.Errorf("the server got %s's GET /admin sent at %s", o.worker, o.sent.Format("15:04:05.000"))
		}
	}
	for _, w := range wrong {
		t.Error(w)
	}
	if len(wrong) > 0 {
		out, _, _ := e.CLI("observe", "--since-start", "--type", "l3l4", "--last", "60")
		t.Logf("the dataplane's last flows:\n%s", out)
	}
}

func sortedCounts(m map[string]int) string {
	var ks []string
	for k, v := range m {
		ks = append(ks, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}

// A connection opened while the port had only a plain L3/L4 allow is not steered to the
// proxy; when an L7 rule then replaces the plain allow, the connection must not go on
// carrying requests the L7 rule refuses straight to the server.
func testEstablishedDirect(t *testing.T, e *env) {
	pol := "direct-" + testenv.Suffix(4)
	plain := l7Policy(pol, l7Rule{role: "client", port: httpPort})
	withL7 := l7Policy(pol, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/v1")}})
	t.Cleanup(func() { e.CLIStdin(plain, "delete", "--ignore-not-found", "-f", "-") })
	e.applyYAML(t, plain)
	c := e.raw(t, e.clientNS, 10*time.Second)
	m := marker()
	c.Send(rawReq("GET", "/admin", "server", m))
	if resp, _, err := c.Response(nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /admin under the plain allow: %v %v, want 200", resp, err)
	}
	e.applyYAML(t, withL7)
	e.waitProxy(t, 30*time.Second)
	// The same connection, now that the rule allows only GET /v1: the request must be
	// refused (403) or the connection fail; it must not reach the server.
	m2 := marker()
	c.Conn.SetDeadline(time.Now().Add(3 * time.Second))
	c.Send(rawReq("GET", "/admin", "server", m2))
	resp, _, err := c.Response(nil)
	if err == nil && resp.StatusCode == 200 || len(e.rec.requests(m2)) != 0 {
		got := e.rec.requests(m2)
		from := ""
		if len(got) > 0 {
			from = got[0].Remote + " with X-Forwarded-For " + fmt.Sprint(got[0].Header.Values("X-Forwarded-For"))
		}
		t.Fatalf("GET /admin on a connection opened before the L7 rule: %v %v; the server got it %d times (from %s)",
			resp.Status, err, len(got), from)
	}
}

// A client may open a new connection from a port it used before as soon as its earlier
// connection is closed (the kernel's port choice does, under load). When the proxy closed
// that earlier connection first (here: the client asked for Connection: close), the node
// namespace keeps a TIME_WAIT socket for the tuple, and the new connection's SYN must still
// reach the proxy.
func testTimeWaitPortReuse(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/v1")}})
	port := int(e.nextPort.Add(1) - 1)
	for i := range 2 {
		conn, err := dialFrom(e.clientNS, port, e.httpAddr, 3*time.Second)
		if err != nil {
			out, _ := testenv.Shell(endpoint.NetnsPath(e.Config.NodeNetns), "ss", "-tanH", fmt.Sprintf("dport = :%d", port))
			t.Fatalf("connection %d from port %d: %v\nnode namespace sockets of the port:\n%s", i+1, port, err, out)
		}
		c := testenv.NewRawHTTP(conn, 5*time.Second)
		c.Send(rawReq("GET", "/v1", "server", "", "Connection: close"))
		if resp, _, err := c.Response(nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("connection %d: %v %v", i+1, resp, err)
		}
		// The proxy closes first: its side of the connection goes to TIME_WAIT.
		if !connClosed(c, 5*time.Second) {
			t.Fatalf("connection %d: the proxy did not close it after Connection: close", i+1)
		}
		c.Close()
	}
}
