package propagation

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/k8s/identities"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// outDir is where the report goes: $RAMPART_BENCH_OUT (bench/run-propagation.sh sets
// bench/results), else the test's temporary directory.
var outDir string

func TestMain(m *testing.M) {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if d := os.Getenv("RAMPART_BENCH_OUT"); d != "" {
		if !filepath.IsAbs(d) {
			d = filepath.Join(wd, d)
		}
		outDir = d
	}
	// clustertest builds rampartd, rampart and rampart-cni, and k8stest reads
	// tools/k8s/versions.env, from the module root above the working directory: that must
	// be the product module (two levels up), not the bench module that holds this test.
	if err := os.Chdir(filepath.Join(wd, "..", "..")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	clustertest.Bins.Remove()
	os.Exit(code)
}

// configFromEnv is the quick run (CI: under a minute), or the full one with
// RAMPART_BENCH_FULL=1; RAMPART_PROP_{NODES,PODS,SHARED,WRITES,PARALLEL} override a size.
func configFromEnv(t *testing.T) config {
	c := config{Nodes: 2, Pods: 32, Shared: 16, SharedSets: 4, Writes: 5, Parallel: 4}
	if os.Getenv("RAMPART_BENCH_FULL") == "1" {
		c = config{Full: true, Nodes: 4, Pods: 1000, Shared: 1000, SharedSets: 4, Writes: 20, Parallel: 8}
	}
	for name, p := range map[string]*int{"NODES": &c.Nodes, "PODS": &c.Pods, "SHARED": &c.Shared, "WRITES": &c.Writes, "PARALLEL": &c.Parallel} {
		if v := os.Getenv("RAMPART_PROP_" + name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				t.Fatalf("RAMPART_PROP_%s=%q: want a count", name, v)
			}
			*p = n
		}
	}
	if c.Nodes < 2 || c.Pods < c.Nodes || c.Writes < 1 || c.Parallel < 1 {
		t.Fatalf("config %+v: want at least 2 nodes, a pod per node, a write and a worker", c)
	}
	return c
}

// Probe timeouts: an allowed connection answers well within allowWait; a denied one is
// given denyWait to prove it does not.
const (
	allowWait = 3 * time.Second
	denyWait  = 700 * time.Millisecond
	// enforceTimeout bounds one write's propagation before the run fails.
	enforceTimeout = 60 * time.Second
	// Target is issue 17's: p99 of write-to-enforced at most 1 s.
	Target = time.Second
)

// podSpec is a pod to create.
type podSpec struct {
	name     string
	node     int
	labels   map[string]string
	selected bool // the benchmark's policy selects it (sel=1)
}

// distinctSpecs are n pods with a label set each (app=p<i>), spread evenly over the
// nodes; every fourth pod of a node is selected by the policy.
func distinctSpecs(n, nodes int) []podSpec {
	var specs []podSpec
	for i := range n {
		sel := (i/nodes)%4 == 0
		specs = append(specs, podSpec{name: fmt.Sprintf("d-%d", i), node: i % nodes, selected: sel,
			labels: map[string]string{"app": fmt.Sprintf("p%d", i), "sel": sel01(sel)}})
	}
	return specs
}

// sharedSpecs are n pods over sets label sets (app=shared-<k>), each set on every node; the
// pods of set 0 are selected.
func sharedSpecs(n, sets, nodes int) []podSpec {
	var specs []podSpec
	for i := range n {
		set := (i / nodes) % sets
		specs = append(specs, podSpec{name: fmt.Sprintf("s-%d", i), node: i % nodes, selected: set == 0,
			labels: map[string]string{"app": fmt.Sprintf("shared-%d", set), "sel": sel01(set == 0)}})
	}
	return specs
}

func sel01(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func TestPropagation(t *testing.T) {
	testenv.RequireRoot(t)
	cfg := configFromEnv(t)
	rep := &Report{Benchmark: "propagation", Config: cfg, Started: time.Now().UTC(), Kernel: benchkit.Kernel(),
		CPUs: runtime.NumCPU(), Tunnel: string(overlay.VXLAN), Target: Target.Seconds()}
	rep.Load.Start = loadavg()
	t.Logf("config %+v, load %s", cfg, rep.Load.Start)

	c := clustertest.Start(t, clustertest.Options{Nodes: cfg.Nodes, Tunnel: overlay.VXLAN})
	// The harness stands in for every node's kubelet, each of which has a client of its
	// own: client-go's default limit (5 requests/s) would measure the harness, not Rampart.
	rc := rest.CopyConfig(c.Config)
	rc.QPS, rc.Burst = 1000, 2000
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	c.Client = cs
	ns := "prop-" + testenv.Suffix(5)
	c.EnsureNamespace(ns, nil)

	// One client pod per node, the policy's peer; not measured.
	var clients []*clustertest.Pod
	for i, n := range c.Nodes {
		clients = append(clients, c.AddPod(n, ns, fmt.Sprintf("client-%d", i), map[string]string{"role": "client"}))
	}

	distinct := distinctSpecs(cfg.Pods, cfg.Nodes)
	dPods, dCase := createPods(t, c, ns, "distinct", distinct, cfg.Parallel)
	dCase.LabelSets = cfg.Pods
	if dCase.Identities != cfg.Pods || dCase.Allocated != cfg.Pods {
		t.Errorf("distinct label sets: %d identities (%d allocated) for %d pods", dCase.Identities, dCase.Allocated, cfg.Pods)
	}
	rep.Identity = append(rep.Identity, dCase)
	pods, specs := dPods, distinct
	if cfg.Shared > 0 {
		shared := sharedSpecs(cfg.Shared, cfg.SharedSets, cfg.Nodes)
		sPods, sCase := createPods(t, c, ns, "shared", shared, cfg.Parallel)
		sCase.LabelSets = min(cfg.SharedSets, (cfg.Shared+cfg.Nodes-1)/cfg.Nodes)
		if sCase.Identities != sCase.LabelSets || sCase.Allocated != sCase.LabelSets {
			t.Errorf("shared label sets: %d identities (%d allocated) for %d sets", sCase.Identities, sCase.Allocated, sCase.LabelSets)
		}
		rep.Identity = append(rep.Identity, sCase)
		pods, specs = append(pods, sPods...), append(specs, shared...)
	}
	if t.Failed() {
		t.FailNow()
	}
	rep.Load.AfterPods = loadavg()

	rep.Propagation = propagate(t, c, ns, pods, specs, clients, cfg.Writes)
	rep.Load.End = loadavg()

	dir := outDir
	if dir == "" {
		dir = t.TempDir()
	}
	mode := "quick"
	if cfg.Full {
		mode = "full"
	}
	rep.Mode = mode
	base, err := benchkit.WriteReport(dir, "propagation-"+rep.Started.Format("20060102T150405Z"), rep, rep.Table(), rep.Plot)
	if err != nil {
		t.Fatalf("writing the report: %v", err)
	}
	t.Logf("report: %s.{json,md,png}\n%s", base, rep.Table())
}

// TestReplot redraws the plot of the report RAMPART_PROP_REPLOT names (a .json file; a
// relative path is from the repository root, the tests' working directory).
func TestReplot(t *testing.T) {
	path := os.Getenv("RAMPART_PROP_REPLOT")
	if path == "" {
		t.Skip("RAMPART_PROP_REPLOT not set")
	}
	r := &Report{}
	if err := benchkit.Replot(path, r, r.Plot); err != nil {
		t.Fatal(err)
	}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// createPods creates the pods, Parallel at a time, and measures from the first Pod create
// until every node knows every pod's identity: its own pods as local endpoints, the
// others' as remote pods (both with the cluster identity). Identities must agree across
// nodes.
func createPods(t *testing.T, c *clustertest.Cluster, ns, name string, specs []podSpec, parallel int) ([]*clustertest.Pod, IdentityCase) {
	t.Helper()
	keys := make(map[string]int, len(specs))
	for i, s := range specs {
		keys[ns+"/"+s.name] = i
	}
	nodes := len(c.Nodes)
	seen := make([][]time.Time, len(specs)) // [pod][node]
	ident := make([][]uint32, len(specs))
	for i := range specs {
		seen[i], ident[i] = make([]time.Time, nodes), make([]uint32, nodes)
	}
	start := make([]time.Time, len(specs))
	added := make([]time.Duration, len(specs))
	pods := make([]*clustertest.Pod, len(specs))

	stop := make(chan struct{})
	finished := make(chan struct{}) // closed by the observer once every node knows every pod
	var observer sync.WaitGroup
	rounds := 0
	observer.Go(func() { // every node's endpoints and remote pods, polled
		for {
			select {
			case <-stop:
				return
			default:
			}
			rounds++
			var wg sync.WaitGroup
			for ni, n := range c.Nodes {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					eps, err1 := n.Client.ListEndpoints(ctx)
					rs, err2 := n.Client.ListRemoteEndpoints(ctx)
					now := time.Now()
					if err1 != nil || err2 != nil {
						return
					}
					note := func(key string, id uint32) {
						if i, ok := keys[key]; ok && id != 0 && seen[i][ni].IsZero() {
							seen[i][ni], ident[i][ni] = now, id
						}
					}
					for _, e := range eps {
						note(e.Key(), e.Identity)
					}
					for _, r := range rs {
						note(r.Namespace+"/"+r.Name, r.Identity)
					}
				})
			}
			wg.Wait()
			if allSeen(seen) {
				close(finished)
				return
			}
			time.Sleep(50 * time.Millisecond) // poll interval: the resolution of the per-pod times
		}
	})

	before := countIdentities(t, c)
	work := make(chan int)
	var wg sync.WaitGroup
	first := time.Now()
	for range parallel {
		wg.Go(func() {
			for i := range work {
				if t.Failed() {
					continue // a pod failed: make no more, the run ends after this batch
				}
				s := specs[i]
				start[i] = time.Now()
				// AddPod fails the test with FailNow, which ends only this goroutine.
				pods[i] = c.AddPod(c.Nodes[s.node], ns, s.name, s.labels)
				added[i] = time.Since(start[i])
			}
		})
	}
	for i := range specs {
		work <- i
	}
	close(work)
	wg.Wait()
	created := time.Since(first)
	if t.Failed() {
		close(stop)
		observer.Wait()
		t.FailNow()
	}
	select {
	case <-finished:
	case <-time.After(10 * time.Minute):
		t.Errorf("%s: not every node learned every pod's identity in 10 minutes", name)
	}
	close(stop)
	observer.Wait()
	var last time.Time
	var perPod, addPod []time.Duration
	ids := map[uint32]bool{}
	for i := range specs {
		var m time.Time
		for ni := range nodes {
			if seen[i][ni].IsZero() {
				continue
			}
			if seen[i][ni].After(m) {
				m = seen[i][ni]
			}
			if ident[i][ni] != ident[i][0] {
				t.Errorf("pod %s: identity %d on %s, %d on %s", specs[i].name, ident[i][ni], c.Nodes[ni].Name, ident[i][0], c.Nodes[0].Name)
			}
		}
		ids[ident[i][0]] = true
		if pods[i] != nil && pods[i].Identity != ident[i][0] {
			t.Errorf("pod %s: the CNI ADD answered identity %d, the agents say %d", specs[i].name, pods[i].Identity, ident[i][0])
		}
		if m.After(last) {
			last = m
		}
		perPod = append(perPod, m.Sub(start[i]))
		addPod = append(addPod, added[i])
	}
	ic := IdentityCase{Name: name, Pods: len(specs), Identities: len(ids), CreateSeconds: created.Seconds(),
		TotalSeconds: last.Sub(first).Seconds(), PerPod: dist(perPod), AddPod: dist(addPod), PollRounds: rounds}
	ic.PodsPerSecond = float64(len(specs)) / ic.TotalSeconds
	ic.Allocated = countIdentities(t, c) - before
	t.Logf("%s: %d pods, %d identities (%d SecurityIdentities created): all known everywhere %.2fs after the first create (creates took %.2fs); per pod %v",
		name, ic.Pods, ic.Identities, ic.Allocated, ic.TotalSeconds, ic.CreateSeconds, ic.PerPod)
	return pods, ic
}

// countIdentities is the number of SecurityIdentity objects in the API: the cluster
// identities allocated so far.
func countIdentities(t *testing.T, c *clustertest.Cluster) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := c.Dynamic(t).Resource(identities.IdentityResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing SecurityIdentities: %v", err)
	}
	return len(l.Items)
}

// allSeen reports whether every pod was seen on every node (the observer's own view).
func allSeen(seen [][]time.Time) bool {
	for _, s := range seen {
		for _, at := range s {
			if at.IsZero() {
				return false
			}
		}
	}
	return true
}

// propagate writes the policy writes times, alternating the allowed port, and measures
// per selected endpoint when its node's pinned policy map holds the new rule.
func propagate(t *testing.T, c *clustertest.Cluster, ns string, pods []*clustertest.Pod, specs []podSpec, clients []*clustertest.Pod, writes int) PropagationResult {
	t.Helper()
	// The selected endpoints of each node, by endpoint id in its maps.
	watch := make([]nodeWatch, len(c.Nodes))
	var selected []*clustertest.Pod
	for ni, n := range c.Nodes {
		st := n.Status()
		m, err := ebpf.LoadPinnedMap(filepath.Join(st.BPFDir, "policy"), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			t.Fatalf("node %s's policy map: %v", n.Name, err)
		}
		t.Cleanup(func() { m.Close() })
		if m.KeySize() != 16 {
			t.Fatalf("policy map key size %d, want 16 (struct policy_key changed?)", m.KeySize())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		eps, err := n.Client.ListEndpoints(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]uint32{}
		for _, e := range eps {
			ids[e.Key()] = e.EpID
		}
		watch[ni] = nodeWatch{name: n.Name, m: m, epIndex: map[uint32]int{}}
		for i, p := range pods {
			if specs[i].selected && p.Node == n {
				id, ok := ids[p.Key()]
				if !ok {
					t.Fatalf("node %s has no endpoint for %s", n.Name, p.Key())
				}
				watch[ni].epIndex[id] = len(watch[ni].eps)
				watch[ni].eps = append(watch[ni].eps, p)
				selected = append(selected, p)
			}
		}
		if len(watch[ni].eps) == 0 {
			t.Fatalf("node %s: no selected endpoint (too few pods)", n.Name)
		}
	}
	pol := func(port int) *networkingv1.NetworkPolicy {
		tcp := corev1.ProtocolTCP
		return &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prop"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"sel": "1"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromInt32(int32(port)))}},
				}},
			},
		}
	}
	api := c.Client.NetworkingV1().NetworkPolicies(ns)
	// Warm-up, not measured: the policy exists and allows port 81 everywhere.
	ctx := context.Background()
	if _, err := api.Create(ctx, pol(81), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the policy: %v", err)
	}
	if _, err := waitEnforced(watch, time.Now(), 81, 80); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	res := PropagationResult{Writes: writes, SelectedEndpoints: len(selected), Target: Target.Seconds()}
	var all, perNode, apiWrites []time.Duration
	for w := range writes {
		port, old := 80, 81
		if w%2 == 1 {
			port, old = 81, 80
		}
		cur, err := api.Get(ctx, "prop", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec = pol(port).Spec
		t0 := time.Now()
		type done struct {
			lat []nodeLat
			err error
		}
		ch := make(chan done, 1)
		go func() { l, err := waitEnforced(watch, t0, port, old); ch <- done{l, err} }()
		if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("write %d: %v", w, err)
		}
		wrote := time.Since(t0)
		d := <-ch
		if d.err != nil {
			t.Fatalf("write %d (port %d): %v", w, port, d.err)
		}
		wr := WriteResult{Port: port, APISeconds: wrote.Seconds(), Nodes: map[string]float64{}}
		var these []time.Duration
		for _, nl := range d.lat {
			these = append(these, nl.eps...)
			all = append(all, nl.eps...)
			nodeMax := slices.Max(nl.eps)
			perNode = append(perNode, nodeMax)
			wr.Nodes[nl.node] = nodeMax.Seconds()
			wr.MaxSeconds = max(wr.MaxSeconds, nodeMax.Seconds())
		}
		wr.Endpoints = dist(these)
		apiWrites = append(apiWrites, wrote)
		// Real packets, for a sample: on every node one selected pod (rotating), from the
		// client of the next node: the new port connects, the old one is dropped.
		var probes []probe
		for ni, nw := range watch {
			to := nw.eps[w%len(nw.eps)]
			from := clients[(ni+1)%len(clients)]
			probes = append(probes, probe{from, to, uint16(port), true}, probe{from, to, uint16(old), false})
		}
		failed := runProbes(t, probes)
		res.Probes += len(probes)
		res.ProbesFailed += failed
		res.PerWrite = append(res.PerWrite, wr)
		t.Logf("write %d (port %d): API %.3fs, enforced on every selected endpoint after %.3fs, %d/%d probes as the policy says",
			w, port, wrote.Seconds(), wr.MaxSeconds, len(probes)-failed, len(probes))
	}
	res.PerEndpoint, res.PerNode, res.APIWrite = dist(all), dist(perNode), dist(apiWrites)
	res.Verdict = "PASS"
	if res.PerEndpoint.P99 > Target.Seconds() {
		res.Verdict = "MISS"
	}
	return res
}

func ptr[T any](v T) *T { return &v }

// nodeWatch is one node's pinned policy map and the selected endpoints on the node.
type nodeWatch struct {
	name    string
	m       *ebpf.Map
	eps     []*clustertest.Pod
	epIndex map[uint32]int // endpoint id -> index in eps
}

type nodeLat struct {
	node string
	eps  []time.Duration
}

// waitEnforced polls every node's pinned policy map until each selected endpoint has an
// entry for TCP port and none for old (the previous write's rule), and returns when each
// endpoint got there, after t0.
func waitEnforced(watch []nodeWatch, t0 time.Time, port, old int) ([]nodeLat, error) {
	out := make([]nodeLat, len(watch))
	errs := make([]error, len(watch))
	var wg sync.WaitGroup
	for ni, nw := range watch {
		wg.Go(func() {
			lat := make([]time.Duration, len(nw.eps))
			left := len(nw.eps)
			deadline := t0.Add(enforceTimeout)
			key := make([]byte, 16)
			val := make([]byte, nw.m.ValueSize())
			hasNew := make([]bool, len(nw.eps))
			hasOld := make([]bool, len(nw.eps))
			for left > 0 {
				clear(hasNew)
				clear(hasOld)
				it := nw.m.Iterate()
				for it.Next(&key, &val) {
					// struct policy_key (bpf/include/rampart.h): prefixlen u32, ep_id u32,
					// identity u32, direction u8, protocol u8, dport be16.
					i, ok := nw.epIndex[binary.NativeEndian.Uint32(key[4:8])]
					if !ok || key[13] != 6 {
						continue
					}
					switch int(binary.BigEndian.Uint16(key[14:16])) {
					case port:
						hasNew[i] = true
					case old:
						hasOld[i] = true
					}
				}
				now := time.Now()
				// An iteration racing with the agent's writes can stop early (an error):
				// then this read counts for nothing, and the next one decides.
				if it.Err() == nil {
					for i := range nw.eps {
						if lat[i] == 0 && hasNew[i] && !hasOld[i] {
							lat[i] = now.Sub(t0)
							left--
						}
					}
				}
				if left > 0 && now.After(deadline) {
					errs[ni] = fmt.Errorf("node %s: %d of %d selected endpoints without the rule for port %d after %v", nw.name, left, len(nw.eps), port, enforceTimeout)
					return
				}
				time.Sleep(2 * time.Millisecond) // poll interval: the resolution of the times
			}
			out[ni] = nodeLat{node: nw.name, eps: lat}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

type probe struct {
	from, to *clustertest.Pod
	port     uint16
	want     bool
}

// runProbes runs the probes at once and reports (as test errors) and counts those whose
// outcome is not the wanted one.
func runProbes(t *testing.T, probes []probe) int {
	got := make([]bool, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Go(func() {
			timeout := allowWait
			if !p.want {
				timeout = denyWait
			}
			got[i] = p.from.Probe(p.to.IP, p.port, "tcp", timeout)
		})
	}
	wg.Wait()
	failed := 0
	for i, p := range probes {
		if got[i] != p.want {
			failed++
			t.Errorf("%s (%s) -> %s (%s) tcp/%d: connected %v, want %v", p.from.Key(), p.from.Node.Name, p.to.Key(), p.to.Node.Name, p.port, got[i], p.want)
		}
	}
	return failed
}
