package suricata_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/monitor/suricata"
	"github.com/rampartnet/rampart/internal/testenv"
)

// requireSuricata skips (fails under CI=true) a test that needs root and Suricata.
func requireSuricata(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := suricata.Binary(""); err != nil {
		testenv.SkipOrFail(t, "%v", err)
	}
}

// sh runs a command in the caller's namespace or, with ns set, in ns.
func sh(t *testing.T, ns string, args ...string) {
	t.Helper()
	if ns == "" {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
		return
	}
	if _, err := testenv.Shell(ns, args...); err != nil {
		t.Fatal(err)
	}
}

// namespaces creates a test's client (a), server (b) and monitor (m) namespaces, named
// with prefix and a random suffix, which it also returns for the test's interface names.
func namespaces(t *testing.T, prefix string) (a, b, m, sfx string) {
	t.Helper()
	sfx = testenv.Suffix(6)
	return testenv.NewNetns(t, prefix+"-a-"+sfx), testenv.NewNetns(t, prefix+"-b-"+sfx), testenv.NewNetns(t, prefix+"-m-"+sfx), sfx
}

// vethPair creates a veth pair with one end in each namespace (by name under /run/netns),
// up; addr (a prefix, may be empty) goes on the first end.
func vethPair(t *testing.T, nsA, ifA, nsB, ifB, addr string) {
	t.Helper()
	sh(t, "", "ip", "link", "add", ifA, "netns", filepath.Base(nsA), "type", "veth", "peer", "name", ifB, "netns", filepath.Base(nsB))
	if addr != "" {
		sh(t, nsA, "ip", "addr", "add", addr, "dev", ifA)
	}
	sh(t, nsA, "ip", "link", "set", ifA, "up")
	sh(t, nsB, "ip", "link", "set", ifB, "up")
}

// recordingServer accepts TCP connections in a namespace, records each line it receives
// and echoes it back: what the destination really got, whatever the client saw.
type recordingServer struct {
	l     net.Listener
	mu    sync.Mutex
	lines []string
	conns []net.Conn
	wg    sync.WaitGroup
}

func serve(t *testing.T, ns string, port uint16) *recordingServer {
	t.Helper()
	s := &recordingServer{}
	err := testenv.InNetns(ns, func() error {
		var err error
		s.l, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatalf("listening in %s: %v", ns, err)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					s.mu.Lock()
					s.lines = append(s.lines, line)
					s.mu.Unlock()
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	// A connection whose packets an inline monitor dropped never ends by itself.
	t.Cleanup(func() {
		s.l.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *recordingServer) received(sub string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}

// exchange connects from ns to `to`, sends msg (one line) and reads the echo. It returns
// the connection's 5-tuple, and whether the echo came back within timeout.
func exchange(t *testing.T, ns string, to netip.AddrPort, msg string, timeout time.Duration) (suricata.FiveTuple, bool) {
	t.Helper()
	c, err := testenv.Dial(ns, "tcp", to, timeout)
	if err != nil {
		t.Fatalf("connecting to %s: %v", to, err)
	}
	defer c.Close()
	tuple := suricata.FiveTuple{Proto: "TCP", Src: c.LocalAddr().(*net.TCPAddr).AddrPort(), Dst: to}
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return tuple, false
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	return tuple, err == nil && got == msg+"\n"
}

func startMonitor(t *testing.T, cfg suricata.Config) *suricata.Monitor {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := suricata.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Stop(); err != nil {
			t.Error(err)
		}
	})
	t.Logf("suricata (%s) started in %s", cfg.Mode, m.StartupTime())
	return m
}

// waitEvent waits up to timeout for an event that satisfies match and returns it with
// every event read on the way.
func waitEvent(t *testing.T, m *suricata.Monitor, timeout time.Duration, what string, match func(suricata.Event) bool) (suricata.Event, []suricata.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ev, seen, err := m.WaitEvent(ctx, match)
	if err != nil {
		var b strings.Builder
		for _, e := range seen {
			b.WriteString("\n  " + e.String())
		}
		t.Fatalf("%s: %v; events read:%s", what, err, b.String())
	}
	return ev, seen
}

func sameFlow(ev suricata.Event, f suricata.FiveTuple) bool {
	return ev.Tuple == f || ev.Tuple == f.Reverse()
}

const attackRule = `%s tcp any any -> any 5432 (msg:"rampart attack to postgres"; flow:to_server; content:"rampart-attack"; sid:1000001; rev:1;)`

// A passive monitor receives a copy of a connection's packets (tc mirred on the client's
// interface stands in for the tap) and alerts on the attack payload with the attacked
// connection's 5-tuple; the benign connection before it raises no alert, and both reach
// the server, as a mirror never stops traffic.
func TestPassiveAlert(t *testing.T) {
	requireSuricata(t)
	nsA, nsB, nsM, sfx := namespaces(t, "rsa")
	vethPair(t, nsA, "ra"+sfx, nsB, "rb"+sfx, "198.18.10.1/24")
	sh(t, nsB, "ip", "addr", "add", "198.18.10.2/24", "dev", "rb"+sfx)
	vethPair(t, nsA, "rx"+sfx, nsM, "rm"+sfx, "")
	// The copy path: every frame leaving or entering the client's interface is copied to
	// the monitor's veth.
	sh(t, nsA, "tc", "qdisc", "add", "dev", "ra"+sfx, "clsact")
	for _, dir := range []string{"egress", "ingress"} {
		sh(t, nsA, "tc", "filter", "add", "dev", "ra"+sfx, dir, "protocol", "all", "u32", "match", "u32", "0", "0",
			"action", "mirred", "egress", "mirror", "dev", "rx"+sfx)
	}
	srv := serve(t, nsB, 5432)

	m := startMonitor(t, suricata.Config{
		Mode: suricata.Passive, Netns: nsM, Interface: "rm" + sfx, Dir: t.TempDir(),
		Rules: []string{fmt.Sprintf(attackRule, "alert")},
	})

	server := netip.MustParseAddrPort("198.18.10.2:5432")
	benign, ok := exchange(t, nsA, server, "hello from a benign client", 3*time.Second)
	if !ok {
		t.Fatalf("benign exchange %s failed", benign)
	}
	attack, ok := exchange(t, nsA, server, "GET rampart-attack", 3*time.Second)
	if !ok {
		t.Fatalf("attack exchange %s failed: a mirror must not stop traffic", attack)
	}
	if !srv.received("rampart-attack") {
		t.Fatal("the server did not receive the attack payload: a mirror must not stop traffic")
	}

	alert, _ := waitEvent(t, m, 10*time.Second, "alert on the attack", func(ev suricata.Event) bool {
		return ev.Type == suricata.TypeAlert
	})
	if alert.Tuple != attack {
		t.Errorf("alert's 5-tuple %s, want the attack's %s", alert.Tuple, attack)
	}
	if alert.Alert.SignatureID != 1000001 || alert.Alert.Signature != "rampart attack to postgres" || alert.Alert.Action != suricata.Allowed {
		t.Errorf("alert %+v, want sid 1000001, its msg, action allowed", *alert.Alert)
	}
	if alert.Direction != "to_server" || alert.Interface != "rm"+sfx {
		t.Errorf("alert direction %q interface %q, want to_server on rm%s", alert.Direction, alert.Interface, sfx)
	}
	if d := time.Since(alert.Time); d < 0 || d > time.Minute {
		t.Errorf("alert time %s is not now", alert.Time)
	}

	// Suricata reports a flow when it is done with it: once both flow records are in, no
	// alert for the benign flow can come any more.
	var events []suricata.Event
	var flows = map[suricata.FiveTuple]*suricata.Flow{}
	waitEvent(t, m, 20*time.Second, "flow records of both connections", func(ev suricata.Event) bool {
		events = append(events, ev)
		if ev.Type == suricata.TypeFlow {
			flows[ev.Tuple] = ev.Flow
		}
		return flows[benign] != nil && flows[attack] != nil
	})
	for _, ev := range events {
		if ev.Type == suricata.TypeAlert && sameFlow(ev, benign) {
			t.Errorf("benign flow raised an alert: %s", ev)
		}
	}
	if flows[benign].Alerted || !flows[attack].Alerted {
		t.Errorf("flow records: benign alerted %v, attack alerted %v; want false, true", flows[benign].Alerted, flows[attack].Alerted)
	}
	if flows[attack].PktsToServer == 0 || flows[attack].PktsToClient == 0 {
		t.Errorf("attack flow record %+v: want packets both ways (the copy path carries both directions)", *flows[attack])
	}
	// The counters are published once a second: poll until they show the alert.
	var st suricata.CaptureStats
	var err error
	if !testenv.Eventually(5*time.Second, func() bool {
		st, err = m.Stats(context.Background())
		return err == nil && st.Alerts == 1
	}) {
		t.Fatalf("capture counters %+v (%v): want the alert counted", st, err)
	}
	if st.KernelPackets < flows[attack].PktsToServer+flows[attack].PktsToClient || st.KernelDrops != 0 {
		t.Errorf("capture counters %+v: want at least the attack flow's packets and no drops", st)
	}
	t.Logf("capture counters %+v", st)
}

// ipsPath builds the layer-2 path of an AF_PACKET IPS monitor: a client namespace (a,
// 198.18.<net>.1/24) and a server namespace (b, .2) each with a veth to the monitor's
// namespace (m: interfaces in and out), and no other link between them. Suricata copies
// frames as it captured them, and a veth sender's checksum offload leaves the TCP
// checksum to be completed later, which nobody does on that copy: the senders compute
// their checksums themselves (docs/taps.md, "Checksums on the IPS path").
func ipsPath(t *testing.T, prefix string, net int) (a, b, m, in, out string) {
	t.Helper()
	a, b, m, sfx := namespaces(t, prefix)
	in, out = "ri"+sfx, "ro"+sfx
	vethPair(t, a, "ra"+sfx, m, in, fmt.Sprintf("198.18.%d.1/24", net))
	vethPair(t, b, "rb"+sfx, m, out, fmt.Sprintf("198.18.%d.2/24", net))
	sh(t, a, "ethtool", "-K", "ra"+sfx, "tx", "off")
	sh(t, b, "ethtool", "-K", "rb"+sfx, "tx", "off")
	return a, b, m, in, out
}

// inlineAttack checks an inline monitor running attackRule's drop rule between the
// client namespace and server: a benign exchange passes (retried while the path comes
// up), the attack's payload does not reach the server and its client gets no echo, the
// alert says blocked on the attack's 5-tuple, and the benign flow raised none. It returns
// the alert and the events read up to it.
func inlineAttack(t *testing.T, m *suricata.Monitor, client string, srv *recordingServer, server netip.AddrPort) (suricata.FiveTuple, suricata.Event, []suricata.Event) {
	t.Helper()
	var benign suricata.FiveTuple
	if !testenv.Eventually(5*time.Second, func() bool {
		var ok bool
		benign, ok = exchange(t, client, server, "hello from a benign client", time.Second)
		return ok
	}) {
		t.Fatal("benign traffic does not pass through the inline monitor")
	}
	attack, ok := exchange(t, client, server, "GET rampart-attack", 2*time.Second)
	if ok {
		t.Fatalf("attack exchange %s got its echo: the drop rule did not stop it", attack)
	}
	if srv.received("rampart-attack") {
		t.Fatal("the server received the attack payload")
	}
	alert, seen := waitEvent(t, m, 10*time.Second, "alert on the attack", func(ev suricata.Event) bool {
		return ev.Type == suricata.TypeAlert
	})
	if alert.Tuple != attack || alert.Alert.SignatureID != 1000001 || alert.Alert.Action != suricata.Blocked {
		t.Errorf("alert %s, want sid 1000001 blocked on %s", alert, attack)
	}
	for _, ev := range seen {
		if ev.Type == suricata.TypeAlert && sameFlow(ev, benign) {
			t.Errorf("benign flow raised an alert: %s", ev)
		}
	}
	return attack, alert, seen
}

// An inline (AF_PACKET IPS) monitor between a client and a server, at layer 2: nothing
// passes while it is not running, benign traffic passes through it, and the connection
// that carries the attack payload is stopped before the payload reaches the server, with
// alert and drop records naming that connection.
func TestIPSDrop(t *testing.T) {
	requireSuricata(t)
	nsA, nsB, nsM, in, out := ipsPath(t, "rsi", 11)
	srv := serve(t, nsB, 5432)
	server := netip.MustParseAddrPort("198.18.11.2:5432")

	// The two sides share no link: without the monitor nothing passes.
	if testenv.Probe(nsA, server, "tcp", 500*time.Millisecond) {
		t.Fatal("the server answered with no monitor running: the test's topology is wrong")
	}

	m := startMonitor(t, suricata.Config{
		Mode: suricata.IPS, Netns: nsM, Interface: in, PeerInterface: out, Dir: t.TempDir(),
		Rules: []string{fmt.Sprintf(attackRule, "drop")},
	})
	attack, alert, seen := inlineAttack(t, m, nsA, srv, server)
	drop := alert
	for _, ev := range seen {
		if ev.Type == suricata.TypeDrop {
			drop = ev
		}
	}
	if drop.Type != suricata.TypeDrop {
		drop, _ = waitEvent(t, m, 10*time.Second, "drop record", func(ev suricata.Event) bool { return ev.Type == suricata.TypeDrop })
	}
	if !sameFlow(drop, attack) || drop.Drop.Len == 0 || drop.FlowID != alert.FlowID {
		t.Errorf("drop record %s (flow %d), want the attack's %s (flow %d)", drop, drop.FlowID, attack, alert.FlowID)
	}
	// Traffic after the attack still passes: the drop is the flow's, not the path's.
	if _, ok := exchange(t, nsA, server, "hello again", 2*time.Second); !ok {
		t.Error("benign traffic after the attack does not pass")
	}
	checkInlineCounters(t, m)

	// Fail closed: with the monitor gone, the path is gone.
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if testenv.Probe(nsA, server, "tcp", 500*time.Millisecond) {
		t.Error("traffic passes with the inline monitor stopped")
	}
}

// Start's errors say what failed: a missing interface names it and the namespace; a rule
// Suricata cannot load stops the start, with Suricata's own error.
func TestStartErrors(t *testing.T) {
	requireSuricata(t)
	sfx := testenv.Suffix(6)
	nsM := testenv.NewNetns(t, "rse-m-"+sfx)
	start := func(cfg suricata.Config) error {
		m, err := suricata.Start(context.Background(), cfg)
		if err == nil {
			m.Stop()
		}
		return err
	}
	err := start(suricata.Config{
		Mode: suricata.Passive, Netns: nsM, Interface: "nope" + sfx, Dir: t.TempDir(),
	})
	if err == nil || !strings.Contains(err.Error(), "interface nope"+sfx) || !strings.Contains(err.Error(), nsM) {
		t.Errorf("missing interface: got %v, want an error naming the interface and namespace", err)
	}
	sh(t, nsM, "ip", "link", "set", "lo", "up")
	err = start(suricata.Config{
		Mode: suricata.Passive, Netns: nsM, Interface: "lo", Dir: t.TempDir(),
		Rules: []string{`alert tcp any any -> any 5432 (msg:"broken"; contnet:"x"; sid:1;)`},
	})
	if err == nil || !strings.Contains(err.Error(), "exited while starting") || !strings.Contains(err.Error(), "unknown rule keyword 'contnet'") {
		t.Errorf("bad rule: got %v, want an error saying a rule failed, with Suricata's message", err)
	} else {
		t.Logf("bad rule: %v", err)
	}
	err = start(suricata.Config{
		Mode: suricata.IPS, Netns: nsM, Interface: "lo", PeerInterface: "lo", Dir: t.TempDir(),
	})
	if err == nil || !strings.Contains(err.Error(), "two distinct interfaces") {
		t.Errorf("IPS on one interface: got %v, want it refused", err)
	}
	// One Suricata per directory: a second start while the first runs is refused, and
	// the directory is free again once the first stopped.
	dir := t.TempDir()
	cfg := suricata.Config{Mode: suricata.Passive, Netns: nsM, Interface: "lo", Dir: dir}
	first, err := suricata.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Stop() })
	if err := start(cfg); err == nil || !strings.Contains(err.Error(), "a monitor already runs in "+dir) {
		t.Errorf("second monitor in one directory: got %v, want it refused", err)
	}
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := start(cfg); err != nil {
		t.Errorf("start after the first monitor stopped: %v", err)
	}
}

// An NFQUEUE monitor in a namespace that routes between client and server: netfilter
// queues every forwarded packet to Suricata, which accepts the benign connection and drops
// the attack's payload. With no Suricata on the queue the kernel drops what it queues, so
// the path fails closed before the start and after the stop.
func TestNFQueueDrop(t *testing.T) {
	requireSuricata(t)
	nsA, nsB, nsM, sfx := namespaces(t, "rsn")
	vethPair(t, nsA, "ra"+sfx, nsM, "ri"+sfx, "198.18.13.1/24")
	vethPair(t, nsB, "rb"+sfx, nsM, "ro"+sfx, "198.18.14.1/24")
	sh(t, nsM, "ip", "addr", "add", "198.18.13.254/24", "dev", "ri"+sfx)
	sh(t, nsM, "ip", "addr", "add", "198.18.14.254/24", "dev", "ro"+sfx)
	sh(t, nsA, "ip", "route", "add", "default", "via", "198.18.13.254")
	sh(t, nsB, "ip", "route", "add", "default", "via", "198.18.14.254")
	sh(t, nsM, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
	const queue = 7
	sh(t, nsM, "iptables", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", fmt.Sprint(queue))
	srv := serve(t, nsB, 5432)
	server := netip.MustParseAddrPort("198.18.14.1:5432")

	if testenv.Probe(nsA, server, "tcp", 500*time.Millisecond) {
		t.Fatal("the server answered with nothing on the queue: the path must fail closed")
	}
	m := startMonitor(t, suricata.Config{
		Mode: suricata.NFQueue, Netns: nsM, Queue: queue, Dir: t.TempDir(),
		Rules: []string{fmt.Sprintf(attackRule, "drop")},
	})
	inlineAttack(t, m, nsA, srv, server)
	checkInlineCounters(t, m)
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if testenv.Probe(nsA, server, "tcp", 500*time.Millisecond) {
		t.Error("traffic passes with the NFQUEUE monitor stopped")
	}
}

// checkInlineCounters waits until an inline monitor's counters (published once a second)
// show the alert, packets passed on and at least the attack's packet blocked.
func checkInlineCounters(t *testing.T, m *suricata.Monitor) {
	t.Helper()
	var st suricata.CaptureStats
	var err error
	if !testenv.Eventually(5*time.Second, func() bool {
		st, err = m.Stats(context.Background())
		return err == nil && st.Alerts >= 1 && st.Blocked >= 1 && st.Accepted > 0
	}) {
		t.Errorf("inline counters %+v (%v): want the alert, accepted and blocked packets", st, err)
		return
	}
	t.Logf("inline counters %+v", st)
}

// A monitor started from a goroutine whose thread then ends (one that changed namespaces
// and could not be given back) keeps running: the parent-death signal, which follows the
// forking thread, must not reach it.
func TestMonitorOutlivesStartingThread(t *testing.T) {
	requireSuricata(t)
	_, _, nsM, sfx := namespaces(t, "rst")
	vethPair(t, nsM, "rm"+sfx, nsM, "rn"+sfx, "")
	type result struct {
		m   *suricata.Monitor
		err error
	}
	started := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		m, err := suricata.Start(context.Background(), suricata.Config{Mode: suricata.Passive, Netns: nsM,
			Interface: "rm" + sfx, Dir: t.TempDir(), Rules: []string{fmt.Sprintf(attackRule, "alert")}})
		started <- result{m, err}
	}()
	r := <-started
	if r.err != nil {
		t.Fatal(r.err)
	}
	m := r.m
	t.Cleanup(func() { m.Stop() })
	// Without the fix Suricata receives SIGTERM within milliseconds of the thread's end.
	select {
	case <-m.Exited():
		t.Fatalf("suricata exited after the thread that started it ended: %v", m.Stop())
	case <-time.After(2 * time.Second):
	}
	if _, err := m.Stats(context.Background()); err != nil {
		t.Errorf("suricata does not answer after the starting thread ended: %v", err)
	}
}
