package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/tappolicy"
)

// fakePolicyAgent compiles tap policies with the real compiler over fixed facts and keeps
// the one applied, so the commands are checked end to end through the API.
type fakePolicyAgent struct {
	api.Service
	mu      sync.Mutex
	applied *api.TapPolicyRequest
}

func policyFacts() tappolicy.Facts {
	return tappolicy.Facts{
		Endpoints: []tappolicy.Endpoint{
			{Namespace: "dvd", Name: "db", Node: "local", Labels: map[string]string{"app": "db"}, Ports: []tappolicy.Port{{Protocol: "TCP", Port: 5432}}},
			{Namespace: "dvd", Name: "web", Node: "local", Labels: map[string]string{"app": "web"}, Exposed: true},
			{Namespace: "sec", Name: "pg", Node: "local", Monitor: &tappolicy.Monitor{Inspects: []string{"pgsql"}}},
		},
		Nodes: []tappolicy.Node{{Name: "local", Load: 3}},
	}
}

func (f *fakePolicyAgent) compile(req api.TapPolicyRequest) (api.TapPolicy, error) {
	res, err := tappolicy.Compile(req.File, []byte(req.Source), policyFacts())
	if err != nil {
		return api.TapPolicy{}, api.BadRequest("%v", err)
	}
	if _, err := res.TapContracts(req.File); err != nil {
		return api.TapPolicy{}, api.BadRequest("%v", err)
	}
	v := agent.TapPolicyView(req.File, res, req.Explain)
	if req.Facts {
		v.Facts, _ = policyFacts().Atoms()
	}
	return v, nil
}

func (f *fakePolicyAgent) CompileTapPolicy(_ context.Context, req api.TapPolicyRequest) (api.TapPolicy, error) {
	return f.compile(req)
}

func (f *fakePolicyAgent) ApplyTapPolicy(_ context.Context, req api.TapPolicyRequest) (api.ChangeResult, error) {
	if _, err := f.compile(req); err != nil {
		return api.ChangeResult{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = &req
	return api.ChangeResult{Changes: []api.PolicyChange{{Kind: "TapPolicy", Name: req.File, Action: "created"}}}, nil
}

func (f *fakePolicyAgent) GetTapPolicy(context.Context) (api.TapPolicy, error) {
	f.mu.Lock()
	req := f.applied
	f.mu.Unlock()
	if req == nil {
		return api.TapPolicy{}, api.NotFound("no tap policy")
	}
	v, err := f.compile(*req)
	v.Source, v.Error = req.Source, "facts changed: monitor gone"
	return v, err
}

func (f *fakePolicyAgent) DeleteTapPolicy(context.Context) (api.ChangeResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.applied == nil {
		return api.ChangeResult{}, api.NotFound("no tap policy")
	}
	file := f.applied.File
	f.applied = nil
	return api.ChangeResult{Changes: []api.PolicyChange{{Kind: "TapPolicy", Name: file, Action: "deleted"}}}, nil
}

const cliPolicy = `critical(S) :- label(S, "app", "db").
inspect(S, "pgsql", "both", "TCP", 5432, "redirect") :- critical(S).
inspect(S, "http", "ingress", "TCP", 80, "mirror") :- exposed(S).
`

func TestTapCompileCommand(t *testing.T) {
	f := &fakePolicyAgent{}
	file := filepath.Join(t.TempDir(), "taps.mg")
	os.WriteFile(file, []byte(cliPolicy), 0o644)
	out, errOut, code := runFake(t, f, "", "tap", "compile", "-f", file, "--explain", "--facts")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		`facts (`, `  port("dvd/db","TCP",5432).`,
		"tap policy taps.mg (placement per-node)",
		"redirect dvd/db both TCP port 5432 -> sec/pg (tap contracts tp-", "-in, tp-", "-out)",
		`placed: per-node: the least loaded of the monitors on node local that inspect "pgsql"`,
		"by rule at line 2: inspect(", `  critical("dvd/db"), derived:`, `by rule at line 1: critical(S) :- label(S,"app","db").`,
		`label("dvd/db","app","db")`,
		"1 request no monitor could take:",
		"      critical(\"dvd/db\"), derived:\n", `inspect("dvd/web","http"`, `no monitors on node local inspect "http"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tap compile lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, `critical("dvd/db")`); n != 1 {
		t.Errorf("the derived premise shown %d times, want once:\n%s", n, out)
	}
	// Without --explain: the contracts only. From stdin as well.
	out, _, code = runFake(t, f, cliPolicy, "tap", "compile", "-f", "-")
	if code != 0 || strings.Contains(out, "by rule") || !strings.Contains(out, "tap policy stdin") {
		t.Errorf("tap compile from stdin: %d\n%s", code, out)
	}
	// A policy the compiler refuses: its line in the error, exit non-zero.
	bad := filepath.Join(t.TempDir(), "bad.mg")
	os.WriteFile(bad, []byte("\ntap(S :- label(S).\n"), 0o644)
	if _, errOut, code := runFake(t, f, "", "tap", "compile", "-f", bad); code == 0 || !strings.Contains(errOut, "bad.mg") || !strings.Contains(errOut, "line 2") {
		t.Errorf("a bad policy: %d %s", code, errOut)
	}
	if _, errOut, code := runFake(t, f, "", "tap", "compile"); code == 0 || !strings.Contains(errOut, "-f FILE") {
		t.Errorf("no file: %d %s", code, errOut)
	}
	// A policy that matches nothing says which facts its rules lacked.
	none := "inspect(S, \"pgsql\", \"both\", \"TCP\", 5432, \"redirect\") :- label(S, \"app\", \"postgres\").\n"
	out, errOut, code = runFake(t, f, none, "tap", "compile", "-f", "-")
	if code != 0 || !strings.Contains(out, "0 contracts:\n") || !strings.Contains(out, `  label(S,"app","postgres") (line 1): no fact matches`) {
		t.Errorf("a policy matching nothing: exit %d\n%s%s", code, out, errOut)
	}
}

func TestTapPolicyCommands(t *testing.T) {
	f := &fakePolicyAgent{}
	file := filepath.Join(t.TempDir(), "taps.mg")
	os.WriteFile(file, []byte(cliPolicy), 0o644)
	if _, errOut, code := runFake(t, f, "", "tap", "policy", "get"); code == 0 || !strings.Contains(errOut, "no tap policy") {
		t.Errorf("get without a policy: %d %s", code, errOut)
	}
	out, errOut, code := runFake(t, f, "", "tap", "policy", "apply", "-f", file)
	if code != 0 || !strings.Contains(out, "taps.mg") || f.applied == nil || f.applied.Source != cliPolicy {
		t.Fatalf("apply: %d %s %s", code, out, errOut)
	}
	out, _, code = runFake(t, f, "", "tap", "policy", "get")
	for _, want := range []string{"tap policy taps.mg", "error: the last recompilation failed", "monitor gone", "1 contract:", "---\n" + cliPolicy} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("policy get lacks %q:\n%s", want, out)
		}
	}
	out, _, code = runFake(t, f, "", "tap", "policy", "get", "-o", "json")
	var got api.TapPolicy
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.Source != cliPolicy || len(got.Contracts) != 1 {
		t.Errorf("policy get -o json: %d %q", code, out)
	}
	if out, _, code := runFake(t, f, "", "tap", "policy", "delete"); code != 0 || !strings.Contains(out, "deleted") || f.applied != nil {
		t.Errorf("delete: %d %s", code, out)
	}
}
