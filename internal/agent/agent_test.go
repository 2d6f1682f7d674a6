package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/rampartnet/rampart/internal/dnsproxy"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/policy"
)

type testLog struct{ t testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

type harness struct {
	t    testing.TB
	cfg  Config
	net  *fakeNetwork
	dp   *fakeKernel
	prox *fakeProxy
	// proxyErr makes opening the proxy fail (Envoy missing).
	proxyErr error
	proxyLog func(flow.AccessLog) // the agent's access log callback
	a        *Agent
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	sock, err := os.MkdirTemp("", "rp-agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	h := &harness{t: t, net: newFakeNetwork("unit", DefaultPodCIDR), dp: newFakeKernel(), prox: &fakeProxy{}}
	h.cfg = Config{
		Instance: "unit",
		StateDir: filepath.Join(t.TempDir(), "state"),
		Socket:   filepath.Join(sock, "s.sock"),
		BPFDir:   "/nonexistent",
		Network:  h.net,
		Logger:   slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	h.start()
	t.Cleanup(func() {
		if h.a != nil {
			h.a.Close()
		}
	})
	return h
}

func (h *harness) start() {
	h.t.Helper()
	dp := h.dp
	h.cfg.OpenKernel = func(Config) (Kernel, error) { return dp.kernel(), nil }
	h.cfg.OpenDNSProxy = func(_ Config, _ string, listen netip.AddrPort, _ dnsproxy.Policy) (DNSProxy, error) {
		return fakeDNSProxy{listen}, nil
	}
	h.cfg.OpenProxy = func(_ Config, _ string, onLog func(flow.AccessLog)) (Proxy, error) {
		if h.proxyErr != nil {
			return nil, h.proxyErr
		}
		h.proxyLog = onLog
		return h.prox, nil
	}
	a, err := New(h.cfg)
	if err != nil {
		h.t.Fatalf("New: %v", err)
	}
	h.a = a
}

// restart closes the agent and starts a new one on the same "pinned" datapath state.
func (h *harness) restart() {
	h.t.Helper()
	h.a.Close()
	h.dp = h.dp.reopen()
	h.start()
}

func (h *harness) add(ns, name string, l map[string]string) api.Endpoint {
	h.t.Helper()
	ep, err := h.a.AddEndpoint(context.Background(), api.EndpointSpec{Namespace: ns, Name: name, Labels: l})
	if err != nil {
		h.t.Fatalf("adding %s/%s: %v", ns, name, err)
	}
	return ep
}

func (h *harness) apply(src, doc string) (api.ChangeResult, error) {
	return h.a.Apply(context.Background(), api.ApplyRequest{Documents: []api.Document{{Source: src, Data: doc}}})
}

const denyAllIngressY = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: y}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`

// allowY443 selects every endpoint of y, so applying it changes several endpoints.
const allowY443 = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-443, namespace: y}
spec:
  podSelector: {}
  ingress:
  - ports: [{port: 443}]
`

const allowFromX = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-x, namespace: y}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: x}}
    ports: [{port: 80}]
`

func TestReplicasShareIdentityAndNamespaceLabelsChangeIt(t *testing.T) {
	h := newHarness(t)
	a1 := h.add("x", "a1", map[string]string{"app": "web"})
	a2 := h.add("x", "a2", map[string]string{"app": "web"})
	b := h.add("y", "b", map[string]string{"app": "web"})
	if a1.Identity != a2.Identity || a1.Identity < identity.FirstEndpoint {
		t.Fatalf("replicas: identities %d and %d", a1.Identity, a2.Identity)
	}
	if b.Identity == a1.Identity {
		t.Fatal("endpoints of different namespaces share an identity")
	}
	if a1.IP == a2.IP || a1.EpID == a2.EpID {
		t.Fatalf("replicas share address or ep id: %+v %+v", a1, a2)
	}
	if _, err := h.a.LabelNamespace(context.Background(), "x", api.LabelChange{Set: map[string]string{"team": "blue"}}); err != nil {
		t.Fatal(err)
	}
	got, _ := h.a.GetEndpoint(context.Background(), "x", "a1")
	if got.Identity == a1.Identity {
		t.Fatal("namespace label did not change the identity")
	}
	want := "io.cilium.k8s.namespace.labels.team=blue"
	if !contains(got.IdentityLabels, want) {
		t.Fatalf("identity labels %v lack %s", got.IdentityLabels, want)
	}
	// The dataplane got the new identity.
	_, eps := h.dp.snapshot()
	found := false
	for _, ep := range eps {
		if ep.info.EpID == got.EpID {
			found = ep.info.Identity == got.Identity
		}
	}
	if !found {
		t.Fatal("datapath endpoint identity not updated")
	}
	// The old identity is released; identity list has reserved ones and the endpoints.
	ids, _ := h.a.ListIdentities(context.Background())
	var sawHost, sawOld bool
	for _, id := range ids {
		sawHost = sawHost || (id.ID == identity.Host && id.Kind == "reserved")
		sawOld = sawOld || id.ID == a1.Identity
		if id.ID == got.Identity && !reflect.DeepEqual(id.Endpoints, []string{"x/a1", "x/a2"}) {
			t.Errorf("identity %d endpoints %v", id.ID, id.Endpoints)
		}
	}
	if !sawHost || sawOld {
		t.Errorf("identity list: host %v, old identity still there %v: %+v", sawHost, sawOld, ids)
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func TestAddEndpointValidation(t *testing.T) {
	h := newHarness(t)
	h.add("x", "a", nil)
	bad := []api.EndpointSpec{
		{Namespace: "X", Name: "a"},
		{Namespace: "x", Name: "a"}, // exists
		{Namespace: "x", Name: "b", Labels: map[string]string{"io.kubernetes.pod.namespace": "y"}},
		{Namespace: "x", Name: "b", Labels: map[string]string{"a": "b c"}},
		{Namespace: "x", Name: "b", IP: "198.18.0.1"}, // router
		{Namespace: "x", Name: "b", IP: "198.18.0.2"}, // used by x/a
		{Namespace: "x", Name: "b", IP: "10.0.0.1"},   // outside the range
		{Namespace: "x", Name: "b", Ports: []api.NamedPort{{Name: "http", Port: 0}}},
		{Namespace: "x", Name: "b", Ports: []api.NamedPort{{Name: "http", Port: 80, Protocol: "ICMP"}}},
	}
	for _, spec := range bad {
		if _, err := h.a.AddEndpoint(context.Background(), spec); err == nil {
			t.Errorf("AddEndpoint(%+v) succeeded", spec)
		}
	}
	if h.net.count() != 1 {
		t.Fatalf("refused adds created endpoints: %d", h.net.count())
	}
	ep, err := h.a.AddEndpoint(context.Background(), api.EndpointSpec{Namespace: "x", Name: "b", IP: "198.18.7.7",
		Ports: []api.NamedPort{{Name: "http", Port: 8080, Protocol: "tcp"}}})
	if err != nil || ep.IP != "198.18.7.7" || len(ep.Ports) != 1 || ep.Ports[0].Protocol != "TCP" {
		t.Fatalf("AddEndpoint with --ip/--port: %+v, %v", ep, err)
	}
}

func TestAddEndpointFailureCleansUp(t *testing.T) {
	h := newHarness(t)
	h.dp.failAttach = true
	if _, err := h.a.AddEndpoint(context.Background(), api.EndpointSpec{Namespace: "x", Name: "a"}); err == nil {
		t.Fatal("add succeeded with attach failing")
	}
	if h.net.count() != 0 {
		t.Fatal("failed add left its namespace behind")
	}
	eps, _ := h.a.ListEndpoints(context.Background())
	if len(eps) != 0 {
		t.Fatalf("failed add recorded: %+v", eps)
	}
	h.dp.failAttach = false
	h.add("x", "a", nil)
}

func TestApplyFailureRestoresPreviousState(t *testing.T) {
	h := newHarness(t)
	h.add("x", "a", map[string]string{"pod": "a"})
	h.add("y", "b", map[string]string{"pod": "b"})
	h.add("y", "c", map[string]string{"pod": "c"})
	if _, err := h.apply("allow.yaml", allowFromX); err != nil {
		t.Fatal(err)
	}
	ipBefore, epsBefore := h.dp.snapshot()
	polsBefore, _ := h.a.ListPolicies(context.Background())
	stateBefore, _ := os.ReadFile(statePath(h.cfg.StateDir))

	// allow-443 changes b and c: the second endpoint update fails.
	h.dp.failEndpointAfter = 1
	if _, err := h.apply("allow443.yaml", allowY443); err == nil {
		t.Fatal("apply succeeded with the datapath failing")
	}
	ipAfter, epsAfter := h.dp.snapshot()
	if !reflect.DeepEqual(ipBefore, ipAfter) || !reflect.DeepEqual(epsBefore, epsAfter) {
		t.Fatalf("datapath not restored:\nbefore %+v\nafter  %+v", epsBefore, epsAfter)
	}
	polsAfter, _ := h.a.ListPolicies(context.Background())
	if !reflect.DeepEqual(polsBefore, polsAfter) {
		t.Fatal("policies changed after failed apply")
	}
	stateAfter, _ := os.ReadFile(statePath(h.cfg.StateDir))
	if string(stateBefore) != string(stateAfter) {
		t.Fatal("state file changed after failed apply")
	}
	st, _ := h.a.Status(context.Background())
	if st.Degraded != "" {
		t.Fatalf("degraded after a successful rollback: %s", st.Degraded)
	}
	// A refused manifest does not reach the datapath at all.
	h.dp.failEndpointAfter = 0
	if _, err := h.apply("bad.yaml", "kind: NetworkPolicy\nmetadata: {name: x}\nspec: {bogus: 1}\n"); err == nil ||
		!strings.Contains(err.Error(), "bad.yaml") {
		t.Fatalf("bad manifest: %v", err)
	}
	if h.dp.failEndpointAfter != 0 {
		t.Fatal("a refused manifest reached the datapath")
	}
	h.dp.failEndpointAfter = -1
	if _, err := h.apply("deny.yaml", denyAllIngressY); err != nil {
		t.Fatal(err)
	}
}

func TestFailedRollbackIsReportedAndRepaired(t *testing.T) {
	h := newHarness(t)
	h.add("y", "b", map[string]string{"pod": "b"})
	h.dp.failAll = true
	if _, err := h.apply("deny.yaml", denyAllIngressY); err == nil {
		t.Fatal("apply succeeded with the datapath failing")
	}
	st, _ := h.a.Status(context.Background())
	if st.Degraded == "" {
		t.Fatal("failed rollback not reported in status")
	}
	h.dp.failAll = false
	if _, err := h.apply("deny.yaml", denyAllIngressY); err != nil {
		t.Fatal(err)
	}
	st, _ = h.a.Status(context.Background())
	_, eps := h.dp.snapshot()
	b, _ := h.a.GetEndpoint(context.Background(), "y", "b")
	if st.Degraded != "" || len(eps) != 1 {
		t.Fatalf("not repaired: %q %+v", st.Degraded, eps)
	}
	for _, ep := range eps {
		if !ep.pol.EnforceIngress || ep.info.Identity != b.Identity {
			t.Fatalf("datapath endpoint after repair: %+v", ep)
		}
	}
}

func TestRuleIDsAndRestart(t *testing.T) {
	h := newHarness(t)
	h.add("x", "a", map[string]string{"pod": "a"})
	b := h.add("y", "b", map[string]string{"pod": "b"})
	if _, err := h.a.LabelNamespace(context.Background(), "x", api.LabelChange{Set: map[string]string{"ns": "x"}}); err != nil {
		t.Fatal(err)
	}
	res, err := h.apply("allow.yaml", allowFromX)
	if err != nil || len(res.Changes) != 1 || res.Changes[0].Action != "created" {
		t.Fatalf("apply: %+v %v", res, err)
	}
	pols, _ := h.a.ListPolicies(context.Background())
	id := pols[0].Rules[0].ID
	res, _ = h.apply("allow.yaml", allowFromX)
	if res.Changes[0].Action != "unchanged" {
		t.Fatalf("reapply: %+v", res)
	}
	res, _ = h.apply("allow.yaml", strings.Replace(allowFromX, "port: 80", "port: 81", 1))
	pols2, _ := h.a.ListPolicies(context.Background())
	if res.Changes[0].Action != "configured" || pols2[0].Rules[0].ID != id {
		t.Fatalf("update: %+v, rule ids %d -> %d", res, id, pols2[0].Rules[0].ID)
	}

	snapshot := func() []any {
		eps, _ := h.a.ListEndpoints(context.Background())
		ids, _ := h.a.ListIdentities(context.Background())
		ps, _ := h.a.ListPolicies(context.Background())
		nss, _ := h.a.ListNamespaces(context.Background())
		return []any{eps, ids, ps, nss}
	}
	before := snapshot()
	_, epsBefore := h.dp.snapshot()
	h.restart()
	if after := snapshot(); !reflect.DeepEqual(before, after) {
		t.Fatalf("state changed across restart:\n%+v\n%+v", before, after)
	}
	_, epsAfter := h.dp.snapshot()
	if !reflect.DeepEqual(epsBefore, epsAfter) {
		t.Fatal("datapath endpoints changed across restart")
	}
	// Enforcement came back from the stored state.
	got, _ := h.a.GetEndpoint(context.Background(), "y", "b")
	if !got.EnforceIngress || got.Identity != b.Identity || got.Counters == nil {
		t.Fatalf("after restart: %+v", got)
	}
	// A dataplane endpoint the state does not know is removed on start.
	h.dp.fakeEndpoints.mu.Lock()
	h.dp.eps[9999] = fakeEP{info: datapath.EndpointInfo{EpID: 77, Identity: 300}}
	h.dp.fakeEndpoints.mu.Unlock()
	h.restart()
	if _, ok := h.dp.InstalledEndpoints()[9999]; ok {
		t.Fatal("stale dataplane endpoint kept across restart")
	}
	// New endpoint ids do not reuse a deleted one's.
	if err := h.a.DeleteEndpoint(context.Background(), "x", "a"); err != nil {
		t.Fatal(err)
	}
	c := h.add("x", "c", nil)
	if c.EpID <= b.EpID {
		t.Fatalf("ep id %d reused (b has %d)", c.EpID, b.EpID)
	}
}

func TestObserveDecoratesAndFilters(t *testing.T) {
	h := newHarness(t)
	a := h.add("x", "a", map[string]string{"pod": "a"})
	b := h.add("y", "b", map[string]string{"pod": "b"})
	if _, err := h.apply("allow.yaml", allowFromX); err != nil {
		t.Fatal(err)
	}
	pols, _ := h.a.ListPolicies(context.Background())
	ruleID := pols[0].Rules[0].ID
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := follow(ctx, h.a, api.FlowFilter{Verdict: "forwarded"})
	ipA, ipB := netip.MustParseAddr(a.IP), netip.MustParseAddr(b.IP)
	h.dp.events <- flow.Event{Time: time.Now(), Source: ipA, Destination: ipB, SourcePort: 40000, DestinationPort: 80, EpID: b.EpID,
		SrcIdentity: a.Identity, DstIdentity: b.Identity, Type: flow.EventDrop, Verdict: flow.VerdictDropped, Reason: flow.ReasonPolicyDefaultDeny, Direction: policy.Ingress, Protocol: 6}
	h.dp.events <- flow.Event{Time: time.Now(), Source: ipA, Destination: ipB, SourcePort: 40001, DestinationPort: 80, EpID: b.EpID, RuleID: ruleID,
		SrcIdentity: a.Identity, DstIdentity: b.Identity, Type: flow.EventNew, Verdict: flow.VerdictForwarded, Direction: policy.Ingress, Protocol: 6}
	var f api.Flow
	select {
	case f = <-got:
	case <-ctx.Done():
		t.Fatal("no flow observed")
	}
	if f.Verdict != "FORWARDED" || f.Source.Name != "a" || f.Dest.Namespace != "y" || f.Endpoint != "y/b" ||
		f.Rule == nil || f.Rule.Policy != "NetworkPolicy/y/allow-x" || f.Rule.Rule == "" || f.Source.Port != 40001 ||
		!contains(f.Source.Labels, "pod=a") || f.Protocol != "TCP" || f.Direction != "ingress" {
		t.Fatalf("flow: %+v rule %+v", f, f.Rule)
	}
	// History: both events, filters apply.
	var hist []api.Flow
	h.a.Observe(context.Background(), api.ObserveRequest{SinceStart: true, Filter: api.FlowFilter{Labels: map[string]string{"pod": "a"}}}, func(f api.Flow) error {
		hist = append(hist, f)
		return nil
	})
	if len(hist) != 2 || hist[0].Reason != "policy-default-deny" {
		t.Fatalf("history: %+v", hist)
	}
	hist = nil
	h.a.Observe(context.Background(), api.ObserveRequest{Last: 1}, func(f api.Flow) error {
		hist = append(hist, f)
		return nil
	})
	if len(hist) != 1 || hist[0].Verdict != "FORWARDED" {
		t.Fatalf("last 1: %+v", hist)
	}

	// A flow the send-side verdict checks keeps its flags, by name.
	h.dp.events <- flow.Event{Time: time.Now(), Source: ipA, Destination: ipB, SourcePort: 40002, DestinationPort: 80, EpID: b.EpID, RuleID: ruleID,
		SrcIdentity: a.Identity, DstIdentity: b.Identity, Type: flow.EventNew, Verdict: flow.VerdictForwarded, Direction: policy.Ingress, Protocol: 6,
		Flags: flow.FlagL7Ingress | flow.FlagSendSide}
	select {
	case f = <-got:
	case <-ctx.Done():
		t.Fatal("send-side flow not observed")
	}
	if f.Type != "new" || f.Source.Port != 40002 || !slices.Equal(f.Flags, []string{"l7-ingress", "send-side"}) || f.FromProxy || f.Reason != "" {
		t.Fatalf("send-side flow: %+v", f)
	}
}

// follow starts an observer of the flows matching filter and returns, once it is
// subscribed, the channel they arrive on until ctx ends.
func follow(ctx context.Context, a *Agent, filter api.FlowFilter) <-chan api.Flow {
	got := make(chan api.Flow, 16)
	go a.Observe(ctx, api.ObserveRequest{Follow: true, Filter: filter}, func(f api.Flow) error {
		got <- f
		return nil
	})
	for !subscribed(a) && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	return got
}

func subscribed(a *Agent) bool {
	a.flows.mu.Lock()
	defer a.flows.mu.Unlock()
	return len(a.flows.subs) > 0
}

func TestStateFileIsAtomicAndComplete(t *testing.T) {
	h := newHarness(t)
	h.add("x", "a", map[string]string{"pod": "a"})
	if _, err := h.apply("allow.yaml", allowFromX); err != nil {
		t.Fatal(err)
	}
	st, err := loadState(h.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Endpoints) != 1 || len(st.Policies) != 1 || len(st.Identities) == 0 || st.Namespaces["x"][labels.KeyNamespaceName] != "x" {
		t.Fatalf("state: %+v", st)
	}
	// save writes the encoding it compares with the cursor put back: the file is what
	// encoding/json writes for the state, cursor included.
	if st.NextEpID < 2 {
		t.Fatalf("endpoint id cursor %d after an endpoint was added", st.NextEpID)
	}
	file, err := os.ReadFile(statePath(h.cfg.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	st.Endpoints = nil
	want, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if string(file) != string(want)+"\n" {
		t.Fatalf("state.json is\n%s\nwant\n%s", file, want)
	}
	// The state file, the endpoint directory, the instance lock and the ownership record,
	// no temporary files.
	if got := dirNames(t, h.cfg.StateDir); got != lockName+" endpoints "+ownedFileName+" state.json" {
		t.Fatalf("state dir holds %v, want only %s, endpoints, %s and state.json", got, lockName, ownedFileName)
	}
	if got := dirNames(t, endpointDir(h.cfg.StateDir)); got != "x_a.json" {
		t.Fatalf("endpoint dir holds %v, want only x_a.json", got)
	}
}

func dirNames(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}

// An endpoint change writes that endpoint's file and nothing else: not the other
// endpoints, not state.json when the namespaces, identities and policies stay as they are.
func TestEndpointChangeWritesOnlyItsOwnState(t *testing.T) {
	h := newHarness(t)
	for i := range 20 {
		h.add("x", fmt.Sprintf("p%d", i), map[string]string{"app": "web"})
	}
	if _, err := h.apply("allow.yaml", allowFromX); err != nil {
		t.Fatal(err)
	}
	stat := func(path string) os.FileInfo {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	before := map[string]os.FileInfo{statePath(h.cfg.StateDir): stat(statePath(h.cfg.StateDir))}
	for i := range 20 {
		p := endpointFile(h.cfg.StateDir, "x", fmt.Sprintf("p%d", i))
		before[p] = stat(p)
	}
	h.add("x", "new", map[string]string{"app": "web"})
	if err := h.a.DeleteEndpoint(context.Background(), "x", "p3"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(endpointFile(h.cfg.StateDir, "x", "new")); err != nil {
		t.Fatalf("the added endpoint has no file: %v", err)
	}
	if _, err := os.Stat(endpointFile(h.cfg.StateDir, "x", "p3")); !os.IsNotExist(err) {
		t.Fatalf("the deleted endpoint's file is still there: %v", err)
	}
	for p, fi := range before {
		if strings.HasSuffix(p, "x_p3.json") {
			continue
		}
		// A rewrite replaces the file (rename): another inode.
		if now := stat(p); !os.SameFile(fi, now) || !now.ModTime().Equal(fi.ModTime()) {
			t.Errorf("%s was rewritten by another endpoint's change", p)
		}
	}
	// A new identity (other labels) is node state: state.json changes with it.
	old, _ := os.ReadFile(statePath(h.cfg.StateDir))
	h.add("x", "other", map[string]string{"app": "db"})
	if now, _ := os.ReadFile(statePath(h.cfg.StateDir)); string(now) == string(old) {
		t.Error("state.json not rewritten for a new identity")
	}
	h.restart()
	eps, _ := h.a.ListEndpoints(context.Background())
	if len(eps) != 21 {
		t.Fatalf("after restart: %d endpoints, want 21", len(eps))
	}
}

// A version 1 state directory (every endpoint in state.json) is read, and the first save
// moves its endpoints into their own files.
func TestStateVersion1Migrates(t *testing.T) {
	h := newHarness(t)
	a := h.add("x", "a", map[string]string{"pod": "a"})
	h.add("y", "b", map[string]string{"pod": "b"})
	if _, err := h.apply("allow.yaml", allowFromX); err != nil {
		t.Fatal(err)
	}
	h.a.Close()
	// Rewrite the directory as version 1 had it.
	st, err := loadState(h.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	st.Version = 1
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(endpointDir(h.cfg.StateDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(statePath(h.cfg.StateDir), b, 0o600); err != nil {
		t.Fatal(err)
	}

	h.dp = h.dp.reopen()
	h.start()
	got, err := h.a.GetEndpoint(context.Background(), "x", "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.IP != a.IP || got.EpID != a.EpID || got.Identity != a.Identity {
		t.Fatalf("after migration: %+v, want %+v", got, a)
	}
	if names := dirNames(t, endpointDir(h.cfg.StateDir)); names != "x_a.json y_b.json" {
		t.Fatalf("endpoint files after migration: %q", names)
	}
	raw, err := os.ReadFile(statePath(h.cfg.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	var v2 struct {
		Version   int               `json:"version"`
		Endpoints []json.RawMessage `json:"endpoints"`
	}
	if err := json.Unmarshal(raw, &v2); err != nil {
		t.Fatal(err)
	}
	if v2.Version != stateVersion || len(v2.Endpoints) != 0 {
		t.Fatalf("state.json after migration: version %d with %d endpoints", v2.Version, len(v2.Endpoints))
	}
	// An id allocated now does not reuse a stored one.
	c := h.add("x", "c", map[string]string{"pod": "c"})
	if c.EpID == a.EpID || c.EpID == got.EpID {
		t.Fatalf("new endpoint reuses ep id %d", c.EpID)
	}
}

var _ = mapstate.State{}

// The dataplane gets each endpoint's address (its only allowed source), and the host's
// admission follows Config.HostTraffic.
func TestEndpointAddressAndHostTraffic(t *testing.T) {
	h := newHarness(t)
	a := h.add("x", "a", nil)
	if _, err := h.apply("deny.yaml", strings.ReplaceAll(denyAllIngressY, "namespace: y", "namespace: x")); err != nil {
		t.Fatal(err)
	}
	hostKey := mapstate.Key{Identity: identity.Host, Direction: policy.Ingress, Protocol: policy.ProtoAny}
	found := false
	for _, ep := range h.dp.eps {
		if ep.info.EpID != a.EpID {
			continue
		}
		found = true
		if ep.info.Addr.String() != a.IP {
			t.Errorf("endpoint address in the dataplane %v, want %s", ep.info.Addr, a.IP)
		}
		if v, ok := ep.pol.Entries[hostKey]; !ok || v.RuleID != mapstate.HostTrafficRuleID {
			t.Errorf("default --host-traffic=allow: host entry %+v (present %v)", v, ok)
		}
	}
	if !found {
		t.Fatal("endpoint not in the dataplane")
	}

	h.a.Close()
	h.a = nil
	h.cfg.HostTraffic = HostTrafficPolicy
	h.dp = h.dp.reopen()
	h.start()
	for _, ep := range h.dp.eps {
		if _, ok := ep.pol.Entries[hostKey]; ok && ep.info.EpID == a.EpID {
			t.Error("--host-traffic=policy: the host is still admitted")
		}
	}

	h.cfg.HostTraffic = "open"
	if _, err := New(h.cfg); err == nil || !strings.Contains(err.Error(), `host traffic "open"`) {
		t.Errorf("bad host traffic mode: %v", err)
	}
}

// endpointKeys keeps the sorted key order across changes without sorting again: after any
// sequence of adds and deletes it equals a fresh sort.
func TestEndpointKeysFollowsChanges(t *testing.T) {
	m := newModel()
	var prev *desired
	for step := range 200 {
		key := fmt.Sprintf("ns%d/ep%d", step%7, (step*37)%23)
		if _, ok := m.endpoints[key]; ok && step%3 != 0 {
			delete(m.endpoints, key)
		} else {
			m.endpoints[key] = &EndpointRecord{}
		}
		keys := endpointKeys(m, prev)
		if want := sortedKeys(m.endpoints); !reflect.DeepEqual(keys, want) && len(want) > 0 {
			t.Fatalf("step %d: %v, want %v", step, keys, want)
		}
		d := &desired{identities: map[string]identity.Identity{}, keys: keys}
		for _, k := range keys {
			d.identities[k] = 1
		}
		prev = d
	}
}

// TestConfigAttach: the attach mode defaults to cls_bpf filters (tc), and an unknown one is
// refused, naming it.
func TestConfigAttach(t *testing.T) {
	cfg := Config{}.WithDefaults()
	if cfg.Attach != datapath.AttachTC {
		t.Errorf("default attach mode %q, want %q", cfg.Attach, datapath.AttachTC)
	}
	if err := cfg.validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	cfg.Attach = datapath.AttachTCX
	if err := cfg.validate(); err != nil {
		t.Errorf("--attach=tcx: %v", err)
	}
	cfg.Attach = "xdp"
	if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), `attach mode "xdp"`) {
		t.Errorf("--attach=xdp: %v", err)
	}
}

// TestConfigVXLANUnderlay: VXLAN packets leave over IPv4 by default, over IPv6 when asked,
// and an unknown family is refused, naming it.
func TestConfigVXLANUnderlay(t *testing.T) {
	cfg := Config{}.WithDefaults()
	if cfg.VXLANUnderlay != overlay.UnderlayIPv4 {
		t.Errorf("default VXLAN underlay %q, want %q", cfg.VXLANUnderlay, overlay.UnderlayIPv4)
	}
	cfg.VXLANUnderlay = overlay.UnderlayIPv6
	if err := cfg.validate(); err != nil {
		t.Errorf("--vxlan-underlay=ipv6: %v", err)
	}
	cfg.VXLANUnderlay = "ipx"
	if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), `VXLAN underlay "ipx"`) {
		t.Errorf("--vxlan-underlay=ipx: %v", err)
	}
}
