package cli_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

func TestExecIdentityNamespaceStatus(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{NoServers: true})
	e.MustCLI("endpoint", "add", "x/a", "--labels", "app=web,tier=front", "--port", "http=8080/TCP", "--service-account", "sa1")
	e.MustCLI("endpoint", "add", "x/a2", "--labels", "tier=front,app=web", "--port", "http=8080/TCP", "--service-account", "sa1")
	e.MustCLI("endpoint", "add", "y/b", "--labels", "app=db", "--ip", "198.18.3.3")
	ip := e.IP("x/a")

	// exec runs in the endpoint's network namespace, passes output and the exit code.
	out, stderr, code := e.CLI("endpoint", "exec", "x/a", "--", "sh", "-c", "ip -4 -o addr show dev eth0; echo oops >&2; exit 3")
	if code != 3 || !strings.Contains(out, ip.String()+"/32") || !strings.Contains(stderr, "oops") {
		t.Fatalf("exec: code %d, out %q, err %q", code, out, stderr)
	}
	out = e.MustCLI("endpoint", "exec", "y/b", "--", "ip", "-4", "route", "show")
	if !strings.Contains(out, "default via 198.18.0.1") {
		t.Fatalf("exec route: %q", out)
	}
	if _, _, code := e.CLI("endpoint", "exec", "x/nope", "--", "true"); code == 0 {
		t.Fatal("exec in a missing endpoint succeeded")
	}

	// endpoint get: named ports, service account, identity labels.
	out = e.MustCLI("endpoint", "get", "x/a")
	for _, want := range []string{"http=8080/TCP", "sa1", "io.cilium.k8s.policy.serviceaccount=sa1", "app=web,tier=front"} {
		if !strings.Contains(out, want) {
			t.Errorf("endpoint get lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`Enforcement:\s+none`).MatchString(out) {
		t.Errorf("endpoint get enforcement:\n%s", out)
	}
	// Replicas share an identity, shown with both endpoints.
	var ids []api.Identity
	if err := json.Unmarshal([]byte(e.MustCLI("identity", "list", "-o", "json")), &ids); err != nil {
		t.Fatal(err)
	}
	a := e.Endpoint("x/a")
	var shared, world bool
	for _, id := range ids {
		if id.ID == a.Identity {
			shared = strings.Join(id.Endpoints, ",") == "x/a,x/a2"
		}
		world = world || (id.ID == 2 && id.Kind == "reserved")
	}
	if !shared || !world {
		t.Errorf("identity list: shared %v, world %v: %+v", shared, world, ids)
	}
	if out := e.MustCLI("identity", "list"); !strings.Contains(out, "reserved:host") || !strings.Contains(out, "x/a,x/a2") {
		t.Errorf("identity list text:\n%s", out)
	}

	// Namespace labels: set, shown, change the identity; removal with k-.
	e.MustCLI("namespace", "label", "x", "team=blue", "env=prod")
	out = e.MustCLI("namespace", "list")
	if !strings.Contains(out, "env=prod,kubernetes.io/metadata.name=x,team=blue") {
		t.Errorf("namespace list:\n%s", out)
	}
	if e.Endpoint("x/a").Identity == a.Identity {
		t.Error("namespace label did not change the identity")
	}
	e.MustCLI("namespace", "label", "x", "env-")
	if out := e.MustCLI("namespace", "list"); strings.Contains(out, "env=prod") {
		t.Errorf("label not removed:\n%s", out)
	}
	if _, stderr, code := e.CLI("namespace", "label", "x", "kubernetes.io/metadata.name-"); code == 0 || !strings.Contains(stderr, "cannot be removed") {
		t.Errorf("removing the name label: %d %q", code, stderr)
	}
	// Endpoint relabel.
	e.MustCLI("endpoint", "label", "y/b", "app=cache", "extra=1")
	if l := e.Endpoint("y/b").Labels; l["app"] != "cache" || l["extra"] != "1" {
		t.Errorf("relabel: %v", l)
	}

	out = e.MustCLI("status")
	for _, want := range []string{"up since", e.Config.Instance, "198.18.0.0/16", "Endpoints:", "3"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	// Bad input to endpoint add.
	for _, args := range [][]string{
		{"endpoint", "add", "noslash"},
		{"endpoint", "add", "x/c", "--port", "http=80/ICMP"},
		{"endpoint", "add", "x/c", "--port", "http"},
		{"endpoint", "add", "x/c", "--ip", "198.18.3.3"},
		{"endpoint", "add", "x/c", "--labels", "novalue"},
	} {
		if _, _, code := e.CLI(args...); code == 0 {
			t.Errorf("%v succeeded", args)
		}
	}
	e.MustCLI("endpoint", "delete", "x/a2")
	if _, _, code := e.CLI("endpoint", "get", "x/a2"); code == 0 {
		t.Error("deleted endpoint still there")
	}
}
