package identities

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// logBuf collects what an allocator logs, for tests that check an object was ignored.
type logBuf struct {
	mu    sync.Mutex
	lines []string
}

func (b *logBuf) Logf(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, fmt.Sprintf(format, args...))
}

func (b *logBuf) has(sub string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range b.lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}

// startAllocator makes an allocator with its own client and starts its informers; they
// stop when the test ends.
func startAllocator(t testing.TB, c *k8stest.Cluster, opts Options) *Allocator {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	a, err := NewAllocator(c.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	// The informers run until the context of Start ends: the end of the test.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return a
}

func dyn(t testing.TB, c *k8stest.Cluster) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// claimsBySet returns the numbers of the claims in the API, by the SecurityIdentity they
// name.
func claimsBySet(t testing.TB, d dynamic.Interface) map[string][]identity.Identity {
	t.Helper()
	list, err := d.Resource(ClaimResource).List(ctxT(t, 10*time.Second), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]identity.Identity{}
	for i := range list.Items {
		if c, err := parseClaim(&list.Items[i]); err == nil {
			out[c.setName] = append(out[c.setName], c.id)
		}
	}
	return out
}

func podLabels(ns, app string) labels.Labels {
	return labels.Labels{labels.KeyNamespace: ns, "app": app}
}

// The allocator against a real API server: racing agents, distinct sets, cache
// propagation, the number guard and objects it must ignore. One control plane for all,
// each subtest with its own label sets.
func TestAllocator(t *testing.T) {
	c := k8stest.Start(t)
	c.InstallCRDs(t)
	d := dyn(t, c)

	// Eight agents (eight clients, eight informers) allocate one label set at once: one
	// identity, one SecurityIdentity, one claim.
	t.Run("SameSetRacing", func(t *testing.T) {
		l := podLabels("race-"+testenv.Suffix(6), "web")
		var allocs []*Allocator
		for range 8 {
			allocs = append(allocs, startAllocator(t, c, Options{}))
		}
		ids := make([]identity.Identity, len(allocs))
		errs := make([]error, len(allocs))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, a := range allocs {
			wg.Go(func() {
				<-start
				ids[i], errs[i] = a.Allocate(ctxT(t, 30*time.Second), l)
			})
		}
		close(start)
		wg.Wait()
		for i := range allocs {
			if errs[i] != nil {
				t.Fatalf("allocator %d: %v", i, errs[i])
			}
			if ids[i] != ids[0] {
				t.Fatalf("allocators got different identities: %v", ids)
			}
		}
		if ids[0] < identity.FirstEndpoint || ids[0] >= identity.FirstCIDR {
			t.Errorf("identity %d outside the endpoint range", ids[0])
		}
		name := SetName(identity.LabelsKey(l))
		u, err := d.Resource(IdentityResource).Get(ctxT(t, 10*time.Second), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the SecurityIdentity: %v", err)
		}
		s, err := parseSet(u)
		if err != nil || s.id != ids[0] || !s.labels.Equal(l) {
			t.Errorf("SecurityIdentity %s: %+v, %v; want number %d, labels %s", name, s, err, ids[0], l)
		}
		if got := claimsBySet(t, d)[name]; len(got) != 1 || got[0] != ids[0] {
			t.Errorf("claims naming %s: %v, want just %d", name, got, ids[0])
		}
		// Every agent's cache agrees, and allocating again asks nothing new.
		for i, a := range allocs {
			if !testenv.Eventually(10*time.Second, func() bool { id, ok := a.Lookup(l); return ok && id == ids[0] }) {
				t.Errorf("allocator %d: Lookup does not show %d", i, ids[0])
			}
		}
	})

	// Fifty label sets from five agents at once, all starting their search at the same
	// number so that they do race for numbers: fifty distinct numbers, each claimed by its
	// own set.
	t.Run("DistinctSetsRacingForNumbers", func(t *testing.T) {
		ns := "distinct-" + testenv.Suffix(6)
		var allocs []*Allocator
		for range 5 {
			a := startAllocator(t, c, Options{})
			a.cursor = 5000
			allocs = append(allocs, a)
		}
		const n = 50
		ids := make([]identity.Identity, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			a := allocs[i%len(allocs)]
			wg.Go(func() {
				<-start
				ids[i], errs[i] = a.Allocate(ctxT(t, 30*time.Second), podLabels(ns, fmt.Sprint("app-", i)))
			})
		}
		began := time.Now()
		close(start)
		wg.Wait()
		var taken int64
		for _, a := range allocs {
			taken += a.taken.Load()
		}
		t.Logf("%d sets from %d agents racing for numbers: %v, %d numbers found taken", n, len(allocs), time.Since(began).Round(time.Millisecond), taken)
		if taken == 0 {
			t.Error("no agent ever found its number taken: the test did not make them race")
		}
		seen := map[identity.Identity]int{}
		claims := claimsBySet(t, d)
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("set %d: %v", i, errs[i])
			}
			if j, dup := seen[ids[i]]; dup {
				t.Errorf("sets %d and %d both got %d", j, i, ids[i])
			}
			seen[ids[i]] = i
			name := SetName(identity.LabelsKey(podLabels(ns, fmt.Sprint("app-", i))))
			if got := claims[name]; len(got) != 1 || got[0] != ids[i] {
				t.Errorf("set %d: claims %v, want just %d", i, got, ids[i])
			}
		}
		// Every agent sees all fifty, each number with its own labels.
		for k, a := range allocs {
			ok := testenv.Eventually(10*time.Second, func() bool {
				for i := range n {
					l, ok := a.LabelsOf(ids[i])
					if !ok || !l.Equal(podLabels(ns, fmt.Sprint("app-", i))) {
						return false
					}
				}
				return true
			})
			if !ok {
				t.Errorf("allocator %d does not map all fifty numbers to their labels", k)
			}
		}
	})

	// One agent allocates; another learns it from its informer (Lookup, LabelsOf, List,
	// OnChange) without an API call of its own.
	t.Run("CachePropagation", func(t *testing.T) {
		var changes atomic.Int32
		b := startAllocator(t, c, Options{OnChange: func() { changes.Add(1) }})
		a := startAllocator(t, c, Options{})
		l := podLabels("prop-"+testenv.Suffix(6), "db")
		if _, ok := b.Lookup(l); ok {
			t.Fatal("Lookup finds a set nobody allocated")
		}
		before := changes.Load()
		id, err := a.Allocate(ctxT(t, 10*time.Second), l)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := a.Lookup(l); !ok || got != id {
			t.Errorf("the allocating agent's Lookup: %d %v, want %d", got, ok, id)
		}
		if !testenv.Eventually(10*time.Second, func() bool { got, ok := b.Lookup(l); return ok && got == id }) {
			t.Fatalf("the other agent's Lookup never shows %d", id)
		}
		if got, ok := b.LabelsOf(id); !ok || !got.Equal(l) {
			t.Errorf("LabelsOf(%d) = %s %v, want %s", id, got, ok, l)
		}
		if got := b.List()[id]; !got.Equal(l) {
			t.Errorf("List()[%d] = %s, want %s", id, got, l)
		}
		if changes.Load() == before {
			t.Error("OnChange not called for the new identity")
		}
	})

	// The number guard: a number whose claim exists is never handed to another set, even
	// by an agent whose cache does not know the claim (never started: only the API server
	// can stop it). Without the claim the same agent takes the number, so the check can
	// fail.
	t.Run("ClaimedNumberSkipped", func(t *testing.T) {
		const n = 7000
		ns := "guard-" + testenv.Suffix(6)
		claim := newClaim(n, "someone-else", "0d5bd6c4-0000-4000-8000-000000000000")
		if _, err := d.Resource(ClaimResource).Create(ctxT(t, 10*time.Second), claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		a, err := NewAllocator(c.Config, Options{Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		a.cursor = n
		id, err := a.Allocate(ctxT(t, 10*time.Second), podLabels(ns, "a"))
		if err != nil {
			t.Fatal(err)
		}
		if id == n {
			t.Fatalf("got claimed number %d", n)
		}
		u, err := d.Resource(ClaimResource).Get(ctxT(t, 10*time.Second), ClaimName(n), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cl, err := parseClaim(u); err != nil || cl.setName != "someone-else" {
			t.Errorf("claim %d changed: %+v %v", n, cl, err)
		}
		// Control: with the claim gone, an agent starting at n takes n.
		if err := d.Resource(ClaimResource).Delete(ctxT(t, 10*time.Second), ClaimName(n), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		b, err := NewAllocator(c.Config, Options{Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		b.cursor = n
		if id, err := b.Allocate(ctxT(t, 10*time.Second), podLabels(ns, "b")); err != nil || id != n {
			t.Errorf("with number %d free: got %d, %v", n, id, err)
		}
	})

	t.Run("CollectionLosesToAllocate", func(t *testing.T) { testCollectorLosesToAllocate(t, c, d) })

	// Another agent moves the SecurityIdentity to another number (and claims it) between
	// this agent's read and its claim, and the old number happens to be free: the claim
	// succeeds, the read that follows sees the move, the stale claim is taken back, and
	// Allocate returns the number the object holds.
	t.Run("MovedBeforeClaim", func(t *testing.T) {
		a, err := NewAllocator(c.Config, Options{Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxT(t, 30*time.Second)
		const stale, moved = 11000, 11500
		a.cursor = stale
		l := podLabels("moved-"+testenv.Suffix(6), "m")
		name := SetName(identity.LabelsKey(l))
		a.beforeClaim = func(s *setObj) {
			if s.id != stale {
				return
			}
			u, err := d.Resource(IdentityResource).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Error(err)
				return
			}
			if err := unstructured.SetNestedField(u.Object, int64(moved), "spec", "identity"); err != nil {
				t.Error(err)
				return
			}
			if _, err := d.Resource(IdentityResource).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
				t.Error(err)
				return
			}
			if _, err := d.Resource(ClaimResource).Create(ctx, newClaim(moved, name, u.GetUID()), metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		}
		id, err := a.Allocate(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		if id != moved {
			t.Errorf("Allocate returned %d, want %d, the number the SecurityIdentity holds", id, moved)
		}
		if got := claimsBySet(t, d)[name]; len(got) != 1 || got[0] != moved {
			t.Errorf("claims naming the set: %v, want just %d (the stale one taken back)", got, moved)
		}
	})

	// The collector deleted an identity (marked, as it always is first) and this agent's
	// informer has not told it yet: Allocate finds it gone and creates it anew.
	t.Run("DeletedBehindMemory", func(t *testing.T) {
		a := startAllocator(t, c, Options{})
		ctx := ctxT(t, 30*time.Second)
		l := podLabels("behind-"+testenv.Suffix(6), "x")
		id, err := a.Allocate(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		name := SetName(identity.LabelsKey(l))
		a.mu.Lock()
		stale := *a.sets[name]
		a.mu.Unlock()
		stale.marked, stale.unusedSince = true, time.Now().Add(-time.Hour)
		for _, del := range []struct {
			res  schema.GroupVersionResource
			name string
		}{{IdentityResource, name}, {ClaimResource, ClaimName(id)}} {
			if err := d.Resource(del.res).Delete(ctx, del.name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if !testenv.Eventually(10*time.Second, func() bool { _, ok := a.Lookup(l); return !ok }) {
			t.Fatal("the informer never reports the deletion")
		}
		// Memory behind: the marked object as it was before the deletion.
		a.mu.Lock()
		a.sets[name] = &stale
		a.mu.Unlock()
		got, err := a.Allocate(ctx, l)
		if err != nil {
			t.Fatalf("Allocate after the deletion: %v", err)
		}
		if got == id {
			t.Errorf("the deleted number %d handed out again at once", id)
		}
		if lg, ok := a.LabelsOf(got); !ok || !lg.Equal(l) {
			t.Errorf("LabelsOf(%d) = %s %v, want %s", got, lg, ok, l)
		}
	})

	// Objects that the protocol would never write (made by hand) are logged, ignored, and
	// never used; the API server's schema refuses what it can.
	t.Run("BadObjects", func(t *testing.T) {
		ns := "bad-" + testenv.Suffix(6)
		logs := &logBuf{}
		a := startAllocator(t, c, Options{Logf: logs.Logf})
		ctx := ctxT(t, 30*time.Second)
		create := func(res, name string, spec map[string]any) error {
			gvr, kind := IdentityResource, "SecurityIdentity"
			if res == "claim" {
				gvr, kind = ClaimResource, "SecurityIdentityClaim"
			}
			u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": Group + "/" + Version, "kind": kind, "spec": spec}}
			u.SetName(name)
			_, err := d.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
			return err
		}
		lm := func(l labels.Labels) map[string]any {
			m := map[string]any{}
			for k, v := range l {
				m[k] = v
			}
			return m
		}
		// The schema: a reserved number, a number past the VNI, labels that are not
		// strings, no spec at all.
		for _, spec := range []map[string]any{
			{"identity": int64(5), "labels": map[string]any{"a": "b"}},
			{"identity": int64(1 << 24), "labels": map[string]any{"a": "b"}},
			{"identity": "300", "labels": map[string]any{"a": "b"}},
			{"identity": int64(300), "labels": map[string]any{"a": int64(1)}},
			{"identity": int64(300)},
		} {
			if err := create("set", "schema-"+testenv.Suffix(6), spec); !apierrors.IsInvalid(err) {
				t.Errorf("SecurityIdentity with spec %v: %v, want refused as invalid", spec, err)
			}
		}
		if err := create("claim", "301", map[string]any{"securityIdentity": map[string]any{"name": "x"}}); !apierrors.IsInvalid(err) {
			t.Errorf("claim without uid: %v, want refused as invalid", err)
		}

		// A SecurityIdentity named for one set but holding another's labels, with a
		// claim naming it: neither set resolves, and allocating the set its name stands
		// for fails rather than guessing.
		victim, other := podLabels(ns, "victim"), podLabels(ns, "other")
		wrong := SetName(identity.LabelsKey(victim))
		if err := create("set", wrong, map[string]any{"identity": int64(8000), "labels": lm(other)}); err != nil {
			t.Fatal(err)
		}
		u, err := d.Resource(IdentityResource).Get(ctx, wrong, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := create("claim", "8000", map[string]any{"securityIdentity": map[string]any{"name": wrong, "uid": string(u.GetUID())}}); err != nil {
			t.Fatal(err)
		}
		// Claims named by what is not a canonical number of the range.
		for _, name := range []string{"abc", "08001", "255", "16777216"} {
			if err := create("claim", name, map[string]any{"securityIdentity": map[string]any{"name": wrong, "uid": string(u.GetUID())}}); err != nil {
				t.Fatalf("claim %s: %v", name, err)
			}
		}
		for _, want := range []string{"SecurityIdentity " + wrong, "SecurityIdentityClaim abc", "SecurityIdentityClaim 08001", "SecurityIdentityClaim 255", "SecurityIdentityClaim 16777216"} {
			if !testenv.Eventually(10*time.Second, func() bool { return logs.has(want) }) {
				t.Errorf("no log line about %s", want)
			}
		}
		for _, l := range []labels.Labels{victim, other} {
			if id, ok := a.Lookup(l); ok {
				t.Errorf("Lookup(%s) = %d from a bad object", l, id)
			}
		}
		if l, ok := a.LabelsOf(8000); ok {
			t.Errorf("LabelsOf(8000) = %s from a bad object", l)
		}
		if _, err := a.Allocate(ctx, victim); err == nil || !strings.Contains(err.Error(), wrong) {
			t.Errorf("Allocate of the set whose name a bad object holds: %v, want an error naming %s", err, wrong)
		}
		// The agent carries on: another set allocates, and 8000 is not given out again.
		a.cursor = 8000
		id, err := a.Allocate(ctx, other)
		if err != nil || id == 8000 {
			t.Errorf("Allocate(%s) = %d, %v; want a number other than the claimed 8000", other, id, err)
		}
		if got, ok := a.Lookup(other); !ok || got != id {
			t.Errorf("Lookup(%s) = %d %v, want %d", other, got, ok, id)
		}
	})
}
