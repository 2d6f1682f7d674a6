package taps

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/cli"
	"github.com/rampartnet/rampart/internal/monitor/join"
	"github.com/rampartnet/rampart/internal/testenv"
)

// lockedBuffer is a command's output, written by the command and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runMonitor runs `rampart monitor run args... -o json` in-process as a user would, until
// the test stops it (Ctrl-C: its context ends) or ends. It returns the command's output
// and the stop, which waits for the command's end and returns its exit code.
func (s *shop) runMonitor(t *testing.T, args ...string) (stdout, stderr *lockedBuffer, stop func() int) {
	t.Helper()
	return runMonitorAt(t, s.e.Config.Socket, args...)
}

// runMonitorAt is runMonitor for the agent at socket.
func runMonitorAt(t *testing.T, socket string, args ...string) (stdout, stderr *lockedBuffer, stop func() int) {
	t.Helper()
	stdout, stderr = &lockedBuffer{}, &lockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	full := append([]string{"--socket", socket, "monitor", "run"}, args...)
	go func() {
		done <- cli.Run(ctx, append(full, "-o", "json"), cli.IO{In: strings.NewReader(""), Out: stdout, Err: stderr})
	}()
	var once sync.Once
	code := -1
	stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case code = <-done:
			case <-time.After(20 * time.Second):
				t.Errorf("monitor run did not end 20s after its interrupt\nstderr: %s", stderr)
			}
		})
		return code
	}
	t.Cleanup(func() { stop() })
	if !testenv.Eventually(30*time.Second, func() bool {
		select {
		case code = <-done:
			t.Fatalf("monitor run exited %d before it ran:\n%s", code, stderr)
		default:
		}
		return strings.Contains(stderr.String(), "running")
	}) {
		t.Fatalf("monitor run did not start:\n%s", stderr)
	}
	return stdout, stderr, stop
}

// waitAlert polls the joined alerts out until one with signature sid comes.
func waitAlert(t *testing.T, out *lockedBuffer, sid int) join.Alert {
	t.Helper()
	var found join.Alert
	ok := testenv.Eventually(20*time.Second, func() bool {
		for _, line := range strings.Split(out.String(), "\n") {
			var a join.Alert
			if json.Unmarshal([]byte(line), &a) == nil && a.Event == "alert" && a.SignatureID == sid {
				t.Logf("joined alert: %s", line)
				found = a
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no joined alert for signature %d; output:\n%s", sid, out)
	}
	return found
}

// checkJoined checks that a joined alert names the client's connection to web: both
// endpoints with their security identities, the tap contract at web, and Rampart's flow
// event of the connection, flagged tapped.
func (s *shop) checkJoined(t *testing.T, a join.Alert, contract, action string) {
	t.Helper()
	if a.Monitor != "sec/ids" || a.Protocol != "TCP" {
		t.Errorf("alert of monitor %q, protocol %q", a.Monitor, a.Protocol)
	}
	if a.Source.Endpoint != "shop/client" || a.Source.Identity != s.client.Identity || a.Source.IP != s.client.IP {
		t.Errorf("source %+v, want shop/client %s identity %d", a.Source, s.client.IP, s.client.Identity)
	}
	if a.Destination.Endpoint != "shop/web" || a.Destination.Identity != s.web.Identity || a.Destination.Port != webPort {
		t.Errorf("destination %+v, want shop/web:%d identity %d", a.Destination, webPort, s.web.Identity)
	}
	if !slices.Contains(a.Destination.Labels, "app=web") {
		t.Errorf("destination labels %v lack app=web", a.Destination.Labels)
	}
	want := join.ContractRef{Name: contract, Action: action, Endpoint: "shop/web", Direction: "ingress"}
	if !slices.Contains(a.Contracts, want) || len(a.Contracts) != 1 {
		t.Errorf("contracts %+v, want %+v", a.Contracts, want)
	}
	if a.Flow == nil {
		t.Fatal("no Rampart flow event joined")
	}
	if !slices.Contains(a.Flow.Flags, "tapped") || a.Flow.Time.IsZero() || a.Flow.Time.After(a.Time.Add(time.Second)) {
		t.Errorf("flow %+v: want the tapped flow event, before the alert at %s", a.Flow, a.Time)
	}
}

// monitor run with a passive Suricata behind a mirror tap: the attack's alert is printed
// joined to the client and web endpoints, their identities, the mirror contract and the
// tapped flow; monitor alerts reads the same from the monitor's directory afterwards, and
// an interrupt stops Suricata.
func TestMonitorRunMirrorAlertsJoined(t *testing.T) {
	s := newShop(t)
	rule := fmt.Sprintf(`alert tcp any any -> any %d (msg:"%s"; flow:to_server,established; content:"%s"; sid:1000011; rev:1;)`, webPort, attack, attack)
	out, errOut, stop := s.runMonitor(t, "sec/ids", "--mode", "passive", "--rule", rule)
	s.e.MustCLI(addWebTap("web-mirror", "mirror")...)
	if got, err := s.post(t, "buy "+attack, 5*time.Second); err != nil || got != "ok" {
		t.Fatalf("request through the mirror: %q, %v", got, err)
	}
	a := waitAlert(t, out, 1000011)
	s.checkJoined(t, a, "web-mirror", "mirror")
	if a.Action != "allowed" || a.Signature != attack {
		t.Errorf("alert %+v: want allowed %q", a, attack)
	}

	// Later, from the monitor's directory: the same alert, as text.
	text := s.e.MustCLI("monitor", "alerts", "sec/ids")
	t.Logf("monitor alerts sec/ids:\n%s", text)
	for _, want := range []string{`alert allowed [1:1000011:1] "` + attack + `"`,
		fmt.Sprintf("shop/client (id %d) -> shop/web (id %d) TCP", s.client.Identity, s.web.Identity),
		"contract=web-mirror (mirror, ingress at shop/web)", "flow tapped"} {
		if !strings.Contains(text, want) {
			t.Errorf("monitor alerts lacks %q:\n%s", want, text)
		}
	}
	if code := stop(); code != 0 {
		t.Errorf("monitor run exited %d after its interrupt:\n%s", code, errOut)
	}
	if !strings.Contains(errOut.String(), "stopped") {
		t.Errorf("monitor run did not report its stop:\n%s", errOut)
	}
}

// monitor run inline behind a redirect tap: the attack is dropped in the monitor, and the
// blocking alert is joined to the endpoints, identities, the redirect contract and the
// tapped flow; with the command stopped, redirected traffic stops (fail closed).
func TestMonitorRunInlineBlockJoined(t *testing.T) {
	s := newShop(t)
	rule := fmt.Sprintf(`drop tcp any any -> any %d (msg:"%s"; flow:to_server,established; content:"%s"; sid:1000012; rev:1;)`, webPort, attack, attack)
	out, _, stop := s.runMonitor(t, "sec/ids", "--mode", "inline", "--rule", rule)
	s.e.MustCLI(addWebTap("web-inline", "redirect")...)
	if got, err := s.post(t, "hello", 5*time.Second); err != nil || got != "ok" {
		t.Fatalf("benign request through the inline monitor: %q, %v", got, err)
	}
	if got, err := s.post(t, "buy "+attack, 3*time.Second); err == nil {
		t.Fatalf("the attack passed the inline monitor: %q", got)
	}
	a := waitAlert(t, out, 1000012)
	s.checkJoined(t, a, "web-inline", "redirect")
	if a.Action != "blocked" {
		t.Errorf("alert action %q, want blocked", a.Action)
	}
	if code := stop(); code != 0 {
		t.Errorf("monitor run exited %d after its interrupt", code)
	}
	if got, err := s.post(t, "hello", 2*time.Second); err == nil {
		t.Fatalf("a request passed with monitor run stopped: %q", got)
	}
}

// monitor run refuses an endpoint that is not a monitor, and an unknown mode.
func TestMonitorRunRefuses(t *testing.T) {
	s := newShop(t)
	if _, errs, code := s.e.CLI("monitor", "run", "shop/web", "--mode", "passive"); code == 0 || !strings.Contains(errs, "not a monitor") {
		t.Errorf("a non-monitor endpoint: exit %d, %s", code, errs)
	}
	if _, errs, code := s.e.CLI("monitor", "run", "sec/ids", "--mode", "tap"); code == 0 || !strings.Contains(errs, "want passive or inline") {
		t.Errorf("an unknown mode: exit %d, %s", code, errs)
	}
}

// A Lua rule keeps state across flows: the script remembers the first user a rental names
// and alerts when a later connection names another. monitor run --lua-allow loads it, and
// the one capture thread gives the script both connections.
func TestMonitorRunLuaAcrossFlows(t *testing.T) {
	s := newShop(t)
	dir := t.TempDir()
	script := `function init(args)
  local needs = {}
  needs["payload"] = tostring(true)
  return needs
end
local first = nil
function match(args)
  local user = string.match(tostring(args["payload"]), "user=(%a+)")
  if user == nil then return 0 end
  if first == nil then
    first = user
    return 0
  end
  if user ~= first then return 1 end
  return 0
end
`
	rules := fmt.Sprintf(`alert tcp any any -> any %d (msg:"one rental, two users"; flow:to_server,established; content:"user="; lua:rental.lua; sid:1000013; rev:1;)`, webPort)
	lua, ruleFile := dir+"/rental.lua", dir+"/rental.rules"
	for p, body := range map[string]string{lua: script, ruleFile: rules + "\n"} {
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, errs, code := s.e.CLI("monitor", "run", "sec/ids", "--mode", "passive", "--rules", ruleFile, "--lua", lua); code == 0 || !strings.Contains(errs, "--lua-allow") {
		t.Fatalf("a Lua script without --lua-allow: exit %d, %s", code, errs)
	}
	out, _, _ := s.runMonitor(t, "sec/ids", "--mode", "passive", "--lua-allow", "--lua", lua, "--rules", ruleFile)
	s.e.MustCLI(addWebTap("web-mirror", "mirror")...)
	for _, body := range []string{"rental 7 user=alice", "rental 7 user=alice", "rental 7 user=bob"} {
		if got, err := s.post(t, body, 5*time.Second); err != nil || got != "ok" {
			t.Fatalf("request %q: %q, %v", body, got, err)
		}
	}
	a := waitAlert(t, out, 1000013)
	s.checkJoined(t, a, "web-mirror", "mirror")
	if n := strings.Count(out.String(), `"signatureID":1000013`); n != 1 {
		t.Errorf("%d alerts for the rental, want 1 (the third connection's):\n%s", n, out)
	}
}

// What monitor run writes in the agent's state directory (the monitor's configuration,
// rules, Lua scripts, logs and EVE file under monitors/NS/NAME) is the instance's: its
// uninstall removes it, and with it the state directory.
func TestUninstallRemovesMonitorFiles(t *testing.T) {
	s := newShop(t)
	lua := writeFile(t, "rental.lua", "function init(args)\n  return {payload = tostring(true)}\nend\nfunction match(args)\n  return 0\nend\n")
	rule := fmt.Sprintf(`alert tcp any any -> any %d (msg:"seen"; flow:to_server,established; content:"x"; lua:rental.lua; sid:1000014; rev:1;)`, webPort)
	_, _, stop := s.runMonitor(t, "sec/ids", "--mode", "passive", "--lua-allow", "--lua", lua, "--rule", rule)
	if code := stop(); code != 0 {
		t.Fatalf("monitor run exited %d after its interrupt", code)
	}
	stateDir := s.e.Config.StateDir
	monDir := filepath.Join(stateDir, "monitors", "sec", "ids")
	for _, f := range []string{"suricata.yaml", "eve.json", "rental.lua"} {
		if _, err := os.Stat(filepath.Join(monDir, f)); err != nil {
			t.Fatalf("monitor run did not write %s in %s: %v", f, monDir, err)
		}
	}
	if err := s.e.Uninstall(); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	if _, err := os.Stat(stateDir); !errors.Is(err, os.ErrNotExist) {
		var left []string
		filepath.WalkDir(stateDir, func(p string, _ os.DirEntry, _ error) error {
			left = append(left, p)
			return nil
		})
		t.Errorf("uninstall kept the state directory (%v): %v", err, left)
	}
}

// A mirror contract whose source is both ends of a connection (a selector that matches
// the client and web) copies each packet once, not once as it leaves the client and again
// as it enters web: one marked request raises one alert, printed once by monitor run and
// written once to the monitor's EVE file.
func TestMirrorOfBothEndsAlertsOnce(t *testing.T) {
	s := newShop(t)
	rule := fmt.Sprintf(`alert tcp any any -> any %d (msg:"%s"; flow:to_server,established; content:"%s"; sid:1000015; rev:1;)`, webPort, attack, attack)
	out, _, stop := s.runMonitor(t, "sec/ids", "--mode", "passive", "--rule", rule)
	s.e.MustCLI("tap", "add", "shop-mirror", "--selector", "io.kubernetes.pod.namespace=shop", "--monitor", "sec/ids",
		"--action", "mirror", "--protocol", "TCP")
	if got, err := s.post(t, "buy "+attack, 5*time.Second); err != nil || got != "ok" {
		t.Fatalf("request through the mirror: %q, %v", got, err)
	}
	waitAlert(t, out, 1000015)
	// Suricata flushes what it holds as it stops: every alert it will raise is out then.
	if code := stop(); code != 0 {
		t.Fatalf("monitor run exited %d after its interrupt", code)
	}
	if n := strings.Count(out.String(), `"signatureID":1000015`); n != 1 {
		t.Errorf("monitor run printed %d alerts for one marked request, want 1:\n%s", n, out)
	}
	eve, err := os.ReadFile(filepath.Join(s.e.Config.StateDir, "monitors", "sec", "ids", "eve.json"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(eve), `"signature_id":1000015`); n != 1 {
		t.Errorf("eve.json holds %d alerts for one marked request, want 1", n)
	}
	if tp := s.tap(t, "shop-mirror"); tp.Counters.MirroredPackets == 0 {
		t.Errorf("counters %+v: no copies", tp.Counters)
	}
}
