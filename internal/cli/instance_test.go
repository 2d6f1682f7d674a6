package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/cli"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// rampart runs the CLI in-process with exactly args.
func rampart(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := cli.Run(context.Background(), args, cli.IO{In: strings.NewReader(""), Out: &out, Err: &errb})
	return out.String(), errb.String(), code
}

// TestInstancesHaveTheirOwnSockets: two agents of different instances run side by side,
// each on its default socket, and the CLI reaches each by --instance (or
// RAMPART_INSTANCE); --socket still wins.
func TestInstancesHaveTheirOwnSockets(t *testing.T) {
	one := agenttest.StartAgent(t, agenttest.Options{NoServers: true, DefaultSocket: true})
	two := agenttest.StartAgent(t, agenttest.Options{NoServers: true, DefaultSocket: true, PodCIDR: one.Config.PodCIDR})
	for _, e := range []*agenttest.Env{one, two} {
		if want := "/run/rampart/" + e.Config.Instance + ".sock"; e.Socket() != want {
			t.Fatalf("instance %s listens on %s, want %s", e.Config.Instance, e.Socket(), want)
		}
	}
	one.MustCLI("endpoint", "add", "x/one")
	two.MustCLI("endpoint", "add", "x/two")

	endpoints := func(args ...string) string {
		t.Helper()
		out, errs, code := rampart(append(args, "endpoint", "list", "-o", "json")...)
		if code != 0 {
			t.Fatalf("rampart %v: exit %d: %s", args, code, errs)
		}
		var eps []api.Endpoint
		if err := json.Unmarshal([]byte(out), &eps); err != nil {
			t.Fatalf("rampart %v: %v\n%s", args, err, out)
		}
		var names []string
		for _, e := range eps {
			names = append(names, e.Namespace+"/"+e.Name)
		}
		return strings.Join(names, " ")
	}
	if got := endpoints("--instance", one.Config.Instance); got != "x/one" {
		t.Errorf("--instance %s lists %q, want x/one", one.Config.Instance, got)
	}
	if got := endpoints("--instance", two.Config.Instance); got != "x/two" {
		t.Errorf("--instance %s lists %q, want x/two", two.Config.Instance, got)
	}
	t.Setenv("RAMPART_INSTANCE", two.Config.Instance)
	if got := endpoints(); got != "x/two" {
		t.Errorf("RAMPART_INSTANCE=%s lists %q, want x/two", two.Config.Instance, got)
	}
	if got := endpoints("--instance", one.Config.Instance); got != "x/one" {
		t.Errorf("--instance over RAMPART_INSTANCE lists %q, want x/one", got)
	}
	if got := endpoints("--instance", two.Config.Instance, "--socket", one.Socket()); got != "x/one" {
		t.Errorf("--socket over --instance lists %q, want x/one", got)
	}

	// rampart version names the CLI's build and the agent's.
	out, errs, code := rampart("--instance", one.Config.Instance, "version")
	if code != 0 {
		t.Fatalf("rampart version: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "rampart ") || !strings.HasSuffix(lines[0], runtime.Version()) ||
		!strings.HasPrefix(lines[1], "agent: rampartd ") || !strings.Contains(lines[1], runtime.Version()) ||
		!strings.Contains(lines[1], "instance "+one.Config.Instance+" at "+one.Socket()) {
		t.Errorf("rampart version:\n%s\nwant the CLI's version and go version, then the agent's with its instance and socket", out)
	}
}

// TestInstanceFlagChecked: an instance name that could leave /run/rampart is refused, and
// version with no agent still prints the CLI's version and says none answers.
func TestInstanceFlagChecked(t *testing.T) {
	for _, bad := range []string{"../etc", "a/b", "A", ""} {
		_, errs, code := rampart("--instance", bad, "status")
		if code == 0 || !strings.Contains(errs, "instance name") {
			t.Errorf("--instance %q: exit %d, %q; want a refusal naming the instance", bad, code, errs)
		}
	}
	out, errs, code := rampart("--socket", "/nonexistent/r.sock", "version")
	if code != 0 || !strings.HasPrefix(out, "rampart ") || !strings.Contains(out, "agent: none answers at /nonexistent/r.sock") {
		t.Errorf("rampart version with no agent: exit %d\n%s%s", code, out, errs)
	}
}

// rampart version -o json: the CLI's build, and the agent's answer or why none came.
func TestVersionJSON(t *testing.T) {
	out, errs, code := rampart("--socket", "/nonexistent/r.sock", "version", "-o", "json")
	var v struct {
		Client struct {
			Version   string `json:"version"`
			GoVersion string `json:"goVersion"`
		} `json:"client"`
		Agent struct {
			Socket   string `json:"socket"`
			Answered bool   `json:"answered"`
			Error    string `json:"error"`
		} `json:"agent"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("version -o json: exit %d, %s%s", code, out, errs)
	}
	if v.Client.Version == "" || v.Client.GoVersion != runtime.Version() || v.Agent.Socket != "/nonexistent/r.sock" || v.Agent.Answered || v.Agent.Error == "" {
		t.Errorf("version -o json without an agent: %+v", v)
	}
	if _, errs, code := rampart("version", "-o", "yaml"); code == 0 || !strings.Contains(errs, `"yaml"`) {
		t.Errorf("version -o yaml: exit %d, %s", code, errs)
	}
}
