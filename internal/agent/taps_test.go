package agent

import (
	"context"
	"errors"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/tap"
)

const tapWeb = `apiVersion: rampart.io/v1alpha1
kind: TapContract
metadata: {name: web-http}
spec:
  source: {selector: {matchLabels: {app: web}}}
  monitor: sec/ids
  match: {direction: Both, protocol: TCP, ports: [80]}
  action: Mirror
`

const tapDB = `apiVersion: rampart.io/v1alpha1
kind: TapContract
metadata: {name: db-in}
spec:
  source: {endpoint: shop/db}
  monitor: sec/ids
  match: {direction: Ingress, protocol: TCP, ports: [5432]}
  action: Redirect
`

// tapAll overlaps web-http on every web endpoint (it taps everything of them).
const tapAll = `apiVersion: crd.antrea.io/v1alpha2
kind: TrafficControl
metadata: {name: all-web}
spec:
  appliedTo: {podSelector: {matchLabels: {app: web}}}
  direction: Ingress
  action: Mirror
  targetPort: {device: {name: sec/ids}}
`

// webTapped is an agent with taps, a monitor sec/ids, endpoints shop/web-1 (app=web) and
// shop/db, and contract web-http.
func webTapped(t *testing.T) (*harness, *fakeTaps) {
	t.Helper()
	h := newTapHarness(t)
	h.addMonitor("sec", "ids")
	h.add("shop", "web-1", map[string]string{"app": "web"})
	h.add("shop", "db", nil)
	if _, err := h.addTaps(tapWeb); err != nil {
		t.Fatal(err)
	}
	return h, h.dp.taps
}

func newTapHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t)
	h.dp.taps = &fakeTaps{}
	h.restart()
	return h
}

func (h *harness) addTaps(docs ...string) (api.ChangeResult, error) {
	var ds []api.Document
	for i, d := range docs {
		ds = append(ds, api.Document{Source: "tap" + string(rune('0'+i)) + ".yaml", Data: d})
	}
	return h.a.AddTaps(context.Background(), api.ApplyRequest{Documents: ds})
}

func (h *harness) addMonitor(ns, name string) {
	h.t.Helper()
	if _, err := h.a.AddEndpoint(context.Background(), api.EndpointSpec{Namespace: ns, Name: name, Labels: map[string]string{"app": "ids"}, Monitor: true}); err != nil {
		h.t.Fatalf("adding monitor %s/%s: %v", ns, name, err)
	}
}

func wantInstalled(t *testing.T, f *fakeTaps, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	if got := f.installed(); !slices.Equal(got, want) {
		t.Errorf("installed tap rules:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// Without a tap table the agent refuses contracts, by the API and by apply, and nothing
// changes.
func TestTapsRefusedWithoutTapTable(t *testing.T) {
	h := newHarness(t)
	h.add("shop", "web", map[string]string{"app": "web"})
	_, err := h.addTaps(tapWeb)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusNotImplemented || !strings.Contains(err.Error(), "the dataplane has no taps yet") {
		t.Fatalf("AddTaps without taps: %v", err)
	}
	if _, err := h.apply("taps.yaml", tapWeb); err == nil || !strings.Contains(err.Error(), "no taps yet") {
		t.Fatalf("apply of a TapContract without taps: %v", err)
	}
	if ts, _ := h.a.ListTaps(context.Background()); len(ts) != 0 {
		t.Errorf("taps listed after refusals: %+v", ts)
	}
}

// Contracts are resolved against the endpoints on every change: a replica added, a
// relabel, an endpoint deleted, the monitor created late; a redirect without its monitor
// installs a drop rule.
func TestTapsFollowEndpoints(t *testing.T) {
	h := newTapHarness(t)
	f := h.dp.taps
	web1 := h.add("shop", "web-1", map[string]string{"app": "web"})
	db := h.add("shop", "db", nil)
	if _, err := h.addTaps(tapWeb, tapDB); err != nil {
		t.Fatal(err)
	}
	// No monitor yet: the mirror passes, the redirect fails closed.
	wantInstalled(t, f,
		"shop/db[0] db-in ingress TCP ports 5432 drop",
		"shop/web-1[0] web-http both TCP ports 80 pass")
	if f.rules[0].EndpointID != db.EpID || f.rules[1].EndpointID != web1.EpID {
		t.Errorf("rules name endpoint ids %d and %d, want %d and %d", f.rules[0].EndpointID, f.rules[1].EndpointID, db.EpID, web1.EpID)
	}
	got, err := h.a.GetTap(context.Background(), "db-in")
	if err != nil || got.MonitorProblem != "monitor sec/ids does not exist" || got.FailMode != "closed" || !slices.Equal(got.Endpoints, []string{"shop/db"}) {
		t.Errorf("GetTap(db-in) = %+v, %v", got, err)
	}

	h.addMonitor("sec", "ids")
	wantInstalled(t, f,
		"shop/db[0] db-in ingress TCP ports 5432 redirect -> sec/ids",
		"shop/web-1[0] web-http both TCP ports 80 mirror -> sec/ids")

	h.add("shop", "web-2", map[string]string{"app": "web"})
	wantInstalled(t, f,
		"shop/db[0] db-in ingress TCP ports 5432 redirect -> sec/ids",
		"shop/web-1[0] web-http both TCP ports 80 mirror -> sec/ids",
		"shop/web-2[0] web-http both TCP ports 80 mirror -> sec/ids")

	if _, err := h.a.LabelEndpoint(context.Background(), "shop", "web-1", api.LabelChange{Set: map[string]string{"app": "old"}}); err != nil {
		t.Fatal(err)
	}
	if err := h.a.DeleteEndpoint(context.Background(), "shop", "db"); err != nil {
		t.Fatal(err)
	}
	wantInstalled(t, f, "shop/web-2[0] web-http both TCP ports 80 mirror -> sec/ids")

	// The monitor gone: the mirror passes again, nothing blocks.
	if err := h.a.DeleteEndpoint(context.Background(), "sec", "ids"); err != nil {
		t.Fatal(err)
	}
	wantInstalled(t, f, "shop/web-2[0] web-http both TCP ports 80 pass")

	// Contracts survive a restart and are installed again.
	replaces := f.replaces
	h.restart()
	if h.dp.taps.replaces != replaces+1 {
		t.Errorf("restart replaced the taps %d times, want once", h.dp.taps.replaces-replaces)
	}
	wantInstalled(t, h.dp.taps, "shop/web-2[0] web-http both TCP ports 80 pass")
	ts, _ := h.a.ListTaps(context.Background())
	if len(ts) != 2 || ts[0].Name != "db-in" || ts[1].Name != "web-http" || ts[1].Match != "both TCP ports 80" || ts[1].Action != "mirror" {
		t.Errorf("after restart: %+v", ts)
	}
}

// Overlapping contracts are refused as one transaction naming both; a non-monitor as
// monitor is refused; nothing of the request is applied.
func TestTapsOverlapRefused(t *testing.T) {
	h, f := webTapped(t)
	before := f.installed()
	stateBefore, _ := os.ReadFile(statePath(h.cfg.StateDir))

	// db-in is fine, all-web overlaps web-http: neither is applied.
	_, err := h.addTaps(tapDB, tapAll)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(err.Error(), "tap contracts all-web and web-http overlap on endpoint shop/web-1") {
		t.Fatalf("overlapping contracts: %v", err)
	}
	wantInstalled(t, f, before...)
	if stateAfter, _ := os.ReadFile(statePath(h.cfg.StateDir)); string(stateAfter) != string(stateBefore) {
		t.Error("the state changed after a refused request")
	}
	if _, err := h.a.GetTap(context.Background(), "db-in"); err == nil {
		t.Error("db-in was applied with the refused request")
	}
	// The same through apply, mixed with a policy: nothing applied.
	_, err = h.apply("mixed.yaml", denyAllIngressY+"---\n"+tapAll)
	if err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Fatalf("apply with an overlapping contract: %v", err)
	}
	if ps, _ := h.a.ListPolicies(context.Background()); len(ps) != 0 {
		t.Errorf("policies applied with a refused contract: %d", len(ps))
	}

	// A monitor that is no monitor.
	bad := strings.Replace(tapDB, "monitor: sec/ids", "monitor: shop/web-1", 1)
	if _, err := h.addTaps(bad); err == nil || !strings.Contains(err.Error(), "endpoint shop/web-1 is not a monitor") {
		t.Errorf("a non-monitor as monitor: %v", err)
	}
	// Two contracts on one endpoint that does not exist yet.
	ghost := strings.NewReplacer("name: db-in", "name: ghost-1", "endpoint: shop/db", "endpoint: shop/ghost").Replace(tapDB)
	ghost2 := strings.Replace(ghost, "name: ghost-1", "name: ghost-2", 1)
	if _, err := h.addTaps(ghost, ghost2); err == nil || !strings.Contains(err.Error(), "tap contracts ghost-1 and ghost-2 overlap on endpoint shop/ghost") {
		t.Errorf("overlap on an endpoint to come: %v", err)
	}
	// A monitor as source.
	monSrc := strings.NewReplacer("endpoint: shop/db", "endpoint: sec/ids", "monitor: sec/ids", "monitor: sec/other").Replace(tapDB)
	if _, err := h.addTaps(monSrc); err == nil || !strings.Contains(err.Error(), "sec/ids is a monitor, and monitors are not tapped") {
		t.Errorf("a monitor as source: %v", err)
	}
	// A policy through the tap API.
	if _, err := h.addTaps(denyAllIngressY); err == nil || !strings.Contains(err.Error(), "only TapContract and TrafficControl") {
		t.Errorf("a policy through AddTaps: %v", err)
	}
	// The same name in the other kind.
	other := strings.Replace(tapAll, "name: all-web", "name: web-http", 1)
	if _, err := h.addTaps(other); err == nil || !strings.Contains(err.Error(), "a TapContract of that name exists") {
		t.Errorf("a TrafficControl named like a TapContract: %v", err)
	}

	// Made disjoint: web-http ingress only, all-web egress only.
	webIn := strings.Replace(tapWeb, "direction: Both", "direction: Ingress", 1)
	allOut := strings.Replace(tapAll, "direction: Ingress", "direction: Egress", 1)
	res, err := h.addTaps(webIn, allOut, tapDB)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changes) != 3 || res.Changes[0].Action != "configured" || res.Changes[1].Action != "created" {
		t.Errorf("changes %+v", res.Changes)
	}
	wantInstalled(t, f,
		"shop/db[0] db-in ingress TCP ports 5432 redirect -> sec/ids",
		"shop/web-1[0] all-web egress any mirror -> sec/ids",
		"shop/web-1[1] web-http ingress TCP ports 80 mirror -> sec/ids")

	// A relabel can make accepted contracts meet: not refused, reported on both.
	h.add("shop", "cache", nil)
	cacheAll := strings.NewReplacer("name: db-in", "name: cache-all", "endpoint: shop/db", "endpoint: shop/cache",
		"protocol: TCP, ports: [5432]", "protocol: Any").Replace(tapDB)
	if _, err := h.addTaps(cacheAll); err != nil {
		t.Fatal(err)
	}
	if _, err := h.a.LabelEndpoint(context.Background(), "shop", "cache", api.LabelChange{Set: map[string]string{"app": "web"}}); err != nil {
		t.Fatalf("relabel refused: %v", err)
	}
	for name, want := range map[string]string{"cache-all": "web-http on shop/cache", "web-http": "cache-all on shop/cache"} {
		if got, _ := h.a.GetTap(context.Background(), name); !slices.Equal(got.Conflicts, []string{want}) {
			t.Errorf("%s conflicts %v, want %q", name, got.Conflicts, want)
		}
	}
	wantInstalled(t, f,
		"shop/cache[0] all-web egress any mirror -> sec/ids",
		"shop/cache[1] cache-all ingress any redirect -> sec/ids",
		"shop/cache[2] web-http ingress TCP ports 80 mirror -> sec/ids",
		"shop/db[0] db-in ingress TCP ports 5432 redirect -> sec/ids",
		"shop/web-1[0] all-web egress any mirror -> sec/ids",
		"shop/web-1[1] web-http ingress TCP ports 80 mirror -> sec/ids")
	if _, err := h.a.DeleteTap(context.Background(), "cache-all"); err != nil {
		t.Fatal(err)
	}
	// Delete by name and by manifest.
	if _, err := h.a.DeleteTap(context.Background(), "db-in"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.a.Delete(context.Background(), api.DeleteRequest{Documents: []api.Document{{Source: "d.yaml", Data: tapAll}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.a.DeleteTap(context.Background(), "db-in"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("deleting a deleted contract: %v", err)
	}
	wantInstalled(t, f,
		"shop/cache[0] web-http ingress TCP ports 80 mirror -> sec/ids",
		"shop/web-1[0] web-http ingress TCP ports 80 mirror -> sec/ids")
}

// A dataplane that fails to take the rules leaves everything as it was: contracts,
// rules and state.
func TestTapsDataplaneFailureRollsBack(t *testing.T) {
	h, f := webTapped(t)
	f.mu.Lock()
	f.fail = errors.New("tap map full")
	f.mu.Unlock()
	if _, err := h.addTaps(tapDB); err == nil || !strings.Contains(err.Error(), "tap map full") {
		t.Fatalf("AddTaps with a failing dataplane: %v", err)
	}
	// A new replica cannot be tapped either: its add fails and is undone.
	if _, err := h.a.AddEndpoint(context.Background(), api.EndpointSpec{Namespace: "shop", Name: "web-2", Labels: map[string]string{"app": "web"}}); err == nil {
		t.Fatal("an endpoint the dataplane could not tap was added")
	}
	f.mu.Lock()
	f.fail = nil
	f.mu.Unlock()
	wantInstalled(t, f, "shop/web-1[0] web-http both TCP ports 80 mirror -> sec/ids")
	if ts, _ := h.a.ListTaps(context.Background()); len(ts) != 1 {
		t.Errorf("%d contracts after the failure, want 1", len(ts))
	}
	if _, err := h.a.GetEndpoint(context.Background(), "shop", "web-2"); err == nil {
		t.Error("web-2 exists after its add failed")
	}
}

// Counters are summed per contract from the rules' counters.
func TestTapCounters(t *testing.T) {
	h := newTapHarness(t)
	f := h.dp.taps
	h.addMonitor("sec", "ids")
	w1 := h.add("shop", "web-1", map[string]string{"app": "web"})
	w2 := h.add("shop", "web-2", map[string]string{"app": "web"})
	if _, err := h.addTaps(tapWeb); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.counters = map[tap.RuleKey]tap.Counters{
		{EndpointID: w1.EpID, Contract: "web-http"}: {MirroredPackets: 3, MirroredBytes: 300, CopiesLost: 1},
		{EndpointID: w2.EpID, Contract: "web-http"}: {MirroredPackets: 4, MirroredBytes: 400},
	}
	f.mu.Unlock()
	got, err := h.a.GetTap(context.Background(), "web-http")
	if err != nil {
		t.Fatal(err)
	}
	want := api.TapCounters{MirroredPackets: 7, MirroredBytes: 700, CopiesLost: 1}
	if got.Counters == nil || *got.Counters != want {
		t.Errorf("counters %+v, want %+v", got.Counters, want)
	}
}

// An agent whose state holds contracts does not start on a dataplane without taps: it
// would leave redirected traffic unmonitored.
func TestStoredTapsNeedTapTable(t *testing.T) {
	h := newTapHarness(t)
	h.addMonitor("sec", "ids")
	h.add("shop", "db", nil)
	if _, err := h.addTaps(tapDB); err != nil {
		t.Fatal(err)
	}
	h.a.Close()
	dp := h.dp.reopen()
	dp.taps = nil
	h.cfg.OpenKernel = func(Config) (Kernel, error) { return dp.kernel(), nil }
	a, err := New(h.cfg)
	if err == nil {
		a.Close()
		t.Fatal("the agent started with stored tap contracts and no tap table")
	}
	if !strings.Contains(err.Error(), "the dataplane has no taps yet") {
		t.Errorf("New: %v", err)
	}
	h.a = nil
}

// A new endpoint's tap rules are installed before its info: its programs drop everything
// until then, so no packet of it passes before a fail-closed redirect is in place.
func TestTapsInstalledBeforeEndpoint(t *testing.T) {
	h, f := webTapped(t)
	var written []uint32 // endpoint ids whose info the dataplane had at the replacement
	f.onReplace = func([]tap.Rule) {
		_, eps := h.dp.snapshot()
		for _, ep := range eps {
			written = append(written, ep.info.EpID)
		}
	}
	web2 := h.add("shop", "web-2", map[string]string{"app": "web"})
	if slices.Contains(written, web2.EpID) {
		t.Errorf("web-2's info (endpoint id %d) was written before its tap rules", web2.EpID)
	}
	if len(written) == 0 {
		t.Error("the tap rules were not replaced for the new endpoint")
	}
	_, eps := h.dp.snapshot()
	found := false
	for _, ep := range eps {
		found = found || ep.info.EpID == web2.EpID
	}
	if !found {
		t.Error("web-2's info was never written")
	}
}

// A monitor on another node: a mirror's rules name its node; a redirect through it fails
// closed, saying why; a remote pod that is no monitor is refused as one.
func TestTapsRemoteMonitor(t *testing.T) {
	h := newTapHarness(t)
	ctx := context.Background()
	h.add("shop", "db", nil)
	if _, err := h.a.PutNode(ctx, "n2", api.NodeSpec{Address: "198.19.0.2", PodCIDR: "10.2.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.a.PutRemoteEndpoint(ctx, "sec", "ids", api.RemoteEndpointSpec{Node: "n2", IP: "10.2.0.9", Monitor: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.a.PutRemoteEndpoint(ctx, "sec", "app", api.RemoteEndpointSpec{Node: "n2", IP: "10.2.0.10"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.addTaps(tapDB); err != nil {
		t.Fatal(err)
	}
	wantInstalled(t, h.dp.taps, "shop/db[0] db-in ingress TCP ports 5432 drop")
	if got, _ := h.a.GetTap(ctx, "db-in"); !strings.Contains(got.MonitorProblem, "runs on node n2: a redirect goes through a monitor on its source's node only") {
		t.Errorf("a redirect through another node's monitor: problem %q", got.MonitorProblem)
	}
	if _, err := h.addTaps(strings.Replace(tapDB, "action: Redirect", "action: Mirror", 1)); err != nil {
		t.Fatal(err)
	}
	wantInstalled(t, h.dp.taps, "shop/db[0] db-in ingress TCP ports 5432 mirror -> sec/ids@n2")
	if got, _ := h.a.GetTap(ctx, "db-in"); got.MonitorNode != "n2" {
		t.Errorf("monitor node %q, want n2", got.MonitorNode)
	}
	bad := strings.Replace(tapWeb, "monitor: sec/ids", "monitor: sec/app", 1)
	if _, err := h.addTaps(bad); err == nil || !strings.Contains(err.Error(), "endpoint sec/app is not a monitor") {
		t.Errorf("a remote non-monitor as monitor: %v", err)
	}
	// The monitor's node goes away with its pods: the mirror's copies stop.
	if err := h.a.DeleteNode(ctx, "n2"); err != nil {
		t.Fatal(err)
	}
	wantInstalled(t, h.dp.taps, "shop/db[0] db-in ingress TCP ports 5432 pass")
}
