package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// liveCluster is a cluster the experiments share, with its pods.
type liveCluster struct {
	name             string // the mode, or CaseNativeControl
	c                Cluster
	clients, servers []*Pod // the pairs: client-NN on node A, server-NN on node B
	// The policy experiment's pair, with labels of its own so that its thousands of
	// policies select its server only.
	policyClient, policyServer *Pod
	err                        error // why there is no cluster
}

// Labels of the policy experiment's pair.
const (
	policyClientApp = "bench-policy-client"
	policyServerApp = "bench-policy-server"
)

// setUp makes every cluster the experiments need, once: one per tunnel mode (for the pod
// scalability and overlay experiments, and the policy experiment's mode), and a second
// native one for the overlay's A/A control. Starting two agents and their pods takes
// seconds; sharing the clusters keeps the run short, and the overlay's one pair is the
// pod experiment's first. A mode the agent refuses is recorded, not an error.
func (r *runner) setUp(ctx context.Context) error {
	exp := func(e string) bool { return slices.Contains(r.cfg.Experiments, e) }
	names := r.cfg.clusterNames()
	pairs := 1
	if exp(ExpPods) {
		pairs = slices.Max(r.cfg.Pairs)
	}
	for i, name := range names {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		mode := name
		if name == CaseNativeControl {
			mode = CaseNative
		}
		lc := &liveCluster{name: name}
		r.clusters[name] = lc
		fmt.Fprintf(r.log, "starting a two-node cluster, tunnel %s (%s)\n", mode, name)
		c, err := r.cfg.NewCluster(ctx, mode, fmt.Sprintf("%s%d", r.prefix, i), &r.daemons)
		if err != nil {
			lc.err = err
			if errors.Is(err, ErrModeUnavailable) {
				r.modeInfo(mode, false, err.Error(), 0)
				fmt.Fprintf(r.log, "%s not available: %v\n", mode, err)
				continue
			}
			return fmt.Errorf("%s cluster: %w", name, err)
		}
		lc.c = c
		n := pairs
		if name == CaseNativeControl {
			n = 1
		}
		specs := pairSpecs(n)
		policyPair := exp(ExpPolicies) && name == r.cfg.PolicyTunnel
		if policyPair {
			specs = append(specs,
				PodSpec{Node: NodeA, Namespace: benchNamespace, Name: "policy-client", Labels: []string{"app=" + policyClientApp}},
				PodSpec{Node: NodeB, Namespace: benchNamespace, Name: "policy-server", Labels: []string{"app=" + policyServerApp}})
		}
		pods, err := c.AddPods(ctx, specs)
		if err != nil {
			lc.err = err
			return fmt.Errorf("%s cluster: %w", name, err)
		}
		lc.clients, lc.servers = pods[:n], pods[n:2*n]
		if policyPair {
			lc.policyClient, lc.policyServer = pods[2*n], pods[2*n+1]
		}
		r.modeInfo(mode, true, "", lc.clients[0].MTU)
	}
	return nil
}

// clusterNames are the clusters the run needs, live at once: a mode, or CaseNativeControl.
func (c Config) clusterNames() []string {
	exp := func(e string) bool { return slices.Contains(c.Experiments, e) }
	var names []string
	add := func(n string) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if exp(ExpPods) || exp(ExpOverlay) {
		for _, m := range c.Modes {
			add(m)
		}
	}
	if exp(ExpOverlay) {
		add(CaseNative)
		add(CaseNativeControl)
	}
	if exp(ExpPolicies) {
		add(c.PolicyTunnel)
	}
	return names
}

// tearDown closes every cluster.
func (r *runner) tearDown() error {
	var errs []error
	for _, lc := range r.clusters {
		if lc.c != nil {
			errs = append(errs, lc.c.Close())
		}
	}
	return errors.Join(errs...)
}
