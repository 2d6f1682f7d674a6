package identities

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// CollectorOptions configure RunCollector.
type CollectorOptions struct {
	// Holder names this agent in the Lease (the node name). Required.
	Holder string
	// InUse returns the label-set keys (identity.LabelsKey) of every pod in the cluster,
	// and ok=false while the caller's caches have not synced: then nothing is collected
	// or marked. Required.
	InUse func() (keys map[string]bool, ok bool)
	// Grace is how long an identity stays unused before it is deleted. Zero: 5 minutes.
	Grace time.Duration
	// Interval is the time between collection passes. Zero: Grace/4.
	Interval time.Duration
	// Namespace and LeaseName name the coordination.k8s.io Lease that elects the one
	// collector. Zero: kube-system and rampart-identity-collector.
	Namespace, LeaseName string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's leader election
	// timings. Zero: 15 s, 10 s and 2 s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// OnLeading, if set, is called with true when this agent starts collecting and with
	// false when it stops (lost the Lease, or ctx ended).
	OnLeading func(leading bool)
	// Logf reports what was collected and what failed. Nil: the standard logger.
	Logf func(format string, args ...any)
}

// RunCollector collects unused identities until ctx ends, while this agent holds the
// Lease; every agent may run it, and one at a time collects. A pass marks each
// SecurityIdentity whose label set no pod uses (UnusedSinceAnnotation, the time it was
// first found unused), unmarks those in use again, and deletes those marked for longer than
// Grace (conditional on the resourceVersion it read, so an Allocate that unmarked one
// meanwhile wins), then their claims. Claims whose SecurityIdentity is gone (an agent
// stopped between two writes) are deleted too. It returns nil when ctx ends.
func RunCollector(ctx context.Context, cfg *rest.Config, opts CollectorOptions) error {
	if opts.Holder == "" || opts.InUse == nil {
		return errors.New("identity collector: Holder and InUse are required")
	}
	if opts.Grace <= 0 {
		opts.Grace = 5 * time.Minute
	}
	if opts.Interval <= 0 {
		opts.Interval = opts.Grace / 4
	}
	if opts.Namespace == "" {
		opts.Namespace = "kube-system"
	}
	if opts.LeaseName == "" {
		opts.LeaseName = "rampart-identity-collector"
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = 15 * time.Second
	}
	if opts.RenewDeadline <= 0 {
		opts.RenewDeadline = 10 * time.Second
	}
	if opts.RetryPeriod <= 0 {
		opts.RetryPeriod = 2 * time.Second
	}
	if opts.Logf == nil {
		opts.Logf = log.Printf
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 100, 200
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("identity collector client: %w", err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("identity collector client: %w", err)
	}
	col := &collector{client: dc, opts: opts}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: opts.Namespace, Name: opts.LeaseName},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: opts.Holder},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   opts.LeaseDuration,
			RenewDeadline:   opts.RenewDeadline,
			RetryPeriod:     opts.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            opts.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					if opts.OnLeading != nil {
						opts.OnLeading(true)
					}
					col.run(lctx)
					// Reported when collecting stops, not by OnStoppedLeading, which
					// client-go also calls on agents that never led.
					if opts.OnLeading != nil {
						opts.OnLeading(false)
					}
				},
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			return fmt.Errorf("identity collector: %w", err)
		}
		// Run returns when leadership is lost or ctx ends; then stand again.
		le.Run(ctx)
	}
	return nil
}

type collector struct {
	client dynamic.Interface
	opts   CollectorOptions
	// logged holds the objects logged as malformed, kind/name -> resourceVersion, so
	// that each version is logged once rather than every pass.
	logged map[string]string
}

// ignoring logs a malformed object once per version.
func (c *collector) ignoring(kind, name, rv string, err error) {
	if c.logged == nil {
		c.logged = map[string]string{}
	}
	if c.logged[kind+"/"+name] == rv {
		return
	}
	c.logged[kind+"/"+name] = rv
	c.opts.Logf("identities: collector ignoring %v", err)
}

// run makes a pass every Interval until ctx (the leadership) ends.
func (c *collector) run(ctx context.Context) {
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	for {
		if err := c.pass(ctx); err != nil && ctx.Err() == nil {
			c.opts.Logf("identities: collecting: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pass is one collection pass; see RunCollector.
func (c *collector) pass(ctx context.Context) error {
	inUse, ok := c.opts.InUse()
	if !ok {
		return nil // the caller does not know yet what is in use: judge nothing
	}
	sets := c.client.Resource(IdentityResource)
	claims := c.client.Resource(ClaimResource)
	// Sets first, then claims: a SecurityIdentity is created before its claim, so every
	// claim listed names a SecurityIdentity that is either listed or confirmed by a read.
	setList, err := sets.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing SecurityIdentities: %w", err)
	}
	claimList, err := claims.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing SecurityIdentityClaims: %w", err)
	}
	now := time.Now()
	live := map[string]string{} // SecurityIdentity name -> UID, after this pass's deletions
	var errs []error
	for i := range setList.Items {
		u := &setList.Items[i]
		s, err := parseSet(u)
		if err != nil {
			// Not ours to judge: left alone (and never used by an allocator).
			c.ignoring("SecurityIdentity", u.GetName(), u.GetResourceVersion(), err)
			live[u.GetName()] = string(u.GetUID())
			continue
		}
		live[s.name] = s.uid
		used := inUse[s.key]
		switch {
		case used && s.marked:
			ann := u.GetAnnotations()
			delete(ann, UnusedSinceAnnotation)
			u.SetAnnotations(ann)
			if _, err := sets.Update(ctx, u, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("unmarking SecurityIdentity %s: %w", s.name, err))
			}
		case used:
		case !s.marked || s.unusedSince.IsZero():
			ann := u.GetAnnotations()
			if ann == nil {
				ann = map[string]string{}
			}
			// Nanoseconds: a mark rounded down to the second would shorten the grace.
			ann[UnusedSinceAnnotation] = now.UTC().Format(time.RFC3339Nano)
			u.SetAnnotations(ann)
			if _, err := sets.Update(ctx, u, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("marking SecurityIdentity %s unused: %w", s.name, err))
			}
		case now.Sub(s.unusedSince) >= c.opts.Grace:
			deleted, err := c.deleteSet(ctx, s)
			if err != nil {
				errs = append(errs, err)
			}
			if deleted {
				delete(live, s.name)
				c.opts.Logf("identities: deleted identity %d (%s), unused since %s", s.id, s.labels, s.unusedSince.Format(time.RFC3339))
			}
		}
	}
	for i := range claimList.Items {
		cl, err := parseClaim(&claimList.Items[i])
		if err != nil {
			c.ignoring("SecurityIdentityClaim", claimList.Items[i].GetName(), claimList.Items[i].GetResourceVersion(), err)
			continue
		}
		if uid, ok := live[cl.setName]; ok && uid == cl.setUID {
			continue
		}
		// The listed SecurityIdentity is gone or another incarnation; it may also have
		// been created after the list. Read it: a UID that is gone never comes back, so
		// once the read says so, the claim can go.
		u, err := sets.Get(ctx, cl.setName, metav1.GetOptions{})
		if err == nil && string(u.GetUID()) == cl.setUID {
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("reading SecurityIdentity %s: %w", cl.setName, err))
			continue
		}
		uid := types.UID(cl.uid)
		err = claims.Delete(ctx, cl.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("deleting SecurityIdentityClaim %s: %w", cl.name, err))
		}
	}
	return errors.Join(errs...)
}

// deleteSet deletes s if it is still the version read (still marked as read). If an
// Allocate unmarked it since, the deletion fails (deleted false, no error) and the identity
// stays.
func (c *collector) deleteSet(ctx context.Context, s *setObj) (deleted bool, err error) {
	rv := s.rv
	err = c.client.Resource(IdentityResource).Delete(ctx, s.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("deleting SecurityIdentity %s: %w", s.name, err)
	}
}
