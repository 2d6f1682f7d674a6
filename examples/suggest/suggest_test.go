package suggest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/examples/marketplace"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

const auditLines = "  annotations:\n    policy.rampart.io/audit: \"true\"\n"

// stamp is a time for --since: every flow from now on.
func stamp() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// suggestUntil runs rampart policy suggest until its output has every string of want (the
// flows of the traffic just run may still be on their way to the history).
func suggestUntil(t *testing.T, e *agenttest.Env, want []string, args ...string) string {
	t.Helper()
	var out string
	if !testenv.Eventually(10*time.Second, func() bool {
		out = e.MustCLI(append([]string{"policy", "suggest"}, args...)...)
		for _, w := range want {
			if !strings.Contains(out, w) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("rampart policy suggest %s: want %q in:\n%s", strings.Join(args, " "), want, out)
	}
	t.Logf("suggested:\n%s", out)
	return out
}

// apply checks the manifests as apply --dry-run does, then applies them.
func apply(t *testing.T, e *agenttest.Env, name, yaml string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	e.MustCLI("apply", "--dry-run", "-f", f)
	e.MustCLI("apply", "-f", f)
	return f
}

// enforced is the suggestion without its audit annotations.
func enforced(t *testing.T, yaml string) string {
	t.Helper()
	out := strings.ReplaceAll(yaml, auditLines, "")
	if out == yaml || strings.Contains(out, "policy.rampart.io/audit") {
		t.Fatalf("cannot take the audit annotation out of:\n%s", yaml)
	}
	return out
}

// flows are the flows since a stamp with a verdict, as observe -o json gives them.
func flows(t *testing.T, e *agenttest.Env, since, verdict string) []api.Flow {
	t.Helper()
	out := e.MustCLI("observe", "--since", since, "--verdict", verdict, "-o", "json")
	var fs []api.Flow
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var f api.Flow
		if err := dec.Decode(&f); err == io.EOF {
			return fs
		} else if err != nil {
			t.Fatalf("observe -o json: %v\n%s", err, out)
		}
		fs = append(fs, f)
	}
}

// noAudit waits until the dataplane reported at least n allowed flows since the stamp (so
// the window is complete), then checks that none of them, nor any other, was AUDIT.
func noAudit(t *testing.T, e *agenttest.Env, since string, n int) {
	t.Helper()
	var got []api.Flow
	if !testenv.Eventually(10*time.Second, func() bool {
		got = append(flows(t, e, since, "forwarded"), flows(t, e, since, "redirected")...)
		return len(got) >= n
	}) {
		t.Fatalf("want at least %d allowed flows since %s, got %d", n, since, len(got))
	}
	if audited := flows(t, e, since, "audit"); len(audited) > 0 {
		t.Errorf("%d AUDIT flows for the traffic the suggestion was made from:", len(audited))
		for _, f := range audited {
			t.Errorf("  %s", agentFlow(f))
		}
	}
}

func agentFlow(f api.Flow) string {
	return fmt.Sprintf("%s/%s -> %s/%s %s:%d %s %s %s", f.Source.Namespace, f.Source.Name, f.Dest.Namespace, f.Dest.Name,
		f.Protocol, f.Dest.Port, f.Direction, f.Verdict, f.Reason)
}

// TestSuggestStarWars: the tiefighter lands (TCP 80 to the deathstar) with no policy; the
// suggestion admits exactly that: in audit mode it reports nothing for the same traffic
// (and AUDIT for the xwing's, which it would drop); enforced, the tiefighter still
// connects and the xwing, and the tiefighter on another port, do not.
func TestSuggestStarWars(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{})
	ns := "sw" + testenv.Suffix(4)
	e.AddStarWars(ns)
	ds := e.IP(ns + "/deathstar")
	land := func() bool { return e.Probe(ns+"/tiefighter", ds, 80, "tcp", 2*time.Second) }

	start := stamp()
	if !land() {
		t.Fatal("the tiefighter cannot reach the deathstar with no policy")
	}
	yaml := suggestUntil(t, e, []string{"name: suggested-deathstar-ingress", "name: suggested-tiefighter-egress"},
		"--since", start, "--namespace", ns, "--audit")
	for _, bad := range []string{"xwing", "org: empire", "class: xwing"} {
		if strings.Contains(yaml, bad) {
			t.Errorf("the suggestion names %q, which the traffic did not involve as a peer", bad)
		}
	}
	apply(t, e, "audit.yaml", yaml)

	again := stamp()
	if !land() {
		t.Fatal("the tiefighter cannot reach the deathstar with the suggestion in audit mode")
	}
	noAudit(t, e, again, 1)
	// The xwing was not seen: audit mode lets it through and reports it.
	if !e.Probe(ns+"/xwing", ds, 80, "tcp", 2*time.Second) {
		t.Error("audit mode dropped the xwing")
	}
	if !testenv.Eventually(5*time.Second, func() bool {
		for _, f := range flows(t, e, again, "audit") {
			if f.Source.Name == "xwing" && f.Dest.Name == "deathstar" {
				return true
			}
		}
		return false
	}) {
		t.Error("no AUDIT flow for the xwing, which the suggestion would drop")
	}

	apply(t, e, "enforced.yaml", enforced(t, yaml))
	if !land() {
		t.Error("enforced: the tiefighter cannot reach the deathstar")
	}
	if e.Probe(ns+"/xwing", ds, 80, "tcp", time.Second) {
		t.Error("enforced: the xwing reaches the deathstar")
	}
	if e.Probe(ns+"/tiefighter", ds, 81, "tcp", time.Second) {
		t.Error("enforced: the tiefighter reaches the deathstar on port 81, which it never used")
	}
	if e.Probe(ns+"/tiefighter", e.IP(ns+"/xwing"), 80, "tcp", time.Second) {
		t.Error("enforced: the tiefighter reaches the xwing, which it never did")
	}
}

// visibility steers the deathstar's port 80 through the L7 proxy, admitting every request
// of every endpoint of the namespace: the proxy records only requests on ports with L7
// rules, so this is how the requests get seen before any real policy.
const visibility = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: l7-visibility, namespace: %s}
spec:
  endpointSelector: {matchLabels: {class: deathstar}}
  ingress:
  - fromEndpoints: [{}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules: {http: [{}]}
`

// TestSuggestStarWarsL7: the tiefighter's POST /v1/request-landing seen by the proxy
// becomes an HTTP rule; enforced, it passes, the exhaust port gets 403 and the xwing no
// connection.
func TestSuggestStarWarsL7(t *testing.T) {
	agenttest.RequireEnvoy(t)
	e := agenttest.StartAgent(t, agenttest.Options{NoServers: true})
	ns := "sw" + testenv.Suffix(4)
	ships := e.AddStarWars(ns)
	e.ServeHTTP(ns+"/deathstar", 80, testenv.EchoHTTP())
	base := "http://" + ships["deathstar"].IP
	tie := e.HTTPClient(ns+"/tiefighter", 3*time.Second)
	request := func(c *http.Client, method, path string) (int, error) {
		req, _ := http.NewRequest(method, base+path, nil)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	landPasses := func() bool {
		code, err := request(tie, "POST", "/v1/request-landing")
		return err == nil && code == 200
	}

	vis := apply(t, e, "visibility.yaml", fmt.Sprintf(visibility, ns))
	e.WaitProxy(30 * time.Second)
	start := stamp()
	if !testenv.Eventually(10*time.Second, landPasses) {
		t.Fatal("POST /v1/request-landing does not pass with the visibility policy")
	}
	yaml := suggestUntil(t, e, []string{"kind: CiliumNetworkPolicy", "path: /v1/request-landing"},
		"--since", start, "--namespace", ns, "--l7", "--audit")
	if strings.Contains(yaml, "exhaust-port") || strings.Contains(yaml, "method: GET") {
		t.Errorf("the suggestion admits requests never made:\n%s", yaml)
	}
	e.MustCLI("delete", "-f", vis)
	apply(t, e, "audit.yaml", yaml)

	again := stamp()
	tie.CloseIdleConnections()
	if !testenv.Eventually(10*time.Second, landPasses) {
		t.Fatal("POST /v1/request-landing does not pass with the suggestion in audit mode")
	}
	noAudit(t, e, again, 1)

	apply(t, e, "enforced.yaml", enforced(t, yaml))
	e.WaitProxy(30 * time.Second)
	tie.CloseIdleConnections()
	if !testenv.Eventually(10*time.Second, landPasses) {
		t.Error("enforced: POST /v1/request-landing does not pass")
	}
	if code, err := request(tie, "PUT", "/v1/exhaust-port"); err != nil || code != 403 {
		t.Errorf("enforced: PUT /v1/exhaust-port: %d %v, want 403", code, err)
	}
	if code, err := request(e.HTTPClient(ns+"/xwing", 700*time.Millisecond), "POST", "/v1/request-landing"); err == nil {
		t.Errorf("enforced: the xwing's request got %d, want no connection", code)
	}
}

// mpPod is one marketplace pod on the agent.
type mpPod struct{ org, key string }

// TestSuggestMarketplace plays scenarios of examples/marketplace/expected.txt on one agent:
// two pods per organisation (replicas that differ in a per-pod label) whose allowed pairs
// connect with no policy; the suggestion must then admit exactly them.
func TestSuggestMarketplace(t *testing.T) {
	table, err := marketplace.ReadExpected(filepath.Join(testenv.ModuleRoot(t), "examples/marketplace/expected.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, scenario := range []string{"bilateral", "third-party"} {
		t.Run(scenario, func(t *testing.T) { playMarketplace(t, table[scenario]) })
	}
}

func playMarketplace(t *testing.T, allowed marketplace.Pairs) {
	if len(allowed) == 0 {
		t.Fatal("scenario not in the table")
	}
	e := agenttest.StartAgent(t, agenttest.Options{TCPPorts: []uint16{marketplace.Port}})
	var pods []mpPod
	for _, o := range marketplace.Orgs {
		e.MustCLI("namespace", "label", marketplace.Namespace(o), "org="+o)
		for i := 1; i <= 2; i++ {
			l := marketplace.PodLabels(o)
			l["pod-template-hash"] = testenv.Suffix(6) // a Deployment's, mid-rollout
			name := fmt.Sprintf("%s-%d", o, i)
			e.AddEndpoint(marketplace.Namespace(o), name, l)
			pods = append(pods, mpPod{o, marketplace.Namespace(o) + "/" + name})
		}
	}
	// The pairs to probe: every ordered pair of distinct pods.
	type pair struct{ from, to mpPod }
	var seen, unseen []pair
	// Organisations seen sending get an egress policy, those seen receiving an ingress one.
	sends, receives := map[string]bool{}, map[string]bool{}
	for _, a := range pods {
		for _, b := range pods {
			if a.key == b.key {
				continue
			}
			if allowed[[2]string{a.org, b.org}] {
				seen = append(seen, pair{a, b})
				sends[a.org], receives[b.org] = true, true
			} else {
				unseen = append(unseen, pair{a, b})
			}
		}
	}
	probe := func(ps []pair, timeout time.Duration) []bool {
		got := make([]bool, len(ps))
		var wg sync.WaitGroup
		for i, p := range ps {
			ip := e.IP(p.to.key)
			wg.Go(func() { got[i] = e.Probe(p.from.key, ip, marketplace.Port, "tcp", timeout) })
		}
		wg.Wait()
		return got
	}
	all := func(what string) {
		t.Helper()
		for i, ok := range probe(seen, 2*time.Second) {
			if !ok {
				t.Errorf("%s: %s -> %s does not connect", what, seen[i].from.key, seen[i].to.key)
			}
		}
	}

	start := stamp()
	all("no policy")
	var want []string
	for o := range sends {
		want = append(want, "namespace: "+marketplace.Namespace(o))
	}
	for o := range receives {
		want = append(want, "namespace: "+marketplace.Namespace(o))
	}
	yaml := suggestUntil(t, e, want, "--since", start, "--audit")
	if strings.Contains(yaml, "pod-template-hash") {
		t.Errorf("the suggestion selects by pod-template-hash:\n%s", yaml)
	}
	apply(t, e, "audit.yaml", yaml)
	again := stamp()
	all("audit mode")
	noAudit(t, e, again, len(seen))

	apply(t, e, "enforced.yaml", enforced(t, yaml))
	all("enforced")
	// A pair the scenario did not make is dropped when the suggestion covers one of its
	// sides: the egress of a source seen sending, the ingress of a destination seen
	// receiving. Elsewhere the pods keep their lack of policy.
	got := probe(unseen, time.Second)
	dropped := 0
	for i, p := range unseen {
		covered := sends[p.from.org] || receives[p.to.org]
		switch {
		case covered && got[i]:
			t.Errorf("enforced: %s -> %s connects, which the scenario never did", p.from.key, p.to.key)
		case !covered && !got[i]:
			t.Errorf("enforced: %s -> %s is dropped, yet no suggested policy selects either side", p.from.key, p.to.key)
		case !got[i]:
			dropped++
		}
	}
	t.Logf("%d pairs seen connect in audit mode (0 AUDIT) and enforced; %d pairs not seen dropped", len(seen), dropped)
	if dropped == 0 {
		t.Error("no pair was dropped")
	}
}
