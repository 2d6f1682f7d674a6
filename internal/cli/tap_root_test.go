package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// On the real dataplane, which has no tap table wired yet, a monitor endpoint can be made
// but every tap contract is refused, by tap add and by apply: the agent never pretends to
// tap. (When internal/datapath gets its tap table, this test turns into the contract's
// acceptance on the real kernel.)
func TestTapsOnDataplaneWithoutTaps(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{})
	e.AddEndpoint("sec", "ids", nil, "--monitor")
	e.AddEndpoint("shop", "web", map[string]string{"app": "web"})
	var ep api.Endpoint
	if err := json.Unmarshal([]byte(e.MustCLI("endpoint", "get", "sec/ids", "-o", "json")), &ep); err != nil || !ep.Monitor {
		t.Fatalf("sec/ids is not a monitor: %+v, %v", ep, err)
	}
	if out := e.MustCLI("endpoint", "get", "sec/ids"); !strings.Contains(out, "Monitor:") {
		t.Errorf("endpoint get does not say sec/ids is a monitor:\n%s", out)
	}
	_, errs, code := e.CLI("tap", "add", "web", "--selector", "app=web", "--monitor", "sec/ids", "--action", "mirror")
	if code == 0 || !strings.Contains(errs, "the dataplane has no taps yet") {
		t.Errorf("tap add: exit %d, stderr %q", code, errs)
	}
	file := writeFile(t, "tap.yaml", "apiVersion: rampart.io/v1alpha1\nkind: TapContract\nmetadata: {name: web}\nspec:\n  source: {endpoint: shop/web}\n  monitor: sec/ids\n  action: Redirect\n")
	_, errs, code = e.CLI("apply", "-f", file)
	if code == 0 || !strings.Contains(errs, "the dataplane has no taps yet") {
		t.Errorf("apply: exit %d, stderr %q", code, errs)
	}
	if out := e.MustCLI("tap", "list", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("tap list after refusals: %s", out)
	}
}
