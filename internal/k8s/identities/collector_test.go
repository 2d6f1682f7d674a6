package identities

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

// inUse is a test's view of the label sets its pods use.
type inUse struct {
	mu     sync.Mutex
	keys   map[string]bool
	synced bool
}

func (u *inUse) get() (map[string]bool, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]bool{}
	for k := range u.keys {
		out[k] = true
	}
	return out, u.synced
}

func (u *inUse) set(synced bool, ls ...labels.Labels) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.synced = synced
	u.keys = map[string]bool{}
	for _, l := range ls {
		u.keys[identity.LabelsKey(l)] = true
	}
}

// runCollector runs a collector until the test ends (or the returned cancel).
func runCollector(t *testing.T, c *k8stest.Cluster, opts CollectorOptions) context.CancelFunc {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunCollector(ctx, c.Config, opts) }()
	stop := sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("RunCollector: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("RunCollector did not return after its context ended")
		}
	})
	t.Cleanup(stop)
	return stop
}

const shortGrace = 2 * time.Second

// fastLease makes leader election quick enough for tests.
func fastLease(o CollectorOptions) CollectorOptions {
	o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 2*time.Second, 1500*time.Millisecond, 200*time.Millisecond
	return o
}

// Collection against a real API server: nothing happens while the caller's caches are not
// synced; then an unused identity is marked and deleted after the grace period (its claim
// too, and every agent forgets it), one in use is kept, one allocated again during its
// grace is unmarked by Allocate and kept, and a claim left by an agent that stopped between
// its two writes is deleted.
func TestCollector(t *testing.T) {
	c := k8stest.Start(t)
	c.InstallCRDs(t)
	d := dyn(t, c)
	var changes atomic.Int32
	a := startAllocator(t, c, Options{OnChange: func() { changes.Add(1) }})
	observer := startAllocator(t, c, Options{})
	ctx := ctxT(t, 2*time.Minute)
	ns := "gc-" + testenv.Suffix(6)
	unused, used, again := podLabels(ns, "unused"), podLabels(ns, "used"), podLabels(ns, "again")
	ids := map[string]identity.Identity{}
	for name, l := range map[string]labels.Labels{"unused": unused, "used": used, "again": again} {
		id, err := a.Allocate(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = id
	}
	// A claim whose SecurityIdentity never existed: an agent stopped between its writes.
	orphan := newClaim(9000, SetName("gone"), "5d1c0a6e-0000-4000-8000-000000000000")
	if _, err := d.Resource(ClaimResource).Create(ctx, orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A SecurityIdentity made by hand whose name is not its labels' hash: the collector
	// logs it and leaves it alone.
	bad := newSet(podLabels(ns, "handmade"), 9100)
	bad.SetName("handmade")
	if _, err := d.Resource(IdentityResource).Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	pods := &inUse{}
	pods.set(false)
	logs := &logBuf{}
	runCollector(t, c, fastLease(CollectorOptions{Holder: "node-1", InUse: pods.get, Grace: shortGrace, Interval: 200 * time.Millisecond, Logf: func(f string, args ...any) {
		logs.Logf(f, args...)
		t.Logf(f, args...)
	}}))

	get := func(l labels.Labels) (*setObj, bool) {
		u, err := d.Resource(IdentityResource).Get(ctx, SetName(identity.LabelsKey(l)), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, false
		}
		if err != nil {
			t.Fatal(err)
		}
		s, err := parseSet(u)
		if err != nil {
			t.Fatal(err)
		}
		return s, true
	}
	claimExists := func(id identity.Identity) bool {
		_, err := d.Resource(ClaimResource).Get(ctx, ClaimName(id), metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}

	// Not synced: for twice the grace, nothing is marked or deleted.
	time.Sleep(2 * shortGrace) // the assertion is that nothing happens in this time
	for _, l := range []labels.Labels{unused, used, again} {
		if s, ok := get(l); !ok || s.marked {
			t.Fatalf("%s while the caller is not synced: exists %v, marked %v", l, ok, ok && s.marked)
		}
	}
	if !claimExists(9000) {
		t.Fatal("the orphan claim was deleted while the caller is not synced")
	}

	pods.set(true, used)
	began := time.Now()
	// "again" is marked; allocating it again unmarks it at once, and it is in use from now.
	if !testenv.Eventually(10*time.Second, func() bool { s, ok := get(again); return ok && s.marked }) {
		t.Fatal("the unused identity is never marked")
	}
	// The collector pauses (caller not synced) so that only Allocate can unmark it.
	pods.set(false, used)
	id, err := a.Allocate(ctx, again)
	if err != nil || id != ids["again"] {
		t.Fatalf("allocating a marked identity again: %d, %v; want %d", id, err, ids["again"])
	}
	if s, ok := get(again); !ok || s.marked {
		t.Fatalf("after Allocate: exists %v, marked %v; want unmarked", ok, ok && s.marked)
	}
	pods.set(true, used, again)

	// "unused" goes after the grace, with its claim; every agent forgets it.
	if !testenv.Eventually(15*time.Second, func() bool { _, ok := get(unused); return !ok }) {
		t.Fatal("the unused identity is never deleted")
	}
	if el := time.Since(began); el < shortGrace {
		t.Errorf("deleted %v after the caller synced, before the grace of %v", el, shortGrace)
	}
	if !testenv.Eventually(10*time.Second, func() bool { return !claimExists(ids["unused"]) }) {
		t.Error("the deleted identity's claim stays")
	}
	for name, x := range map[string]*Allocator{"allocating": a, "observing": observer} {
		if !testenv.Eventually(10*time.Second, func() bool {
			_, ok := x.Lookup(unused)
			_, ok2 := x.LabelsOf(ids["unused"])
			return !ok && !ok2
		}) {
			t.Errorf("the %s agent still knows the deleted identity", name)
		}
	}
	if !testenv.Eventually(10*time.Second, func() bool { return !claimExists(9000) }) {
		t.Error("the orphan claim stays")
	}

	// Two more graces: those in use stay, unmarked, with their claims.
	time.Sleep(2 * shortGrace) // the assertion is that nothing happens in this time
	for _, name := range []string{"used", "again"} {
		l := map[string]labels.Labels{"used": used, "again": again}[name]
		s, ok := get(l)
		if !ok || s.marked || s.id != ids[name] || !claimExists(ids[name]) {
			t.Errorf("%s in use: exists %v, marked %v; want kept with claim %d", name, ok, ok && s.marked, ids[name])
		}
		if got, ok := observer.Lookup(l); !ok || got != ids[name] {
			t.Errorf("%s: the observing agent's Lookup %d %v, want %d", name, got, ok, ids[name])
		}
	}
	// A set allocated anew after collection gets a new number, even by an agent whose
	// search starts there: the old one was just freed.
	if !testenv.Eventually(10*time.Second, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		_, known := a.claims[ids["unused"]]
		return !known
	}) {
		t.Fatal("the allocator never sees the claim's deletion")
	}
	a.cursor = ids["unused"]
	id, err = a.Allocate(ctx, unused)
	if err != nil {
		t.Fatal(err)
	}
	if id == ids["unused"] {
		t.Errorf("the collected number %d handed out again at once", id)
	}
	if changes.Load() == 0 {
		t.Error("OnChange never called")
	}
	if !logs.has("collector ignoring SecurityIdentity handmade") {
		t.Error("the collector did not log the hand-made object")
	}
	if _, err := d.Resource(IdentityResource).Get(ctx, "handmade", metav1.GetOptions{}); err != nil {
		t.Errorf("the hand-made object: %v, want left alone", err)
	}
}

// Two collectors on one Lease: one collects at a time, the Lease names it, and the other
// takes over when it stops.
func TestCollectorLease(t *testing.T) {
	c := k8stest.Start(t)
	c.InstallCRDs(t)
	pods := &inUse{}
	pods.set(false)
	var mu sync.Mutex
	leading := map[string]bool{}
	maxLeaders := 0
	onLeading := func(holder string) func(bool) {
		return func(l bool) {
			mu.Lock()
			defer mu.Unlock()
			leading[holder] = l
			n := 0
			for _, v := range leading {
				if v {
					n++
				}
			}
			maxLeaders = max(maxLeaders, n)
		}
	}
	leader := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for h, v := range leading {
			if v {
				out = append(out, h)
			}
		}
		return out
	}
	stops := map[string]context.CancelFunc{}
	for _, h := range []string{"node-a", "node-b"} {
		stops[h] = runCollector(t, c, fastLease(CollectorOptions{Holder: h, InUse: pods.get, Grace: shortGrace, OnLeading: onLeading(h)}))
	}
	if !testenv.Eventually(15*time.Second, func() bool { return len(leader()) == 1 }) {
		t.Fatalf("leaders %v, want one", leader())
	}
	first := leader()[0]
	lease, err := c.Client.CoordinationV1().Leases("kube-system").Get(ctxT(t, 10*time.Second), "rampart-identity-collector", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != first {
		t.Errorf("Lease holder %v, want %s", lease.Spec.HolderIdentity, first)
	}
	// For a few renewals the other does not take it.
	time.Sleep(3 * time.Second) // the assertion is that nothing changes in this time
	if got := leader(); len(got) != 1 || got[0] != first {
		t.Errorf("leaders %v, want still just %s", got, first)
	}
	stops[first]()
	if !testenv.Eventually(15*time.Second, func() bool { l := leader(); return len(l) == 1 && l[0] != first }) {
		t.Fatalf("leaders %v after %s stopped, want the other", leader(), first)
	}
	mu.Lock()
	defer mu.Unlock()
	if maxLeaders != 1 {
		t.Errorf("%d collectors led at once", maxLeaders)
	}
}

// The race between collecting and allocating, made to happen: the collector read an
// identity marked unused for longer than the grace, then an agent allocated it (which
// unmarks it), then the collector deletes what it read. The deletion is refused and the
// identity stays valid.
// It runs in TestAllocator's control plane (it needs no collector running).
func testCollectorLosesToAllocate(t *testing.T, c *k8stest.Cluster, d dynamic.Interface) {
	ctx := ctxT(t, time.Minute)
	a := startAllocator(t, c, Options{})
	l := podLabels("race-"+testenv.Suffix(6), "late")
	id, err := a.Allocate(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	name := SetName(identity.LabelsKey(l))
	read := func() *setObj {
		u, err := d.Resource(IdentityResource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := parseSet(u)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Marked an hour ago, as a collector would have.
	u, err := d.Resource(IdentityResource).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.SetAnnotations(map[string]string{UnusedSinceAnnotation: time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)})
	if _, err := d.Resource(IdentityResource).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	stale := read()
	if !stale.marked {
		t.Fatal("the mark did not stick")
	}
	if !testenv.Eventually(10*time.Second, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.sets[name] != nil && a.sets[name].marked
	}) {
		t.Fatal("the allocator never sees the mark")
	}
	if got, err := a.Allocate(ctx, l); err != nil || got != id {
		t.Fatalf("Allocate of the marked identity: %d, %v; want %d", got, err, id)
	}
	col := &collector{client: d, opts: CollectorOptions{Logf: t.Logf}}
	deleted, err := col.deleteSet(ctx, stale)
	if err != nil || deleted {
		t.Fatalf("deleting the identity as read before Allocate: deleted %v, %v; want refused", deleted, err)
	}
	if s := read(); s.marked || s.id != id {
		t.Errorf("after the refused deletion: %+v, want unmarked with %d", s, id)
	}
	if got, ok := a.Lookup(l); !ok || got != id {
		t.Errorf("Lookup: %d %v, want %d", got, ok, id)
	}
	// Control: the same deletion with the current version goes through.
	if deleted, err := col.deleteSet(ctx, read()); err != nil || !deleted {
		t.Errorf("deleting the current version: deleted %v, %v; want deleted", deleted, err)
	}
}
