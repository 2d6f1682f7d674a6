package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/proxy"
)

type noPods struct{}

func (noPods) LocalPod(ctx context.Context, ns, name string) (PodInfo, error) {
	return PodInfo{}, errors.New("no such pod")
}

// kubernetesMode starts h's agent again in Kubernetes mode, as node n1.
func kubernetesMode(h *harness) *harness {
	h.t.Helper()
	h.a.Close()
	h.cfg.Kubernetes = &Kubernetes{NodeName: "n1", Pods: noPods{}}
	h.start()
	return h
}

const refusedServices = `{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy","metadata":{"name":"services","namespace":"x"},
"spec":{"endpointSelector":{"matchLabels":{"pod":"a"}},"egress":[{"toServices":[{"k8sService":{"serviceName":"web","namespace":"x"}}]}]}}`

func clusterView(remoteID identity.Identity, objects map[string]PolicyObject, remotes ...RemoteEndpointRecord) ClusterView {
	return ClusterView{
		Namespaces: map[string]labels.Labels{"x": {"team": "t"}},
		Nodes:      []NodeRecord{{Name: "n2", Address: netip.MustParseAddr("198.19.0.2"), PodCIDR: netip.MustParsePrefix("10.2.0.0/24")}},
		Remotes: append([]RemoteEndpointRecord{{Namespace: "x", Name: "b", Node: "n2", IP: netip.MustParseAddr("10.2.0.5"),
			Labels: labels.Labels{"pod": "b"}, Identity: remoteID}}, remotes...),
		Objects: objects,
	}
}

// SyncCluster applies a whole view as one change: the policies the parser accepts (the
// refused one reported, an accepted version kept when a newer one is refused), nodes and
// remote pods with their pinned identities; a view that cannot be applied changes nothing.
func TestSyncCluster(t *testing.T) {
	h := kubernetesMode(newHarness(t))
	ctx := context.Background()
	h.add("x", "a", map[string]string{"pod": "a"})

	objects := map[string]PolicyObject{
		"np":  {Kind: "NetworkPolicy", Namespace: "x", Name: "from-b", ResourceVersion: "1", Object: object(allowFromRemoteB)},
		"svc": {Kind: "CiliumNetworkPolicy", Namespace: "x", Name: "services", ResourceVersion: "1", Object: object(refusedServices)},
	}
	res, err := h.a.SyncCluster(ctx, clusterView(5000, objects))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Refused) != 1 || !strings.Contains(res.Refused["svc"], "toServices") {
		t.Errorf("refused %v, want svc for toServices", res.Refused)
	}
	ps, _ := h.a.ListPolicies(ctx)
	if len(ps) != 1 || ps[0].Name != "from-b" {
		t.Fatalf("policies %+v, want only from-b", ps)
	}
	rs, _ := h.a.ListRemoteEndpoints(ctx)
	if len(rs) != 1 || rs[0].Identity != 5000 {
		t.Fatalf("remote endpoints %+v, want x/b with identity 5000", rs)
	}
	st, _ := h.a.Status(ctx)
	if k := st.Kubernetes; k == nil || !k.Synced || k.Nodes != 1 || k.RemoteEndpoints != 1 || len(k.Refused) != 1 {
		t.Errorf("status %+v", st.Kubernetes)
	}

	// Two label sets with one number: the one this node had keeps it, the newcomer is
	// left out (its address maps to the init identity, which nothing admits) and
	// reported; the rest of the view applies.
	clash := RemoteEndpointRecord{Namespace: "x", Name: "c", Node: "n2", IP: netip.MustParseAddr("10.2.0.6"),
		Labels: labels.Labels{"pod": "c"}, Identity: 5000}
	res, err = h.a.SyncCluster(ctx, clusterView(5000, objects, clash))
	if err != nil {
		t.Fatalf("a view with one unresolved pod was not applied: %v", err)
	}
	if len(res.Unresolved) != 1 || !strings.Contains(res.Unresolved["x/c"], "identity 5000") {
		t.Errorf("unresolved %v, want x/c", res.Unresolved)
	}
	ipc, _ := h.dp.snapshot()
	if e := ipc[netip.MustParsePrefix("10.2.0.5/32")]; e.Identity != 5000 {
		t.Errorf("ipcache of x/b: %+v, want identity 5000", e)
	}
	if e := ipc[netip.MustParsePrefix("10.2.0.6/32")]; e.Identity != identity.Init {
		t.Errorf("ipcache of x/c: %+v, want the init identity", e)
	}
	if k := mustStatus(t, h).Kubernetes; !k.Synced || k.Clean || len(k.Unresolved) != 1 || k.Unresolved[0].Object != "x/c" {
		t.Errorf("status after a sync with an unresolved pod: %+v", k)
	}
	// A view that cannot be applied at all is never shown as synced.
	h.dp.fakeIPCache.failUpdate = errors.New("map full")
	if _, err := h.a.SyncCluster(ctx, clusterView(5001, objects)); err == nil {
		t.Fatal("sync succeeded with a failing ipcache")
	}
	if k := mustStatus(t, h).Kubernetes; k.Synced || !k.Failing || k.Clean || k.LastError == "" {
		t.Errorf("status after a failed sync: %+v", k)
	}
	h.dp.fakeIPCache.failUpdate = nil

	// A newer version of an accepted policy that the parser refuses: the accepted stays.
	objects["np"] = PolicyObject{Kind: "NetworkPolicy", Namespace: "x", Name: "from-b", ResourceVersion: "2",
		Object: object(strings.Replace(allowFromRemoteB, "podSelector: {matchLabels: {pod: a}}", "podSelector: {matchLabels: {pod: a}}\n  bogus: 1", 1))}
	res, err = h.a.SyncCluster(ctx, clusterView(5000, objects))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Refused["np"], "last accepted version stays") {
		t.Errorf("refused %v", res.Refused)
	}
	if ps, _ := h.a.ListPolicies(ctx); len(ps) != 1 || ps[0].Name != "from-b" {
		t.Errorf("policies %+v, want from-b kept", ps)
	}
	if st, _ := h.a.Status(ctx); st.Kubernetes.LastError != "" {
		t.Errorf("last error %q after a successful sync", st.Kubernetes.LastError)
	}

	// The local API does not write what Kubernetes owns; the state survives a restart.
	var ae *api.Error
	if _, err := h.apply("p.yaml", allowFromRemoteB); !errors.As(err, &ae) || ae.Status != 409 {
		t.Errorf("apply in Kubernetes mode: %v, want 409", err)
	}
	h.restart()
	if rs, _ := h.a.ListRemoteEndpoints(ctx); len(rs) != 1 || rs[0].Identity != 5000 {
		t.Errorf("remote endpoints after restart: %+v", rs)
	}
}

// tapObject is a tap manifest as the watcher hands it over.
func tapObject(kind, name, rv, doc string) PolicyObject {
	return PolicyObject{Kind: kind, Name: name, ResourceVersion: rv, Object: object(doc)}
}

// Tap contracts of the Kubernetes API: each sync replaces the set the API brought (the
// local API's contracts stay), each object is admitted or refused on its own, naming its
// field, the two contracts that overlap, or the monitor that is not one; the local API
// cannot change or delete them; remote pods carry their monitor mark.
func TestSyncClusterTaps(t *testing.T) {
	h := kubernetesMode(newTapHarness(t))
	ctx := context.Background()
	h.addMonitor("sec", "ids")
	h.add("shop", "web-1", map[string]string{"app": "web"})
	if _, err := h.addTaps(tapDB); err != nil { // the local API's, kept by every sync
		t.Fatal(err)
	}
	badPorts := strings.Replace(strings.Replace(tapWeb, "web-http", "bad-ports", 1), "protocol: TCP, ", "", 1)
	notMonitor := strings.NewReplacer("web-http", "to-b", "monitor: sec/ids", "monitor: x/b", "ports: [80]", "ports: [81]").Replace(tapWeb)
	objects := map[string]PolicyObject{
		"TapContract//web-http":   tapObject("TapContract", "web-http", "1", tapWeb),
		"TrafficControl//all-web": tapObject("TrafficControl", "all-web", "1", tapAll),
		"TapContract//bad-ports":  tapObject("TapContract", "bad-ports", "1", badPorts),
		"TapContract//to-b":       tapObject("TapContract", "to-b", "1", notMonitor),
	}
	res, err := h.a.SyncCluster(ctx, clusterView(5000, objects))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{
		"TrafficControl//all-web": "tap contracts all-web and web-http overlap on endpoint shop/web-1",
		"TapContract//bad-ports":  "spec.match.ports",
		"TapContract//to-b":       "endpoint x/b is not a monitor",
	} {
		if !strings.Contains(res.Refused[key], want) {
			t.Errorf("refused %s: %q, want %q", key, res.Refused[key], want)
		}
	}
	if len(res.Refused) != 3 {
		t.Errorf("refused %v, want 3", res.Refused)
	}
	wantInstalled(t, h.dp.taps, "shop/web-1[0] web-http both TCP ports 80 mirror -> sec/ids")
	ts, _ := h.a.ListTaps(ctx)
	if len(ts) != 2 || ts[0].Name != "db-in" || ts[1].Name != "web-http" || !strings.HasPrefix(ts[1].Source, "Kubernetes TapContract web-http") {
		t.Errorf("taps %+v", ts)
	}

	// The local API cannot change or delete what Kubernetes owns.
	var ae *api.Error
	if _, err := h.addTaps(tapWeb); !errors.As(err, &ae) || ae.Status != 409 || !strings.Contains(err.Error(), "managed by the Kubernetes API") {
		t.Errorf("tap add over a Kubernetes contract: %v, want 409", err)
	}
	if _, err := h.a.DeleteTap(ctx, "web-http"); !errors.As(err, &ae) || ae.Status != 409 {
		t.Errorf("tap delete of a Kubernetes contract: %v, want 409", err)
	}

	// x/b made a monitor on its node: to-b is admitted at the next sync (same version).
	// A new contract overlapping web-http, which stays, is refused though its name comes
	// first.
	objects["TapContract//a-web"] = tapObject("TapContract", "a-web", "1", strings.Replace(tapWeb, "web-http", "a-web", 1))
	v := clusterView(5000, objects)
	v.Remotes[0].Monitor = true
	if res, err = h.a.SyncCluster(ctx, v); err != nil {
		t.Fatal(err)
	}
	if _, ok := res.Refused["TapContract//to-b"]; ok {
		t.Errorf("to-b refused with x/b a monitor: %v", res.Refused)
	}
	if !strings.Contains(res.Refused["TapContract//a-web"], "tap contracts a-web and web-http overlap") {
		t.Errorf("a-web: refused %q, want its overlap with web-http", res.Refused["TapContract//a-web"])
	}
	wantInstalled(t, h.dp.taps,
		"shop/web-1[0] to-b both TCP ports 81 mirror -> x/b@n2",
		"shop/web-1[1] web-http both TCP ports 80 mirror -> sec/ids")
	if rs, _ := h.a.ListRemoteEndpoints(ctx); len(rs) != 1 || !rs[0].Monitor {
		t.Errorf("remote endpoints %+v, want x/b a monitor", rs)
	}

	// Deleted from the API: gone at the next sync; the local contract stays, and so after
	// a restart.
	delete(objects, "TapContract//web-http")
	delete(objects, "TapContract//to-b")
	delete(objects, "TapContract//a-web")
	if _, err := h.a.SyncCluster(ctx, clusterView(5000, objects)); err != nil {
		t.Fatal(err)
	}
	// all-web no longer overlaps anything: admitted.
	wantInstalled(t, h.dp.taps, "shop/web-1[0] all-web ingress any mirror -> sec/ids")
	h.restart()
	ts, _ = h.a.ListTaps(ctx)
	if len(ts) != 2 || ts[0].Name != "all-web" || ts[1].Name != "db-in" {
		t.Errorf("taps after restart %+v", ts)
	}
}

// pods is a PodLookup of fixed pods, by namespace/name.
type pods map[string]PodInfo

func (p pods) LocalPod(ctx context.Context, ns, name string) (PodInfo, error) {
	if info, ok := p[ns+"/"+name]; ok {
		return info, nil
	}
	return PodInfo{}, errors.New("no such pod")
}

// A pod the API marks as a monitor is made a monitor endpoint by the CNI ADD (its tap
// interfaces with it), which a contract of the API can then name; the mark changed
// afterwards is reported, not applied.
func TestCNIMonitorPod(t *testing.T) {
	h := newTapHarness(t)
	h.a.Close()
	lookup := pods{"sec/ids": {Labels: labels.Labels{"app": "ids"}, Monitor: true}, "shop/web-1": {Labels: labels.Labels{"app": "web"}}}
	h.cfg.Kubernetes = &Kubernetes{NodeName: "n1", Pods: lookup}
	h.start()
	ctx := context.Background()
	cniAdd(t, h, "c1", "eth0", "sec", "ids")
	cniAdd(t, h, "c2", "eth0", "shop", "web-1")
	if ep, err := h.a.GetEndpoint(ctx, "sec", "ids"); err != nil || !ep.Monitor {
		t.Fatalf("sec/ids: %+v, %v; want a monitor", ep, err)
	}
	if ep, _ := h.a.GetEndpoint(ctx, "shop", "web-1"); ep.Monitor {
		t.Error("shop/web-1, not marked, is a monitor")
	}
	v := clusterView(5000, map[string]PolicyObject{"TapContract//web-http": tapObject("TapContract", "web-http", "1", tapWeb)})
	v.LocalPods = map[string]PodInfo{"sec/ids": {Labels: labels.Labels{"app": "ids"}}, "shop/web-1": lookup["shop/web-1"]}
	res, err := h.a.SyncCluster(ctx, v)
	if err != nil || len(res.Refused) != 0 {
		t.Fatalf("sync: %v, refused %v", err, res.Refused)
	}
	wantInstalled(t, h.dp.taps, "shop/web-1[0] web-http both TCP ports 80 mirror -> sec/ids")
	if len(res.Problems) != 1 || !strings.Contains(res.Problems[0], "pod sec/ids: annotation rampart.io/monitor=false differs") {
		t.Errorf("problems %q, want the changed monitor mark of sec/ids", res.Problems)
	}
}

func mustStatus(t *testing.T, h *harness) api.Status {
	t.Helper()
	st, err := h.a.Status(context.Background())
	if err != nil || st.Kubernetes == nil {
		t.Fatalf("status: %+v, %v", st, err)
	}
	return st
}

const denyClientIngress = `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"client","namespace":"nc"},
"spec":{"podSelector":{"matchLabels":{"pod":"client"}},"policyTypes":["Ingress"]}}`

// A pod whose cluster identity was allocated from its namespace's labels before this node
// applied them (the watcher's cache ahead of the last view: a labelled Namespace applied
// together with its pods) gets that identity at its CNI ADD; the next view brings the
// labels, and the node converges: the identity stands for the full label set, the view
// applies, policy is enforced.
func TestSyncClusterConvergesWhenNamespaceLabelsArriveLate(t *testing.T) {
	h := newHarness(t)
	h.a.Close()
	client := PodInfo{Labels: labels.Labels{"pod": "client"}, Identity: 7000}
	h.cfg.Kubernetes = &Kubernetes{NodeName: "n1", Pods: pods{"nc/client": client}}
	h.start()
	ctx := context.Background()
	early := clusterView(5000, nil)
	early.Namespaces["nc"] = nil // the namespace, its labels not yet seen
	if _, err := h.a.SyncCluster(ctx, early); err != nil {
		t.Fatal(err)
	}
	cniAdd(t, h, "c1", "eth0", "nc", "client")

	late := clusterView(5000, map[string]PolicyObject{
		"np": {Kind: "NetworkPolicy", Namespace: "nc", Name: "client", ResourceVersion: "1", Object: object(denyClientIngress)}})
	late.Namespaces["nc"] = labels.Labels{"team": "t"}
	late.LocalPods = map[string]PodInfo{"nc/client": client}
	for i := range 2 { // the first sync converges, the second changes nothing
		res, err := h.a.SyncCluster(ctx, late)
		if err != nil {
			t.Fatalf("sync %d with the namespace's labels: %v", i, err)
		}
		if len(res.Refused)+len(res.Problems) != 0 {
			t.Errorf("sync %d: %+v", i, res)
		}
	}
	ep, err := h.a.GetEndpoint(ctx, "nc", "client")
	if err != nil {
		t.Fatal(err)
	}
	if ep.Identity != 7000 || !slices.Contains(ep.IdentityLabels, labels.KeyNamespaceLabelPrefix+"team=t") || !ep.EnforceIngress {
		t.Errorf("nc/client: identity %d, labels %v, ingress enforced %v; want 7000 with the namespace's label, enforced",
			ep.Identity, ep.IdentityLabels, ep.EnforceIngress)
	}
	if k := mustStatus(t, h).Kubernetes; !k.Synced || k.LastError != "" || len(k.Problems) != 0 {
		t.Errorf("status %+v, want synced with no problem", k)
	}
}

// Two pods of this node that the cluster gives one number for two label sets: the one
// the node had keeps it, the other's policy cannot be computed and it is denied all
// traffic (not left open), and status says so.
func TestUnresolvedEndpointDenied(t *testing.T) {
	h := newHarness(t)
	h.a.Close()
	h.cfg.Kubernetes = &Kubernetes{NodeName: "n1", Pods: pods{
		"x/a": {Labels: labels.Labels{"pod": "a"}, Identity: 7000},
		"x/z": {Labels: labels.Labels{"pod": "z"}, Identity: 7000},
	}}
	h.start()
	ctx := context.Background()
	cniAdd(t, h, "c1", "eth0", "x", "a")
	cniAdd(t, h, "c2", "eth0", "x", "z")
	a, _ := h.a.GetEndpoint(ctx, "x", "a")
	z, _ := h.a.GetEndpoint(ctx, "x", "z")
	if a.Identity != 7000 || z.Identity != identity.Init {
		t.Errorf("identities x/a %d, x/z %d; want 7000 and init", a.Identity, z.Identity)
	}
	_, eps := h.dp.snapshot()
	installed := map[uint32]fakeEP{}
	for _, ep := range eps {
		installed[ep.info.EpID] = ep
	}
	if ep := installed[z.EpID]; ep.info.Identity != identity.Init || !ep.pol.EnforceIngress || !ep.pol.EnforceEgress || len(ep.pol.Entries) != 0 {
		t.Errorf("x/z in the dataplane: %+v, want the init identity, everything denied", ep)
	}
	if ep := installed[a.EpID]; ep.info.Identity != 7000 || ep.pol.EnforceIngress || ep.pol.EnforceEgress {
		t.Errorf("x/a in the dataplane: %+v, want identity 7000, open (no policy selects it)", ep)
	}
	for _, q := range []api.TraceRequest{{From: "x/z", To: "x/a"}, {From: "x/a", To: z.IP}} {
		q.Protocol, q.Port = "TCP", 80
		if res, err := h.a.Trace(ctx, q); err != nil || res.Allowed || !strings.Contains(res.Diagnostic, "x/z is denied all traffic") {
			t.Errorf("trace %s -> %s: %+v, %v; want denied, x/z unresolved", q.From, q.To, res, err)
		}
	}
	if k := mustStatus(t, h).Kubernetes; k.Clean || len(k.Unresolved) != 1 || k.Unresolved[0].Object != "x/z" ||
		!strings.Contains(k.Unresolved[0].Error, "denied all traffic") {
		t.Errorf("status %+v, want x/z unresolved", k)
	}
}

// The last accepted version of a policy object survives a restart: after the agent
// refused a newer version and restarted, the API's current (refused) version finds the
// accepted one still in force, as before the restart; an object deleted from the API
// takes its accepted version with it, restart or not.
func TestSyncClusterRestartKeepsAccepted(t *testing.T) {
	h := kubernetesMode(newHarness(t))
	ctx := context.Background()
	h.add("x", "a", map[string]string{"pod": "a"})
	objects := map[string]PolicyObject{
		"np": {Kind: "NetworkPolicy", Namespace: "x", Name: "from-b", ResourceVersion: "1", Object: object(allowFromRemoteB)},
	}
	if _, err := h.a.SyncCluster(ctx, clusterView(5000, objects)); err != nil {
		t.Fatal(err)
	}
	objects["np"] = PolicyObject{Kind: "NetworkPolicy", Namespace: "x", Name: "from-b", ResourceVersion: "2",
		Object: object(strings.Replace(allowFromRemoteB, "podSelector: {matchLabels: {pod: a}}", "podSelector: {matchLabels: {pod: a}}\n  bogus: 1", 1))}
	for i, what := range []string{"refused", "after a restart", "after a second restart"} {
		if i > 0 {
			h.restart()
		}
		res, err := h.a.SyncCluster(ctx, clusterView(5000, objects))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if msg := res.Refused["np"]; !strings.Contains(msg, "bogus") || !strings.Contains(msg, "last accepted version stays") {
			t.Errorf("%s: refused %q, want bogus refused and the accepted version kept", what, msg)
		}
		ps, _ := h.a.ListPolicies(ctx)
		if len(ps) != 1 || ps[0].Name != "from-b" || strings.Contains(string(ps[0].Raw), "bogus") {
			t.Fatalf("%s: policies %+v, want the accepted from-b", what, ps)
		}
	}
	delete(objects, "np")
	if _, err := h.a.SyncCluster(ctx, clusterView(5000, objects)); err != nil {
		t.Fatal(err)
	}
	h.restart()
	objects["np"] = PolicyObject{Kind: "NetworkPolicy", Namespace: "x", Name: "from-b", ResourceVersion: "3",
		Object: object(strings.Replace(allowFromRemoteB, "podSelector: {matchLabels: {pod: a}}", "podSelector: {matchLabels: {pod: a}}\n  bogus: 1", 1))}
	res, err := h.a.SyncCluster(ctx, clusterView(5000, objects))
	if err != nil {
		t.Fatal(err)
	}
	if ps, _ := h.a.ListPolicies(ctx); len(ps) != 0 || strings.Contains(res.Refused["np"], "last accepted") {
		t.Errorf("deleted, then created refused: policies %+v, refused %q; want none kept", ps, res.Refused["np"])
	}
}

// An agent with no accepted version of its own (a new node, a wiped state directory)
// that refuses an object's current version enforces the version the cluster recorded as
// accepted, as the other nodes do, not nothing; a record of another object of the name
// (another uid) does not hold. Only a refusal asks for a record (the version kept in
// force, until the record has it); a record is dropped once the current version is
// accepted or the object is gone.
func TestSyncClusterFreshAgentTakesClusterAccepted(t *testing.T) {
	ctx := context.Background()
	good := PolicyObject{Kind: "NetworkPolicy", Namespace: "x", Name: "from-b", ResourceVersion: "1", UID: "u1", Object: object(allowFromRemoteB)}
	// The cluster's record of good, as the watcher reads it (AcceptedPolicy).
	goodRec := good
	goodRec.Object, goodRec.Document = nil, []byte(allowFromRemoteB)
	bad := good
	bad.ResourceVersion = "2"
	bad.Object = object(strings.Replace(allowFromRemoteB, "podSelector: {matchLabels: {pod: a}}", "podSelector: {matchLabels: {pod: a}}\n  bogus: 1", 1))

	h := kubernetesMode(newHarness(t))
	h.add("x", "a", map[string]string{"pod": "a"})
	v := clusterView(5000, map[string]PolicyObject{"np": good})
	res, err := h.a.SyncCluster(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Record) != 0 || len(res.Unrecord) != 0 {
		t.Errorf("accepted: record %+v, unrecord %v; want no write", res.Record, res.Unrecord)
	}
	v = clusterView(5000, map[string]PolicyObject{"np": bad})
	if res, err = h.a.SyncCluster(ctx, v); err != nil || len(res.Record) != 1 || res.Record[0].ResourceVersion != "1" ||
		res.Record[0].UID != "u1" || !sameRules(t, res.Record[0].Document, allowFromRemoteB) {
		t.Errorf("refused: record %+v (%v), want version 1 of np to record", res.Record, err)
	}
	v.Accepted = map[string]PolicyObject{"np": goodRec}
	if res, err = h.a.SyncCluster(ctx, v); err != nil || len(res.Record) != 0 || len(res.Unrecord) != 0 {
		t.Errorf("recorded: record %+v, unrecord %v (%v), want no write", res.Record, res.Unrecord, err)
	}
	fixed := good
	fixed.ResourceVersion = "3"
	v.Objects = map[string]PolicyObject{"np": fixed}
	if res, err = h.a.SyncCluster(ctx, v); err != nil || len(res.Record) != 0 || len(res.Unrecord) != 1 || res.Unrecord[0] != "np" {
		t.Errorf("accepted again: record %+v, unrecord %v (%v), want the record deleted", res.Record, res.Unrecord, err)
	}
	v.Objects = map[string]PolicyObject{}
	if res, err = h.a.SyncCluster(ctx, v); err != nil || len(res.Unrecord) != 1 {
		t.Errorf("deleted: unrecord %v (%v), want the record deleted", res.Unrecord, err)
	}

	for _, c := range []struct {
		uid  string
		kept bool
	}{{"u1", true}, {"u0", false}} {
		fresh := kubernetesMode(newHarness(t))
		fresh.add("x", "a", map[string]string{"pod": "a"})
		rec := goodRec
		rec.UID = c.uid
		v := clusterView(5000, map[string]PolicyObject{"np": bad})
		v.Accepted = map[string]PolicyObject{"np": rec}
		res, err := fresh.a.SyncCluster(ctx, v)
		if err != nil {
			t.Fatal(err)
		}
		msg := res.Refused["np"]
		ps, _ := fresh.a.ListPolicies(ctx)
		if !strings.Contains(msg, "bogus") || strings.Contains(msg, "last accepted version stays") != c.kept {
			t.Errorf("record of uid %s: refused %q, want bogus refused, accepted version kept: %v", c.uid, msg, c.kept)
		}
		if kept := len(ps) == 1 && ps[0].Name == "from-b" && !strings.Contains(string(ps[0].Raw), "bogus"); kept != c.kept || !c.kept && len(ps) != 0 {
			t.Errorf("record of uid %s: policies %+v, want the accepted from-b: %v", c.uid, ps, c.kept)
		}
		// Kept from the record: nothing to write. Of another uid: nothing of its own to keep.
		if len(res.Record) != 0 || len(res.Unrecord) != 0 {
			t.Errorf("record of uid %s: record %+v, unrecord %v; want no write", c.uid, res.Record, res.Unrecord)
		}
		if c.kept {
			fresh.restart()
			v.Accepted = nil // its own state holds the version now
			res, err := fresh.a.SyncCluster(ctx, v)
			if ps, _ := fresh.a.ListPolicies(ctx); err != nil || len(ps) != 1 || !strings.Contains(res.Refused["np"], "last accepted version stays") {
				t.Errorf("after a restart without the record: policies %+v, refused %q (%v), want from-b kept", ps, res.Refused["np"], err)
			}
		}
	}
}

// A newer version that the node cannot enforce (L7 rules, no Envoy) is refused like one
// the parser refuses: the accepted version stays in force, not nothing.
func TestSyncClusterUnservableKeepsAccepted(t *testing.T) {
	h := newHarness(t)
	h.a.Close()
	h.proxyErr = proxy.ErrNoEnvoy
	h = kubernetesMode(h)
	ctx := context.Background()
	obj := func(rv, doc string) map[string]PolicyObject {
		return map[string]PolicyObject{"cnp": {Kind: "CiliumNetworkPolicy", Namespace: "sw", Name: "rule1", ResourceVersion: rv, Object: object(doc)}}
	}
	if _, err := h.a.SyncCluster(ctx, clusterView(5000, obj("1", l3Deathstar))); err != nil {
		t.Fatal(err)
	}
	res, err := h.a.SyncCluster(ctx, clusterView(5000, obj("2", l7Deathstar)))
	if err != nil {
		t.Fatal(err)
	}
	if msg := res.Refused["cnp"]; !strings.Contains(msg, "envoy not found") || !strings.Contains(msg, "last accepted version stays") {
		t.Errorf("refused %q, want the L7 version refused and the accepted one kept", msg)
	}
	if ps, _ := h.a.ListPolicies(ctx); len(ps) != 1 || strings.Contains(string(ps[0].Raw), "http") {
		t.Errorf("policies %+v, want the accepted L3 rule1", ps)
	}
}

// A tap contract's update that cannot be admitted (its monitor is not one) keeps the
// version admitted before it in force, as a refused policy update does, also after a
// restart: the tapped traffic never goes uninspected because of a bad update.
func TestSyncClusterTapRefusedUpdateKeepsAccepted(t *testing.T) {
	h := kubernetesMode(newTapHarness(t))
	ctx := context.Background()
	h.addMonitor("sec", "ids")
	h.add("shop", "web-1", map[string]string{"app": "web"})
	objects := map[string]PolicyObject{"TapContract//web-http": tapObject("TapContract", "web-http", "1", tapWeb)}
	if _, err := h.a.SyncCluster(ctx, clusterView(5000, objects)); err != nil {
		t.Fatal(err)
	}
	wantInstalled(t, h.dp.taps, "shop/web-1[0] web-http both TCP ports 80 mirror -> sec/ids")

	objects["TapContract//web-http"] = tapObject("TapContract", "web-http", "2", strings.Replace(tapWeb, "monitor: sec/ids", "monitor: x/b", 1))
	for round := range 2 { // the refusal, then the same version again after a restart
		res, err := h.a.SyncCluster(ctx, clusterView(5000, objects))
		if err != nil {
			t.Fatal(err)
		}
		if msg := res.Refused["TapContract//web-http"]; !strings.Contains(msg, "endpoint x/b is not a monitor") ||
			!strings.Contains(msg, "its last accepted version stays in force") {
			t.Errorf("round %d: refused %q, want x/b not a monitor, the last accepted version kept", round, msg)
		}
		wantInstalled(t, h.dp.taps, "shop/web-1[0] web-http both TCP ports 80 mirror -> sec/ids")
		h.restart()
	}
}

// object is a manifest as the watcher hands it over: decoded.
func object(doc string) map[string]any {
	var m map[string]any
	if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
		panic(fmt.Sprintf("test manifest: %v", err))
	}
	return m
}

// sameRules says whether record (the JSON document of an accepted record) holds the
// policy of manifest doc.
func sameRules(t *testing.T, record []byte, doc string) bool {
	t.Helper()
	got, err := policy.Parse("record", record)
	if err != nil {
		t.Errorf("record %s: %v", record, err)
		return false
	}
	want, err := policy.Parse("doc", []byte(doc))
	if err != nil || len(got.Policies) != 1 || len(want.Policies) != 1 {
		return false
	}
	return reflect.DeepEqual(got.Policies[0].Rules, want.Policies[0].Rules)
}
