package l7

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// echoTraffic checks the non-L7 echo port all the time, on one kept-alive connection and on
// new connections, and records every failure.
type echoTraffic struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	ok       int
	failures []string
}

func startEchoTraffic(t *testing.T, nsPath string, e *env) *echoTraffic {
	et := &echoTraffic{stop: make(chan struct{})}
	fail := func(f string, a ...any) {
		et.mu.Lock()
		et.failures = append(et.failures, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(f, a...))
		et.mu.Unlock()
	}
	success := func() {
		et.mu.Lock()
		et.ok++
		et.mu.Unlock()
	}
	kept, err := testenv.Dial(nsPath, "tcp", e.echoAddr, 5*time.Second)
	if err != nil {
		t.Fatalf("echo port before the test: %v", err)
	}
	et.wg.Add(2)
	go func() {
		defer et.wg.Done()
		defer kept.Close()
		r := bufio.NewReader(kept)
		for i := 0; ; i++ {
			select {
			case <-et.stop:
				return
			default:
			}
			msg := fmt.Sprintf("kept %d\n", i)
			kept.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := kept.Write([]byte(msg)); err != nil {
				fail("kept-alive echo connection: %v", err)
				return
			}
			line, err := r.ReadString('\n')
			if err != nil || line != msg {
				fail("kept-alive echo connection: %q %v", line, err)
				return
			}
			success()
		}
	}()
	go func() {
		defer et.wg.Done()
		for {
			select {
			case <-et.stop:
				return
			default:
			}
			if !testenv.Probe(nsPath, e.echoAddr, "tcp", 5*time.Second) {
				fail("new echo connection failed")
			} else {
				success()
			}
		}
	}()
	return et
}

func (et *echoTraffic) Stop() (int, []string) {
	close(et.stop)
	et.wg.Wait()
	return et.ok, et.failures
}

// Envoy killed while requests flow: requests that need L7 checks fail (no connection, or
// one that breaks) and never reach the server unchecked; the same server's non-L7 port
// keeps working throughout; the agent restarts Envoy and L7 service resumes with the same
// rules.
func TestL7EnvoyKilled(t *testing.T) {
	// Envoy alone: with the fast path, plain HTTP/1.1 never needs Envoy (see
	// TestL7FastPathWithoutEnvoy).
	e := startEnvWith(t, agenttest.Options{ProxyEnvoyOnly: true})
	e.policy(t, l7Rule{role: "client", port: httpPort, http: []map[string]any{httpRule("method", "GET", "path", "/v1")}})
	before := e.waitProxy(t, 30*time.Second)
	workers := e.clientsFor(t, e.clientNS, 1500*time.Millisecond)
	names := []string{"keep-alive", "new-connection"}
	echo := startEchoTraffic(t, e.clientNS, e)
	tr := startTraffic("http://"+e.httpAddr.String(), []string{"/v1", "/admin"}, workers)
	start := time.Now()
	tr.waitRequests(t, names, start, 6, time.Second)

	// Follow the dataplane's drops from before the kill: the flow history is bounded and the
	// traffic below (the echo probes above all) can push an early drop out of it.
	drops := followDrops(t, e)

	killed := time.Now()
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("killing envoy (pid %d): %v", before.PID, err)
	}
	// The agent restarts Envoy and gives it its configuration.
	if !testenv.Eventually(30*time.Second, func() bool {
		p := e.proxyStatus(t)
		return p.State == "running" && p.PID != before.PID && p.PID != 0 && p.Restarts > before.Restarts &&
			p.AckedVersion == p.Version
	}) {
		t.Fatalf("envoy not restarted and configured: %+v", e.proxyStatus(t))
	}
	restarted := time.Now()
	after := e.proxyStatus(t)
	t.Logf("envoy %d killed, %d started %v later, running with its configuration %v later", before.PID, after.PID,
		after.StartedAt.Sub(killed).Round(time.Millisecond), restarted.Sub(killed).Round(time.Millisecond))
	if after.StartedAt.Before(killed) {
		t.Fatalf("the new Envoy started at %v, before the kill at %v", after.StartedAt, killed)
	}
	// Service resumes: every worker gets its allowed request through again...
	var resumed time.Time
	if !testenv.Eventually(30*time.Second, func() bool {
		ok := map[string]bool{}
		for _, o := range tr.outcomes() {
			if o.sent.After(restarted) && o.path == "/v1" && o.status == 200 {
				ok[o.worker] = true
			}
		}
		return len(ok) == len(names)
	}) {
		t.Fatalf("L7 service did not resume after the restart")
	}
	resumed = time.Now()
	// ... and then every request gets exactly what the rules say.
	tr.waitRequests(t, names, resumed, 6, time.Second)
	outs := tr.Stop()
	echoOK, echoFailures := echo.Stop()
	for _, c := range workers {
		c.CloseIdleConnections()
	}

	counts := map[string]map[string]int{}
	var failedDuringOutage int
	seenBy := e.rec.byMarker()
	for _, o := range outs {
		got := fmt.Sprint(o.status)
		if o.err != nil {
			got = "no answer"
		}
		period := "before"
		switch {
		case !o.done.Before(killed) && o.sent.Before(resumed):
			period = "outage"
		case !o.sent.Before(resumed):
			period = "after"
		}
		if counts[period] == nil {
			counts[period] = map[string]int{}
		}
		counts[period][o.path+" "+got]++
		seen := seenBy[o.m]
		desc := fmt.Sprintf("%s %s GET %s sent %s done %s: %s (server got it %d times)", period, o.worker, o.path,
			o.sent.Format("15:04:05.000"), o.done.Format("15:04:05.000"), got, seen)
		// Never answered or seen unless the rules allow it.
		if o.path == "/admin" && (o.status == 200 || seen != 0) {
			t.Errorf("%s: refused by the rules, yet answered or seen", desc)
		}
		// Once, except across the kill: a request the old Envoy forwarded but could not
		// answer is sent again by the client (Go retries an idempotent request whose
		// kept-alive connection broke) and checked again by the new Envoy.
		if o.status == 200 && (seen == 0 || seen > 1 && period != "outage") {
			t.Errorf("%s: answered 200, want it seen once", desc)
		}
		// A request sent after the kill and finished before the new Envoy even started
		// cannot have been answered at all.
		if o.sent.After(killed) && o.done.Before(after.StartedAt) && o.err == nil {
			t.Errorf("%s: answered while no Envoy ran", desc)
		}
		if period == "outage" && o.err != nil {
			failedDuringOutage++
		}
		// Outside the outage, exactly what the rules say.
		if period != "outage" {
			want := map[string]int{"/v1": 200, "/admin": 403}[o.path]
			if o.err != nil || o.status != want {
				t.Errorf("%s: want %d", desc, want)
			}
		}
	}
	for _, p := range []string{"before", "outage", "after"} {
		t.Logf("%s: %v", p, sortedCounts(counts[p]))
	}
	// Connections may not fail visibly (a dropped SYN is sent again, and may find the new
	// Envoy); the dataplane's drops below show the refusals.
	t.Logf("L7 requests that failed during the outage: %d", failedDuringOutage)
	// The server got every request through the proxy: none without its X-Forwarded-For.
	for _, s := range e.rec.all() {
		host, _, _ := net.SplitHostPort(s.Remote)
		if s.Header.Get("X-Forwarded-For") != host {
			t.Errorf("the server got %s %s from %s without the proxy", s.Method, s.URI, s.Remote)
		}
	}
	// The non-L7 port never noticed.
	t.Logf("echo port: %d answers", echoOK)
	for _, f := range echoFailures {
		t.Errorf("non-L7 port: %s", f)
	}
	if echoOK == 0 {
		t.Error("no echo answer at all")
	}
	// The dataplane refused L7 connections while no proxy listened, and reported it. The
	// clients whose connections the kill broke reconnect at once, long before the new
	// Envoy listens, so their SYNs meet no proxy.
	if !testenv.Eventually(5*time.Second, func() bool { return drops.seen("proxy-unavailable") }) {
		t.Errorf("no proxy-unavailable drop reported; drops seen: %v", drops.reasons())
	}
}

// dropFollower counts the reasons of the dataplane drops the agent streams.
type dropFollower struct {
	mu     sync.Mutex
	counts map[string]int
}

func followDrops(t *testing.T, e *env) *dropFollower {
	d := &dropFollower{counts: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// SinceStart as well: a drop that comes before the subscription is still in the history.
	req := api.ObserveRequest{Follow: true, SinceStart: true, Filter: api.FlowFilter{Verdict: "dropped", Type: "l3l4"}}
	go func() {
		defer close(done)
		e.Client.Observe(ctx, req, func(f api.Flow) error {
			d.mu.Lock()
			d.counts[f.Reason]++
			d.mu.Unlock()
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

func (d *dropFollower) seen(reason string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counts[reason] > 0
}

func (d *dropFollower) reasons() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.counts)
}
