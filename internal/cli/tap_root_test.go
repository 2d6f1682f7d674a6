package cli_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// The real dataplane takes tap contracts: from flags and from a manifest, listed with the
// counters, and a monitor endpoint is made with its receive and return interfaces.
// (test/taps sends real packets through them.)
func TestTapsOnTheDataplane(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{})
	ids := e.AddEndpoint("sec", "ids", nil, "--monitor")
	e.AddEndpoint("shop", "web", map[string]string{"app": "web"})
	var ep api.Endpoint
	if err := json.Unmarshal([]byte(e.MustCLI("endpoint", "get", "sec/ids", "-o", "json")), &ep); err != nil || !ep.Monitor {
		t.Fatalf("sec/ids is not a monitor: %+v, %v", ep, err)
	}
	if out := e.MustCLI("endpoint", "get", "sec/ids"); !strings.Contains(out, "Monitor:") {
		t.Errorf("endpoint get does not say sec/ids is a monitor:\n%s", out)
	}
	for _, ifname := range []string{"tap-rx", "tap-tx"} {
		if out, err := exec.Command("nsenter", "--net="+ids.Netns, "ip", "link", "show", ifname).CombinedOutput(); err != nil {
			t.Errorf("monitor interface %s: %v: %s", ifname, err, out)
		}
	}
	e.MustCLI("tap", "add", "web-mirror", "--selector", "app=web", "--monitor", "sec/ids", "--action", "mirror", "--direction", "ingress")
	file := writeFile(t, "tap.yaml", "apiVersion: rampart.io/v1alpha1\nkind: TapContract\nmetadata: {name: web-redirect}\nspec:\n  source: {endpoint: shop/web}\n  monitor: sec/ids\n  action: Redirect\n  match: {direction: Egress}\n")
	e.MustCLI("apply", "-f", file)
	var taps []api.Tap
	if err := json.Unmarshal([]byte(e.MustCLI("tap", "list", "-o", "json")), &taps); err != nil || len(taps) != 2 {
		t.Fatalf("tap list: %+v, %v", taps, err)
	}
	// A monitor's interfaces go with it.
	e.MustCLI("tap", "delete", "web-mirror")
	e.MustCLI("delete", "-f", file)
	e.DeleteEndpoint("sec/ids")
}
