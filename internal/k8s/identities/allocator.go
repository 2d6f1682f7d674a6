package identities

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
)

// Options configure an Allocator.
type Options struct {
	// Logf reports objects that are ignored (malformed, or not what their name says).
	// Nil: the standard logger.
	Logf func(format string, args ...any)
	// OnChange is called after the set of valid identities changed (one was added, removed,
	// or given other labels), by an agent's Allocate or any other's, once Lookup, LabelsOf
	// and List show the change. It runs on the informer's goroutine and must not block:
	// signal a worker.
	OnChange func()
	// ReuseDelay is how long a number whose claim was deleted is not handed out again by
	// this allocator (the numbers of collected identities may still be in flight in
	// packets and flow records). Zero: 10 minutes.
	ReuseDelay time.Duration
	// QPS and Burst limit the allocator's API requests. Zero: 200 and 400 (client-go's
	// defaults of 5 and 10 would make allocating a thousand pods take minutes).
	QPS   float32
	Burst int
}

// maxRounds bounds Allocate's rounds of API reads and writes for one label set. Each round
// ends in a write that failed because another agent wrote first, so running out means
// something keeps rewriting the object: an error, not a reason to spin.
const maxRounds = 64

// Allocator allocates cluster-wide identities for one agent, and keeps every identity of the
// cluster in memory. It is safe for concurrent use.
type Allocator struct {
	client  dynamic.Interface
	opts    Options
	factory dynamicinformer.DynamicSharedInformerFactory

	mu     sync.Mutex
	sets   map[string]*setObj // by name, as last read (informer or this allocator's writes)
	claims map[identity.Identity]*claimObj
	freed  map[identity.Identity]time.Time // numbers whose claim was deleted, and when
	cursor identity.Identity               // where the search for a free number starts

	// taken counts the numbers this allocator tried that another set's claim held (its
	// cache did not know yet): how often the API server's guard was needed.
	taken atomic.Int64
	// beforeClaim, if set (by tests), runs before each claim is created: the window in
	// which another agent may move the SecurityIdentity.
	beforeClaim func(s *setObj)
}

// NewAllocator returns an allocator using cfg. It makes no request before Start.
func NewAllocator(cfg *rest.Config, opts Options) (*Allocator, error) {
	cfg = rest.CopyConfig(cfg)
	if opts.QPS == 0 {
		opts.QPS = 200
	}
	if opts.Burst == 0 {
		opts.Burst = 400
	}
	cfg.QPS, cfg.Burst = opts.QPS, opts.Burst
	if opts.Logf == nil {
		opts.Logf = log.Printf
	}
	if opts.ReuseDelay == 0 {
		opts.ReuseDelay = 10 * time.Minute
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("identity allocator client: %w", err)
	}
	return &Allocator{
		client:  client,
		opts:    opts,
		factory: dynamicinformer.NewDynamicSharedInformerFactory(client, 0),
		sets:    map[string]*setObj{},
		claims:  map[identity.Identity]*claimObj{},
		freed:   map[identity.Identity]time.Time{},
		// A random start spreads agents over the range: they seldom race for a number,
		// and a number one of them freed is far from where the others allocate.
		cursor: identity.FirstEndpoint + identity.Identity(rand.Uint32N(uint32(lastEndpoint-identity.FirstEndpoint+1))),
	}, nil
}

// Start starts the informers on both kinds and returns when they have synced (every
// existing identity is known), or with an error if the kinds are not served (the CRDs are
// not installed) or ctx ends first. The informers run until ctx ends.
func (a *Allocator) Start(ctx context.Context) error {
	for _, r := range []struct {
		res  schema.GroupVersionResource
		name string
	}{{IdentityResource, "SecurityIdentities"}, {ClaimResource, "SecurityIdentityClaims"}} {
		// One plain list first: without the CRDs the informer would retry forever.
		if _, err := a.client.Resource(r.res).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return fmt.Errorf("listing %s (are Rampart's CRDs installed?): %w", r.name, err)
		}
	}
	setInf := a.factory.ForResource(IdentityResource).Informer()
	claimInf := a.factory.ForResource(ClaimResource).Informer()
	setReg, err := setInf.AddEventHandler(a.handlers(func(u *unstructured.Unstructured) error {
		s, err := parseSet(u)
		if err == nil {
			a.upsertSet(s)
		}
		return err
	}, a.removeSet))
	if err != nil {
		return fmt.Errorf("watching SecurityIdentities: %w", err)
	}
	claimReg, err := claimInf.AddEventHandler(a.handlers(func(u *unstructured.Unstructured) error {
		c, err := parseClaim(u)
		if err == nil {
			a.upsertClaim(c)
		}
		return err
	}, a.removeClaim))
	if err != nil {
		return fmt.Errorf("watching SecurityIdentityClaims: %w", err)
	}
	a.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), setReg.HasSynced, claimReg.HasSynced) {
		return fmt.Errorf("syncing the identity caches: %w", context.Cause(ctx))
	}
	return nil
}

// unwrap returns the object of an informer event, also of a deletion whose final state
// the informer missed.
func unwrap(o any) (*unstructured.Unstructured, bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	u, ok := o.(*unstructured.Unstructured)
	return u, ok
}

// handlers returns informer handlers that keep one kind in memory: apply parses and stores
// an object, remove forgets an incarnation (name, UID).
func (a *Allocator) handlers(apply func(*unstructured.Unstructured) error, remove func(name, uid string)) cache.ResourceEventHandlerFuncs {
	on := func(o any, deleted bool) {
		u, ok := unwrap(o)
		if !ok {
			return
		}
		if !deleted {
			err := apply(u)
			if err == nil {
				return
			}
			a.opts.Logf("identities: ignoring %v", err)
			// What it said before it became malformed no longer holds.
		}
		remove(u.GetName(), string(u.GetUID()))
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { on(o, false) },
		UpdateFunc: func(_, o any) { on(o, false) },
		DeleteFunc: func(o any) { on(o, true) },
	}
}

// validLocked returns the SecurityIdentity that validly holds number id: the claim of id
// names it by name and UID, and it names id.
func (a *Allocator) validLocked(id identity.Identity) *setObj {
	c := a.claims[id]
	if c == nil {
		return nil
	}
	s := a.sets[c.setName]
	if s == nil || s.uid != c.setUID || s.id != id {
		return nil
	}
	return s
}

// stateLocked describes what number id means now, to tell whether an event changed it.
func (a *Allocator) stateLocked(id identity.Identity) string {
	if s := a.validLocked(id); s != nil {
		return s.uid
	}
	return ""
}

// change runs f under the lock and calls OnChange if the meaning of any number that f may
// touch (ids, computed under the lock before f) changed.
func (a *Allocator) change(ids func() []identity.Identity, f func()) {
	a.mu.Lock()
	touched := ids()
	before := make([]string, len(touched))
	for i, id := range touched {
		before[i] = a.stateLocked(id)
	}
	f()
	changed := false
	for i, id := range touched {
		if before[i] != a.stateLocked(id) {
			changed = true
		}
	}
	a.mu.Unlock()
	if changed && a.opts.OnChange != nil {
		a.opts.OnChange()
	}
}

func (a *Allocator) upsertSet(s *setObj) {
	a.change(func() []identity.Identity { return append(a.setIDsLocked(s.name), s.id) }, func() { a.sets[s.name] = s })
}

func (a *Allocator) setIDsLocked(name string) []identity.Identity {
	if s := a.sets[name]; s != nil {
		return []identity.Identity{s.id}
	}
	return nil
}

// removeSet forgets the SecurityIdentity name if it still is the incarnation uid (a newer
// one this allocator created may already be cached).
func (a *Allocator) removeSet(name, uid string) {
	a.change(func() []identity.Identity { return a.setIDsLocked(name) }, func() {
		if s := a.sets[name]; s != nil && s.uid == uid {
			delete(a.sets, name)
		}
	})
}

func (a *Allocator) upsertClaim(c *claimObj) {
	a.change(func() []identity.Identity { return []identity.Identity{c.id} }, func() { a.claims[c.id] = c })
}

func (a *Allocator) removeClaim(name, uid string) {
	c, err := parseClaim(&unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"securityIdentity": map[string]any{"name": "-", "uid": "-"}},
	}})
	if err != nil {
		return // a malformed name was never cached
	}
	a.change(func() []identity.Identity { return []identity.Identity{c.id} }, func() {
		if cur := a.claims[c.id]; cur != nil && cur.uid == uid {
			delete(a.claims, c.id)
			a.freed[c.id] = time.Now()
		}
	})
}

// Lookup returns the valid identity of label set l from memory, without an API call.
func (a *Allocator) Lookup(l labels.Labels) (identity.Identity, bool) {
	key := identity.LabelsKey(l)
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.sets[SetName(key)]
	if s == nil || s.key != key || a.validLocked(s.id) != s {
		return 0, false
	}
	return s.id, true
}

// LabelsOf returns the label set of a valid identity, from memory.
func (a *Allocator) LabelsOf(id identity.Identity) (labels.Labels, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.validLocked(id)
	if s == nil {
		return nil, false
	}
	return copyLabels(s.labels), true
}

// List returns every valid identity of the cluster with its label set.
func (a *Allocator) List() map[identity.Identity]labels.Labels {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[identity.Identity]labels.Labels, len(a.claims))
	for id := range a.claims {
		if s := a.validLocked(id); s != nil {
			out[id] = copyLabels(s.labels)
		}
	}
	return out
}

func copyLabels(l labels.Labels) labels.Labels {
	out := make(labels.Labels, len(l))
	for k, v := range l {
		out[k] = v
	}
	return out
}

// candidate returns the next number, from the cursor on, that no claim known here holds and
// that was not freed within ReuseDelay, and moves the cursor past it.
func (a *Allocator) candidate() (identity.Identity, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if len(a.freed) > 4096 {
		for id, t := range a.freed {
			if now.Sub(t) >= a.opts.ReuseDelay {
				delete(a.freed, id)
			}
		}
	}
	for n := uint32(0); n <= uint32(lastEndpoint-identity.FirstEndpoint); n++ {
		id := a.cursor
		if a.cursor == lastEndpoint {
			a.cursor = identity.FirstEndpoint
		} else {
			a.cursor++
		}
		if _, taken := a.claims[id]; taken {
			continue
		}
		if t, ok := a.freed[id]; ok && now.Sub(t) < a.opts.ReuseDelay {
			continue
		}
		return id, nil
	}
	return 0, errors.New("every endpoint identity number is taken")
}

// cachedUsable returns the identity of the SecurityIdentity name if memory holds it valid,
// for key, and not marked unused (a marked one must be unmarked through the API first).
func (a *Allocator) cachedUsable(name, key string) (identity.Identity, bool, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.sets[name]
	if s == nil {
		return 0, false, false
	}
	return s.id, s.key == key && !s.marked && a.validLocked(s.id) == s, true
}

// Allocate returns the cluster-wide identity of label set l, creating it if the cluster has
// none. Agents racing to allocate one set all get the same number; two sets never get the
// same one. An identity the collector marked unused is unmarked first, so the collector
// cannot delete an identity Allocate has just handed out (the unmarking and the deletion
// are both conditional on the object's resourceVersion).
//
// The protocol (docs/cluster.md): the SecurityIdentity, named from the set, is created first
// with a candidate number; then the claim of that number, naming the SecurityIdentity by
// name and UID. If the number's claim belongs to another set, the SecurityIdentity moves to
// another number (an update conditional on its resourceVersion) and claims that. Once the
// claim is there, a read of the SecurityIdentity confirms it still holds that number.
func (a *Allocator) Allocate(ctx context.Context, l labels.Labels) (identity.Identity, error) {
	key := identity.LabelsKey(l)
	name := SetName(key)
	if id, ok, _ := a.cachedUsable(name, key); ok {
		return id, nil
	}
	sets := a.client.Resource(IdentityResource)
	var cur *setObj // the SecurityIdentity as last read or written in this call
	for round := 0; round < maxRounds; round++ {
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("allocating an identity for %s: %w", l, err)
		}
		if cur == nil {
			var err error
			if cur, err = a.getOrCreate(ctx, l, name, key); err != nil {
				return 0, fmt.Errorf("allocating an identity for %s: %w", l, err)
			}
			if cur == nil {
				continue // deleted between the failed create and the read
			}
		}
		if cur.marked {
			next, err := a.unmark(ctx, cur)
			if err != nil {
				return 0, fmt.Errorf("allocating an identity for %s: %w", l, err)
			}
			cur = next
			continue
		}
		if a.beforeClaim != nil {
			a.beforeClaim(cur)
		}
		ours, created, err := a.claim(ctx, cur)
		if err != nil {
			return 0, fmt.Errorf("allocating an identity for %s: %w", l, err)
		}
		if !ours {
			a.taken.Add(1)
			// Another set holds the number: move to another, if nobody changed the
			// object meanwhile (then read it again).
			next, err := a.renumber(ctx, cur)
			if err != nil {
				return 0, fmt.Errorf("allocating an identity for %s: %w", l, err)
			}
			cur = next
			continue
		}
		// The claim names this SecurityIdentity. Confirm it still holds the number: an
		// agent with a newer read may have moved it (its claim was taken, then freed
		// before this claim was made).
		u, err := sets.Get(ctx, name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("allocating an identity for %s: reading SecurityIdentity %s: %w", l, name, err)
		}
		var now *setObj
		if err == nil {
			if now, err = parseSet(u); err != nil {
				return 0, fmt.Errorf("allocating an identity for %s: %w", l, err)
			}
		}
		if now != nil && now.uid == cur.uid && now.id == cur.id {
			a.upsertSet(now)
			if !now.marked {
				return now.id, nil
			}
			cur = now
			continue
		}
		if created != nil {
			// The claim this call made points at a SecurityIdentity that no longer
			// holds the number: take it back so the number is free again.
			a.deleteClaim(ctx, created)
		}
		cur = now
	}
	return 0, fmt.Errorf("allocating an identity for %s: gave up after %d conflicting rounds", l, maxRounds)
}

// getOrCreate reads the SecurityIdentity name, creating it with a fresh number when it does
// not exist. It returns nil if the object vanished between a failed create and the read.
func (a *Allocator) getOrCreate(ctx context.Context, l labels.Labels, name, key string) (*setObj, error) {
	sets := a.client.Resource(IdentityResource)
	// Known in memory: read first. Memory may be behind a deletion, so a read that finds
	// nothing leads to a create.
	_, _, known := a.cachedUsable(name, key)
	for try := 0; try < 2; try++ {
		if !known || try > 0 {
			id, err := a.candidate()
			if err != nil {
				return nil, err
			}
			u, err := sets.Create(ctx, newSet(l, id), metav1.CreateOptions{})
			if err == nil {
				s, err := parseSet(u)
				if err != nil {
					return nil, err
				}
				a.upsertSet(s)
				return s, nil
			}
			if !apierrors.IsAlreadyExists(err) {
				return nil, fmt.Errorf("creating SecurityIdentity %s: %w", name, err)
			}
		}
		u, err := sets.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading SecurityIdentity %s: %w", name, err)
		}
		s, err := parseSet(u)
		if err != nil {
			// Fail closed: a malformed object in the place of this set's identity is
			// not overwritten or guessed around; the error names it.
			return nil, err
		}
		if s.key != key {
			return nil, fmt.Errorf("SecurityIdentity %s holds labels %s (a name collision)", name, s.labels)
		}
		a.upsertSet(s)
		return s, nil
	}
	return nil, nil
}

// unmark removes the unused mark from s, conditional on its resourceVersion. It returns the
// updated object, or nil (read again) if s changed or was deleted meanwhile.
func (a *Allocator) unmark(ctx context.Context, s *setObj) (*setObj, error) {
	u, err := a.client.Resource(IdentityResource).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading SecurityIdentity %s: %w", s.name, err)
	}
	if u.GetResourceVersion() != s.rv || string(u.GetUID()) != s.uid {
		return nil, nil
	}
	ann := u.GetAnnotations()
	delete(ann, UnusedSinceAnnotation)
	u.SetAnnotations(ann)
	return a.updateSet(ctx, u, "unmarking")
}

// updateSet writes u, which carries the resourceVersion it was read at, and returns what
// the server stored, or nil (read again) if the object changed or was deleted meanwhile.
func (a *Allocator) updateSet(ctx context.Context, u *unstructured.Unstructured, doing string) (*setObj, error) {
	stored, err := a.client.Resource(IdentityResource).Update(ctx, u, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s SecurityIdentity %s: %w", doing, u.GetName(), err)
	}
	next, err := parseSet(stored)
	if err != nil {
		return nil, err
	}
	a.upsertSet(next)
	return next, nil
}

// claim makes sure the claim of s's number names s. ours is false when the claim names
// another SecurityIdentity; created is the claim this call created, if it did.
func (a *Allocator) claim(ctx context.Context, s *setObj) (ours bool, created *claimObj, err error) {
	claims := a.client.Resource(ClaimResource)
	u, err := claims.Create(ctx, newClaim(s.id, s.name, types.UID(s.uid)), metav1.CreateOptions{})
	if err == nil {
		c, err := parseClaim(u)
		if err != nil {
			return false, nil, err
		}
		a.upsertClaim(c)
		return true, c, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return false, nil, fmt.Errorf("creating SecurityIdentityClaim %s: %w", ClaimName(s.id), err)
	}
	u, err = claims.Get(ctx, ClaimName(s.id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil, nil // freed meanwhile: renumbering is safe, and rare
	}
	if err != nil {
		return false, nil, fmt.Errorf("reading SecurityIdentityClaim %s: %w", ClaimName(s.id), err)
	}
	c, err := parseClaim(u)
	if err != nil {
		// A malformed claim still takes its number: the name is what makes it unique.
		a.opts.Logf("identities: number %d is taken by a malformed claim: %v", s.id, err)
		a.mu.Lock()
		a.freed[s.id] = time.Now().Add(100 * 365 * 24 * time.Hour) // skip it here for good
		a.mu.Unlock()
		return false, nil, nil
	}
	a.upsertClaim(c)
	return c.setName == s.name && c.setUID == s.uid, nil, nil
}

// renumber gives s a new candidate number, conditional on its resourceVersion. It returns
// the updated object, or nil (read again) if s changed or was deleted meanwhile.
func (a *Allocator) renumber(ctx context.Context, s *setObj) (*setObj, error) {
	id, err := a.candidate()
	if err != nil {
		return nil, err
	}
	u := newSet(s.labels, id)
	u.SetUID(types.UID(s.uid))
	u.SetResourceVersion(s.rv)
	if s.marked {
		u.SetAnnotations(map[string]string{UnusedSinceAnnotation: s.unusedSince.UTC().Format(time.RFC3339Nano)})
	}
	return a.updateSet(ctx, u, "renumbering")
}

// deleteClaim deletes claim c if it is still that incarnation. Failing is harmless: a
// claim of a SecurityIdentity that does not hold its number is ignored by every reader,
// and the collector deletes it once the SecurityIdentity is gone.
func (a *Allocator) deleteClaim(ctx context.Context, c *claimObj) {
	uid := types.UID(c.uid)
	err := a.client.Resource(ClaimResource).Delete(ctx, c.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		a.opts.Logf("identities: deleting SecurityIdentityClaim %s: %v", c.name, err)
	}
}
