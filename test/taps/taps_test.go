package taps

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/monitor/suricata"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

const webPort = 8080

// addWebTap is the command line that adds tap contract name, with action mirror or
// redirect, of shop/web's TCP webPort to the monitor sec/ids.
func addWebTap(name, action string) []string {
	return []string{"tap", "add", name, "--endpoint", "shop/web", "--monitor", "sec/ids", "--action", action,
		"--protocol", "TCP", "--port", fmt.Sprint(webPort)}
}

// attack is what the monitors' rules look for in a request.
const attack = "rampart-attack"

// shop is an agent with a web server (shop/web, app=web, HTTP on 8080 answering "ok"), a
// client (shop/client) and a monitor endpoint (sec/ids) with its receive and return
// interfaces.
type shop struct {
	e                *agenttest.Env
	web, client, ids api.Endpoint
}

func newShop(t *testing.T) *shop {
	return newShopOf(t, agenttest.Options{NoServers: true})
}

// newShopOf is newShop on an agent started with opts.
func newShopOf(t *testing.T, opts agenttest.Options) *shop {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("suricata"); err != nil {
		testenv.SkipOrFail(t, "suricata not installed (scripts/install-suricata.sh): %v", err)
	}
	e := agenttest.StartAgent(t, opts)
	s := &shop{e: e}
	s.web = e.AddEndpoint("shop", "web", map[string]string{"app": "web"})
	s.client = e.AddEndpoint("shop", "client", map[string]string{"app": "client"})
	s.ids = e.AddEndpoint("sec", "ids", nil, "--monitor")
	e.ServeHTTP("shop/web", webPort, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	}))
	return s
}

// post sends body to the web server from the client on a connection of its own, and
// returns the answer's body, or the error.
func (s *shop) post(t *testing.T, body string, timeout time.Duration) (string, error) {
	t.Helper()
	return s.postTo(t, s.web.IP, body, timeout)
}

// postTo is post to web's address ip (IPv4 or IPv6).
func (s *shop) postTo(t *testing.T, ip, body string, timeout time.Duration) (string, error) {
	t.Helper()
	c := s.e.HTTPClient("shop/client", timeout)
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://"+net.JoinHostPort(ip, fmt.Sprint(webPort))+"/", "text/plain", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// monitor starts Suricata in the monitor endpoint with rules.
func (s *shop) monitor(t *testing.T, mode suricata.Mode, rules ...string) *suricata.Monitor {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := suricata.Start(ctx, suricata.Config{Mode: mode, Netns: s.ids.Netns, Interface: "tap-rx", PeerInterface: "tap-tx",
		Dir: t.TempDir(), Rules: rules})
	if err != nil {
		t.Fatalf("starting Suricata (%s): %v", mode, err)
	}
	t.Cleanup(func() { m.Stop() })
	if err := s.e.Client.WaitMonitorReading(ctx, s.ids.Key()); err != nil {
		t.Fatal(err)
	}
	return m
}

func (s *shop) tap(t *testing.T, name string) api.Tap {
	t.Helper()
	var tp api.Tap
	if err := json.Unmarshal([]byte(s.e.MustCLI("tap", "get", name, "-o", "json")), &tp); err != nil {
		t.Fatal(err)
	}
	return tp
}

// A mirror tap copies web's HTTP connections to a passive Suricata: the attack raises an
// alert naming the client's connection to web, every request is answered as without the
// tap, and the contract counts the copies.
func TestMirrorToSuricata(t *testing.T) {
	s := newShop(t)
	m := s.monitor(t, suricata.Passive,
		fmt.Sprintf(`alert tcp any any -> any %d (msg:"%s"; flow:to_server,established; content:"%s"; sid:1000001; rev:1;)`, webPort, attack, attack))
	s.e.MustCLI(addWebTap("web-mirror", "mirror")...)

	for _, body := range []string{"hello", "buy " + attack} {
		if got, err := s.post(t, body, 5*time.Second); err != nil || got != "ok" {
			t.Fatalf("request %q through the mirror: %q, %v", body, got, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ev, _, err := m.WaitEvent(ctx, func(e suricata.Event) bool { return e.Alert != nil && e.Alert.SignatureID == 1000001 })
	if err != nil {
		t.Fatalf("no alert for the attack: %v", err)
	}
	if ev.Tuple.Src.Addr().String() != s.client.IP || ev.Tuple.Dst.Addr().String() != s.web.IP || ev.Tuple.Dst.Port() != webPort {
		t.Errorf("alert on %s, want %s -> %s:%d", ev.Tuple, s.client.IP, s.web.IP, webPort)
	}
	tp := s.tap(t, "web-mirror")
	if tp.Counters.MirroredPackets == 0 || tp.Counters.RedirectedPackets != 0 {
		t.Errorf("counters %+v: want copies, no redirects", tp.Counters)
	}
}

// A redirect tap sends web's connections through Suricata inline (AF_PACKET IPS between
// the monitor's two interfaces): benign requests are answered, the attack is dropped in
// the monitor (no answer, a drop in its EVE log), and with the monitor stopped nothing
// passes (fail closed) until it runs again.
func TestRedirectThroughSuricata(t *testing.T) {
	s := newShop(t)
	rule := fmt.Sprintf(`drop tcp any any -> any %d (msg:"%s"; flow:to_server,established; content:"%s"; sid:1000002; rev:1;)`, webPort, attack, attack)
	m := s.monitor(t, suricata.IPS, rule)
	s.e.MustCLI(addWebTap("web-inline", "redirect")...)

	if got, err := s.post(t, "hello", 5*time.Second); err != nil || got != "ok" {
		t.Fatalf("benign request through the monitor: %q, %v", got, err)
	}
	if got, err := s.post(t, "buy "+attack, 3*time.Second); err == nil {
		t.Fatalf("the attack passed the inline monitor: %q", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := m.WaitEvent(ctx, func(e suricata.Event) bool {
		return e.Alert != nil && e.Alert.SignatureID == 1000002 && e.Alert.Action == suricata.Blocked
	}); err != nil {
		t.Fatalf("no blocking alert in the monitor's log: %v", err)
	}
	tp := s.tap(t, "web-inline")
	if tp.Counters.RedirectedPackets == 0 {
		t.Errorf("counters %+v: nothing redirected", tp.Counters)
	}

	// The monitor dies: the redirected traffic stops with it.
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if got, err := s.post(t, "hello", 2*time.Second); err == nil {
		t.Fatalf("a request passed while its inline monitor was stopped: %q", got)
	}
	s.monitor(t, suricata.IPS, rule)
	if !testenv.Eventually(10*time.Second, func() bool {
		got, err := s.post(t, "hello", 2*time.Second)
		return err == nil && got == "ok"
	}) {
		t.Fatal("requests do not pass again once the monitor runs")
	}
}

// Policy applies before a tap: a client the policy denies reaches neither the monitor
// nor web, and the one it admits goes through the monitor.
func TestRedirectKeepsPolicy(t *testing.T) {
	s := newShop(t)
	other := s.e.AddEndpoint("shop", "other", map[string]string{"app": "other"})
	m := s.monitor(t, suricata.IPS, fmt.Sprintf(`alert tcp any any -> any %d (msg:"seen"; flow:to_server,established; content:"POST"; sid:1000003; rev:1;)`, webPort))
	policy := writeFile(t, "web.yaml", fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web, namespace: shop}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "%d", protocol: TCP}]}]
`, webPort))
	s.e.MustCLI("apply", "-f", policy)
	s.e.MustCLI("tap", "add", "web-inline", "--endpoint", "shop/web", "--monitor", "sec/ids", "--action", "redirect")
	if got, err := s.post(t, "hello", 5*time.Second); err != nil || got != "ok" {
		t.Fatalf("admitted client through the monitor: %q, %v", got, err)
	}
	if s.e.Probe("shop/other", s.e.IP("shop/web"), webPort, "tcp", time.Second) {
		t.Fatal("a client the policy denies reached web through the tap")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := m.WaitEvent(ctx, func(e suricata.Event) bool { return e.Alert != nil && e.Alert.SignatureID == 1000003 }); err != nil {
		t.Fatalf("the admitted request did not go through the monitor: %v", err)
	}
	events, err := m.Events()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if e.Tuple.Src.Addr().String() == other.IP || e.Tuple.Dst.Addr().String() == other.IP {
			t.Errorf("the monitor saw traffic of the denied client: %s", e)
		}
	}
}

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := t.TempDir() + "/" + name
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
