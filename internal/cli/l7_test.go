package cli_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

const l7Deathstar = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: rule1, namespace: sw}
spec:
  endpointSelector: {matchLabels: {class: deathstar}}
  ingress:
  - fromEndpoints: [{matchLabels: {org: empire}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules:
        http:
        - {method: GET, path: /v1}
        - {method: POST, path: /v1/request-landing}
`

// request sends one request and returns its status and body; err for a failed connection.
func request(c *http.Client, method, url string) (int, string, string, error) {
	req, _ := http.NewRequest(method, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("X-Remote-Addr"), nil
}

// TestL7ThroughAgent runs the whole L7 path: policy with HTTP rules, BPF steering into the
// agent's Envoy, 403 for requests no rule allows, the client's address at the server, l7
// flows, trace and status, Envoy killed and restarted, and the agent stopped (fail closed).
func TestL7ThroughAgent(t *testing.T) {
	agenttest.RequireEnvoy(t)
	e := agenttest.StartAgent(t, agenttest.Options{NoServers: true})
	ships := e.AddStarWars("sw")
	tie, ds := ships["tiefighter"], ships["deathstar"]
	e.ServeHTTP("sw/deathstar", 80, testenv.EchoHTTP())
	if p := e.ProxyStatus(); p.State != "not started" {
		t.Fatalf("proxy before any L7 rule: %+v", p)
	}
	e.MustCLI("apply", "-f", writeFile(t, "l7.yaml", l7Deathstar))
	p := e.WaitProxy(30 * time.Second)

	c := e.HTTPClient("sw/tiefighter", 3*time.Second)
	base := "http://" + ds.IP
	code, body, remote, err := request(c, "GET", base+"/v1")
	if err != nil || code != 200 || !strings.HasPrefix(remote, tie.IP+":") {
		t.Fatalf("GET /v1: %d %q (server saw %q) %v; want 200 from %s", code, body, remote, err, tie.IP)
	}
	if code, _, _, err := request(c, "POST", base+"/v1/request-landing"); err != nil || code != 200 {
		t.Fatalf("POST /v1/request-landing: %d %v", code, err)
	}
	code, body, _, err = request(c, "PUT", base+"/v1/exhaust-port")
	if err != nil || code != 403 {
		t.Fatalf("PUT /v1/exhaust-port: %d %q %v; want 403", code, body, err)
	}
	// The xwing has no rule at all: dropped by the dataplane, never reaches the proxy.
	if code, _, _, err := request(e.HTTPClient("sw/xwing", 500*time.Millisecond), "GET", base+"/v1"); err == nil {
		t.Fatalf("xwing GET /v1: %d, want no connection", code)
	}

	// observe --type l7 shows the requests, with the deciding endpoint and rule.
	var flows []api.Flow
	if !testenv.Eventually(5*time.Second, func() bool {
		flows = nil
		out := e.MustCLI("observe", "--type", "l7", "--since-start", "-o", "json")
		dec := json.NewDecoder(strings.NewReader(out))
		for {
			var f api.Flow
			if dec.Decode(&f) != nil {
				break
			}
			flows = append(flows, f)
		}
		return len(flows) >= 3
	}) {
		t.Fatalf("l7 flows: %+v", flows)
	}
	var sawDenied, sawAllowed bool
	for _, f := range flows {
		if f.Type != "l7" || f.L7 == nil {
			t.Fatalf("observe --type l7 gave %+v", f)
		}
		switch {
		case f.L7.Method == "PUT":
			sawDenied = f.Verdict == "DROPPED" && f.Reason == "l7-denied" && f.Endpoint == "sw/deathstar" && f.L7.Status == 403 &&
				f.Source.Name == "tiefighter" && f.Direction == "ingress"
		case f.L7.Method == "GET":
			sawAllowed = f.Verdict == "FORWARDED" && f.Rule != nil && f.Rule.Policy == "CiliumNetworkPolicy/sw/rule1" && f.L7.Status == 200
		}
	}
	if !sawDenied || !sawAllowed {
		t.Fatalf("l7 flows lack the denial or the allowed request: %+v", flows)
	}
	text := e.MustCLI("observe", "--type", "l7", "--since-start")
	if !strings.Contains(text, "ingress DROPPED PUT "+ds.IP+" /v1/exhaust-port 403") {
		t.Fatalf("observe text:\n%s", text)
	}
	// The dataplane reported the steering.
	if out := e.MustCLI("observe", "--type", "l3l4", "--since-start", "--verdict", "redirected"); !strings.Contains(out, "REDIRECTED to L7 proxy") {
		t.Fatalf("no redirected flow:\n%s", out)
	}

	out := e.MustCLI("policy", "trace", "--from", "sw/tiefighter", "--to", "sw/deathstar", "--port", "80/TCP")
	for _, want := range []string{"redirected to L7 proxy", `allow method "GET" path "/v1"`, `allow method "POST" path "/v1/request-landing"`} {
		if !strings.Contains(out, want) {
			t.Fatalf("trace lacks %q:\n%s", want, out)
		}
	}
	if out := e.MustCLI("status"); !strings.Contains(out, "L7 proxy:") || !strings.Contains(out, "running (pid ") {
		t.Fatalf("status:\n%s", out)
	}

	// Envoy killed: restarted, configured again, requests pass again.
	if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !testenv.Eventually(20*time.Second, func() bool {
		q := e.ProxyStatus()
		return q.Restarts >= 1 && q.PID != 0 && q.PID != p.PID && q.State == "running"
	}) {
		t.Fatalf("envoy not restarted: %+v", e.ProxyStatus())
	}
	c.CloseIdleConnections()
	if !testenv.Eventually(15*time.Second, func() bool {
		code, _, _, err := request(c, "GET", base+"/v1")
		return err == nil && code == 200
	}) {
		t.Fatal("GET /v1 does not pass after the proxy restarted")
	}
	if code, _, _, err := request(c, "PUT", base+"/v1/exhaust-port"); err != nil || code != 403 {
		t.Fatalf("PUT after restart: %d %v; want 403", code, err)
	}

	// Agent stopped: Envoy goes with it and L7 connections are refused, not let through.
	e.Stop()
	c.CloseIdleConnections()
	short := e.HTTPClient("sw/tiefighter", 700*time.Millisecond)
	if code, _, _, err := request(short, "PUT", base+"/v1/exhaust-port"); err == nil {
		t.Fatalf("PUT with the agent stopped: %d, want no connection", code)
	}
	e.Start()
	e.WaitProxy(30 * time.Second)
	if !testenv.Eventually(15*time.Second, func() bool {
		code, _, _, err := request(c, "GET", base+"/v1")
		return err == nil && code == 200
	}) {
		t.Fatal("GET /v1 does not pass after the agent restarted")
	}
}
