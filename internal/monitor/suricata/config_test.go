package suricata

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/testenv"
)

func rendered(t *testing.T, c Config) map[string]any {
	t.Helper()
	b, err := c.Rendered()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), "%YAML 1.1\n---\n") {
		t.Fatalf("no YAML 1.1 header: Suricata refuses the file without it:\n%s", b)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	return m
}

func get(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[p]
	}
	return v
}

// Each mode's configuration sets what the mode depends on: the capture interfaces and copy
// mode, stream inspection as packets arrive, the pgsql parser (off in Suricata's own
// defaults), no checksum checks, fail-closed NFQUEUE, and every path in the monitor's
// directory.
func TestRenderedModes(t *testing.T) {
	dir := "/run/rampart/mon-x"
	p := rendered(t, Config{Mode: Passive, Interface: "tap0", Dir: dir, RuleFiles: []string{"/etc/extra.rules"}})
	afp := p["af-packet"].([]any)
	if len(afp) != 1 || get(afp[0].(map[string]any), "interface") != "tap0" || get(afp[0].(map[string]any), "copy-mode") != nil {
		t.Errorf("passive af-packet: %v", afp)
	}
	if get(p, "stream", "inline") != "yes" || get(p, "stream", "checksum-validation") != false ||
		get(p, "capture", "checksum-validation") != "none" {
		t.Errorf("passive stream/capture: %v %v", p["stream"], p["capture"])
	}
	if get(p, "app-layer", "protocols", "pgsql", "enabled") != true || get(p, "app-layer", "protocols", "http", "enabled") != true {
		t.Errorf("app-layer: %v", p["app-layer"])
	}
	if rf := p["rule-files"].([]any); len(rf) != 2 || rf[0] != dir+"/rampart.rules" || rf[1] != "/etc/extra.rules" {
		t.Errorf("rule-files: %v", rf)
	}
	for _, k := range []string{"default-log-dir", "classification-file", "reference-config-file", "threshold-file"} {
		if s, _ := p[k].(string); !strings.HasPrefix(s, dir) {
			t.Errorf("%s = %v, want a path in %s", k, p[k], dir)
		}
	}
	eve := p["outputs"].([]any)[0].(map[string]any)["eve-log"].(map[string]any)
	if eve["filename"] != dir+"/eve.json" || len(eve["types"].([]any)) != 6 {
		t.Errorf("eve-log: %v", eve)
	}
	if get(p, "flow-timeouts", "tcp", "closed") != 0 {
		t.Errorf("tcp closed timeout %v, want 0 (flows reported as they end)", get(p, "flow-timeouts", "tcp", "closed"))
	}

	ips := rendered(t, Config{Mode: IPS, Interface: "in0", PeerInterface: "out0", Dir: dir})
	afp = ips["af-packet"].([]any)
	a, b := afp[0].(map[string]any), afp[1].(map[string]any)
	if a["interface"] != "in0" || a["copy-iface"] != "out0" || a["copy-mode"] != "ips" ||
		b["interface"] != "out0" || b["copy-iface"] != "in0" || b["copy-mode"] != "ips" || a["cluster-id"] == b["cluster-id"] {
		t.Errorf("ips af-packet: %v", afp)
	}
	if a["defrag"] != false || get(ips, "stream", "inline") != "auto" {
		t.Errorf("ips: defrag %v, stream inline %v", a["defrag"], get(ips, "stream", "inline"))
	}

	nfq := rendered(t, Config{Mode: NFQueue, Queue: 7, Dir: dir})
	if get(nfq, "nfq", "fail-open") != false || nfq["af-packet"] != nil {
		t.Errorf("nfq: %v, af-packet %v", nfq["nfq"], nfq["af-packet"])
	}
	c := Config{Mode: NFQueue, Queue: 7, Dir: dir}
	if args := strings.Join(c.args(), " "); !strings.Contains(args, "-q 7") || !strings.Contains(args, "--init-errors-fatal") {
		t.Errorf("nfq args: %s", args)
	}
}

func TestConfigRefused(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Mode: IPS, Interface: "a", PeerInterface: "a", Dir: "/d"}, "two distinct interfaces"},
		{Config{Mode: IPS, Interface: "a", Dir: "/d"}, "two interfaces"},
		{Config{Mode: Passive, Dir: "/d"}, "needs an interface"},
		{Config{Mode: Passive, Interface: "a", Dir: "rel"}, "absolute path"},
		{Config{Mode: Passive, Interface: "a", Dir: "/d", RuleFiles: []string{"x.rules"}}, "rule file"},
		{Config{Mode: Passive, Interface: "a", Dir: "/d", Rules: []string{"alert ip any any -> any any (sid:1;)\nalert"}}, "one rule per line"},
		{Config{Mode: Mode(9), Dir: "/d"}, "unknown mode"},
		{Config{Mode: Passive, Interface: "a", Dir: "/d", LuaScripts: []string{"/s/x.lua"}}, "not allowed"},
		{Config{Mode: Passive, Interface: "a", Dir: "/d", LuaRules: true, LuaScripts: []string{"x.lua"}}, "absolute path"},
		{Config{Mode: Passive, Interface: "a", Dir: "/d", LuaRules: true, LuaScripts: []string{"/s/eve.json"}}, "monitor's own files"},
	} {
		if _, err := c.cfg.Rendered(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want an error with %q", c.cfg, err, c.want)
		}
	}
}

// Suricata itself accepts each mode's configuration and rules (suricata -T: the
// configuration test, which loads everything but captures nothing).
func TestSuricataAcceptsConfig(t *testing.T) {
	bin, err := Binary("")
	if err != nil {
		testenv.SkipOrFail(t, "%v", err)
	}
	for _, c := range []Config{
		{Mode: Passive, Interface: "lo"},
		{Mode: IPS, Interface: "in0", PeerInterface: "out0"},
		{Mode: NFQueue, Queue: 3},
	} {
		c.Dir = filepath.Join(t.TempDir(), "mon")
		c.Rules = []string{`drop pgsql any any -> any any (msg:"no query on users"; flow:to_server; content:"select"; nocase; sid:7;)`}
		if err := writeFiles(&c); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"-T"}, c.args()...)
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			log, _ := os.ReadFile(filepath.Join(c.Dir, logName))
			t.Errorf("%s mode: suricata -T: %v\n%s%s", c.Mode, err, out, log)
		}
	}
}

// A missing executable is ErrNotInstalled (tests turn it into a skip, or a failure under
// CI=true); the installed one is Suricata 7, which the pgsql parser needs.
func TestBinaryAndVersion(t *testing.T) {
	if _, err := Binary("rampart-no-such-suricata"); !errors.Is(err, ErrNotInstalled) {
		t.Errorf("missing binary: got %v, want ErrNotInstalled", err)
	}
	if _, err := Binary(""); err != nil {
		testenv.SkipOrFail(t, "%v", err)
	}
	v, err := Version("")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v, "7.") {
		t.Errorf("suricata %s, want 7.x (scripts/install-suricata.sh)", v)
	}
	t.Logf("suricata %s", v)
}

// Suricata 7 loads a Lua rule only when the configuration allows Lua rules: without
// LuaRules the start fails naming the rule, with it the rule loads, its script found beside
// the monitor's directory, where the configuration copies it. More than one thread with Lua rules is refused.
func TestLuaRules(t *testing.T) {
	bin, err := Binary("")
	if err != nil {
		testenv.SkipOrFail(t, "%v", err)
	}
	if _, err := (&Config{Mode: Passive, Interface: "a", Dir: "/d", LuaRules: true, Threads: 2}).Rendered(); err == nil || !strings.Contains(err.Error(), "Lua") {
		t.Errorf("two threads with Lua rules: got %v, want a refusal", err)
	}
	rules := t.TempDir()
	script := `function init(args)
  local needs = {}
  needs["payload"] = tostring(true)
  return needs
end
function match(args)
  return 0
end
`
	if err := os.WriteFile(filepath.Join(rules, "check.lua"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	ruleFile := filepath.Join(rules, "lua.rules")
	if err := os.WriteFile(ruleFile, []byte(`alert tcp any any -> any any (msg:"lua"; lua:check.lua; sid:9;)`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, allow := range []bool{false, true} {
		c := Config{Mode: Passive, Interface: "lo", Dir: filepath.Join(t.TempDir(), "mon"), RuleFiles: []string{ruleFile}, LuaRules: allow}
		if allow {
			c.LuaScripts = []string{filepath.Join(rules, "check.lua")}
		}
		if get(rendered(t, c), "security", "lua", "allow-rules") != (map[bool]any{true: true, false: nil})[allow] {
			t.Errorf("allow %v: security section %v", allow, get(rendered(t, c), "security"))
		}
		if err := writeFiles(&c); err != nil {
			t.Fatal(err)
		}
		if !allow { // the script is there: only the setting is missing
			if err := os.WriteFile(filepath.Join(c.Dir, "check.lua"), []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		out, err := exec.Command(bin, append([]string{"-T"}, c.args()...)...).CombinedOutput()
		log, _ := os.ReadFile(filepath.Join(c.Dir, logName))
		if allow && err != nil {
			t.Errorf("Lua rules allowed: suricata -T: %v\n%s%s", err, out, log)
		}
		if !allow && err == nil {
			t.Errorf("Lua rules not allowed: suricata -T accepted the Lua rule\n%s", log)
		}
		if !allow && !bytes.Contains(log, []byte("security.lua.allow-rules")) {
			t.Errorf("Lua rules not allowed: the refusal does not name security.lua.allow-rules:\n%s", log)
		}
	}
}
