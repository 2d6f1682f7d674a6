package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/tap"
)

// fakeTapAgent parses what it is sent with the agent's parser and keeps the contracts, so
// that the flags' manifest is checked as the agent checks it.
type fakeTapAgent struct {
	api.Service
	mu       sync.Mutex
	contract map[string]*tap.Contract
	applied  []string // kinds applied through apply
}

// parseTapDocs parses the documents as the agent does and calls keep with each contract.
func parseTapDocs(req api.ApplyRequest, keep func(c *tap.Contract)) (api.ChangeResult, error) {
	var res api.ChangeResult
	for _, d := range req.Documents {
		docs, err := policy.Parse(d.Source, []byte(d.Data))
		if err != nil {
			return res, api.BadRequest("%v", err)
		}
		for _, c := range docs.Taps {
			keep(c)
			res.Changes = append(res.Changes, api.PolicyChange{Kind: c.Kind, Name: c.Name, Action: "created"})
		}
	}
	return res, nil
}

func (f *fakeTapAgent) AddTaps(_ context.Context, req api.ApplyRequest) (api.ChangeResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return parseTapDocs(req, func(c *tap.Contract) { f.contract[c.Name] = c })
}

func (f *fakeTapAgent) Apply(_ context.Context, req api.ApplyRequest) (api.ChangeResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return parseTapDocs(req, func(c *tap.Contract) { f.applied = append(f.applied, c.Kind+"/"+c.Name) })
}

func (f *fakeTapAgent) DeleteTap(_ context.Context, name string) (api.ChangeResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.contract[name]
	if !ok {
		return api.ChangeResult{}, api.NotFound("tap contract %q not found", name)
	}
	delete(f.contract, name)
	return api.ChangeResult{Changes: []api.PolicyChange{{Kind: c.Kind, Name: name, Action: "deleted"}}}, nil
}

var listedTaps = []api.Tap{
	{Kind: "TapContract", Name: "db-in", Tapped: "shop/db", Monitor: "sec/ids", Match: "ingress TCP ports 5432", Action: "redirect", FailMode: "closed",
		Endpoints: []string{"shop/db"}, MonitorProblem: "monitor sec/ids does not exist", Counters: &api.TapCounters{DroppedUnavailable: 4}},
	{Kind: "TrafficControl", Name: "web", Tapped: "selector app=web", Monitor: "sec/ids", MonitorNode: "node-b", Match: "both any", Action: "mirror",
		Endpoints: []string{"shop/web-1", "shop/web-2"}, Counters: &api.TapCounters{MirroredPackets: 7, MirroredBytes: 700, CopiesLost: 2}},
}

func (f *fakeTapAgent) ListTaps(context.Context) ([]api.Tap, error) { return listedTaps, nil }

func (f *fakeTapAgent) GetTap(_ context.Context, name string) (api.Tap, error) {
	for _, t := range listedTaps {
		if t.Name == name {
			return t, nil
		}
	}
	return api.Tap{}, api.NotFound("tap contract %q not found", name)
}

func TestTapAddFromFlags(t *testing.T) {
	f := &fakeTapAgent{contract: map[string]*tap.Contract{}}
	out, errs, code := runFake(t, f, "", "tap", "add", "web-http", "--selector", "app=web", "--namespace-selector", "env=prod",
		"--monitor", "sec/ids", "--action", "redirect", "--fail-mode", "open", "--direction", "both", "--protocol", "tcp",
		"--port", "80,8000-8080", "--port", "443", "--peer", "198.18.0.0/15", "--peer-port", "1024-65535")
	if code != 0 || out != "tapcontract/web-http created\n" {
		t.Fatalf("tap add: exit %d, out %q, err %q", code, out, errs)
	}
	c := f.contract["web-http"]
	if c == nil || c.Action != tap.Redirect || c.FailMode != tap.FailOpen || c.Monitor != "sec/ids" ||
		c.Match.String() != "both TCP ports 80,443,8000-8080 peer-ports 1024-65535 peers 198.18.0.0/15" ||
		!c.Source.Selector.Matches(labels.ForPod("shop", labels.Labels{"app": "web"}, labels.Labels{"env": "prod"}, "")) ||
		c.Source.Selector.Matches(labels.ForPod("shop", labels.Labels{"app": "web"}, labels.Labels{"env": "dev"}, "")) {
		t.Fatalf("contract %s %s, match %v, selector %v", c.Kind, c.Name, c.Match, c.Source.Selector)
	}

	out, errs, code = runFake(t, f, "", "tap", "add", "ping", "--endpoint", "shop/db", "--monitor", "sec/ids", "--action", "mirror",
		"--protocol", "icmp", "--icmp-type", "8", "--icmp-code", "0", "--direction", "ingress")
	if code != 0 {
		t.Fatalf("tap add ping: exit %d, %q %q", code, out, errs)
	}
	if c := f.contract["ping"]; c.Source.Endpoint != "shop/db" || c.Match.String() != "ingress ICMP type 8 code 0" {
		t.Errorf("ping: %+v %v", c, c.Match)
	}

	// The agent's parser refuses what the flags made wrong, naming the field.
	_, errs, code = runFake(t, f, "", "tap", "add", "bad", "--endpoint", "shop/db", "--monitor", "sec/ids", "--action", "mirror", "--port", "80")
	if code == 0 || !strings.Contains(errs, "spec.match.ports") || !strings.Contains(errs, "need protocol TCP or UDP") {
		t.Errorf("ports without a protocol: exit %d, %q", code, errs)
	}
	_, errs, code = runFake(t, f, "", "tap", "add", "bad", "--endpoint", "shop/db", "--action", "mirror")
	if code == 0 || !strings.Contains(errs, "--monitor") {
		t.Errorf("no monitor: exit %d, %q", code, errs)
	}
	_, errs, code = runFake(t, f, "", "tap", "add", "bad", "--endpoint", "shop/db", "--monitor", "sec/ids", "--action", "copy")
	if code == 0 || !strings.Contains(errs, "unknown action") {
		t.Errorf("bad action: exit %d, %q", code, errs)
	}

	out, _, code = runFake(t, f, "", "tap", "delete", "ping")
	if code != 0 || out != "tapcontract/ping deleted\n" {
		t.Errorf("tap delete: %d %q", code, out)
	}
	if _, errs, code := runFake(t, f, "", "tap", "delete", "ping"); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("deleting again: %d %q", code, errs)
	}
}

func TestTapAddFromFileAndApply(t *testing.T) {
	f := &fakeTapAgent{contract: map[string]*tap.Contract{}}
	file := filepath.Join(t.TempDir(), "tc.yaml")
	os.WriteFile(file, []byte(`apiVersion: crd.antrea.io/v1alpha2
kind: TrafficControl
metadata: {name: mirror-web}
spec:
  appliedTo: {podSelector: {matchLabels: {app: web}}}
  direction: Both
  action: Mirror
  targetPort: {ovsInternal: {name: sec/ids}}
`), 0o644)
	out, errs, code := runFake(t, f, "", "tap", "add", "-f", file)
	if code != 0 || out != "trafficcontrol/mirror-web created\n" || f.contract["mirror-web"] == nil {
		t.Fatalf("tap add -f: %d %q %q", code, out, errs)
	}
	out, errs, code = runFake(t, f, "", "apply", "-f", file)
	if code != 0 || out != "trafficcontrol/mirror-web created\n" || len(f.applied) != 1 {
		t.Fatalf("apply -f: %d %q %q %v", code, out, errs, f.applied)
	}
	if _, errs, code := runFake(t, f, "", "tap", "add", "x", "-f", file); code == 0 || !strings.Contains(errs, "not both") {
		t.Errorf("NAME and -f: %d %q", code, errs)
	}
}

func TestTapListAndGet(t *testing.T) {
	f := &fakeTapAgent{}
	out, _, code := runFake(t, f, "", "tap", "list")
	if code != 0 {
		t.Fatal(code)
	}
	for _, want := range []string{
		"NAME", "COPIES LOST",
		"db-in", "redirect (fail closed)", "sec/ids (unavailable)",
		"sec/ids@node-b", "7/700B",
		"note: db-in: monitor sec/ids does not exist: matched traffic is dropped (fail closed)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tap list lacks %q:\n%s", want, out)
		}
	}
	out, _, code = runFake(t, f, "", "tap", "get", "web")
	if code != 0 || !strings.Contains(out, "endpoints: 2 shop/web-1 shop/web-2") || !strings.Contains(out, "mirrored 7 packets (700 bytes)") || !strings.Contains(out, "copies lost 2") {
		t.Errorf("tap get: %d\n%s", code, out)
	}
	out, _, code = runFake(t, f, "", "tap", "get", "web", "-o", "json")
	var got api.Tap
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.Counters.CopiesLost != 2 {
		t.Errorf("tap get -o json: %d %q", code, out)
	}
}

// remote add --monitor declares a monitor on another node.
func TestRemoteMonitorFlag(t *testing.T) {
	f := &fakeNodes{nodes: map[string]api.NodeSpec{}, remotes: map[string]api.RemoteEndpointSpec{}}
	if _, errs, code := runFake(t, f, "", "remote", "add", "sec/ids", "--node", "node-b", "--ip", "198.18.32.9", "--monitor"); code != 0 {
		t.Fatalf("remote add --monitor: %d %q", code, errs)
	}
	if !f.remotes["sec/ids"].Monitor {
		t.Errorf("remote sent %+v, want a monitor", f.remotes["sec/ids"])
	}
}
