package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// pods runs the pod scalability experiment: for each mode a cluster with the most pairs,
// then in each round, for each pair count and traffic, the first n pairs at once with the
// pairs' allow policy and (NoPolicy) without, in alternating order.
func (r *runner) pods(ctx context.Context, res *PodsResult) error {
	for _, mode := range r.cfg.Modes {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		lc := r.clusters[mode]
		if lc.c == nil {
			continue // not available: the mode's report says why
		}
		if err := r.podsMode(ctx, res, lc); err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("%s: %v", mode, err))
			fmt.Fprintf(r.log, "pods: %s: %v\n", mode, err)
		}
	}
	return nil
}

func (r *runner) podsMode(ctx context.Context, res *PodsResult, lc *liveCluster) (err error) {
	c, mode, clients, servers := lc.c, lc.name, lc.clients, lc.servers
	ds, err := r.startServers(servers, false, false)
	defer func() { err = errors.Join(err, stopAll(ds)) }()
	if err != nil {
		return err
	}
	file, err := writeFile(r.workDir, "pairs.yaml", pairsPolicy())
	if err != nil {
		return err
	}

	// The policy state is switched only when a measurement needs the other one.
	policy := false
	setPolicy := func(on bool) error {
		if on == policy {
			return nil
		}
		if on {
			if err := c.Apply(ctx, NodeB, file); err != nil {
				return err
			}
			// TCP and UDP to the iperf3 port from the clients' identity.
			if _, err := waitEntries(ctx, c, servers, func(n int) bool { return n >= 2 }); err != nil {
				return fmt.Errorf("waiting for the pairs' policy: %w", err)
			}
		} else {
			if err := c.Delete(ctx, NodeB, file); err != nil {
				return err
			}
			if _, err := waitEntries(ctx, c, servers, func(n int) bool { return n == 0 }); err != nil {
				return fmt.Errorf("waiting for the pairs' policy to go: %w", err)
			}
		}
		policy = on
		return nil
	}
	defer func() {
		if policy {
			err = errors.Join(err, c.Delete(context.WithoutCancel(ctx), NodeB, file))
		}
	}()

	// Enforcement checks: with the policy a closed port is dropped (only the iperf3 port
	// is admitted), without it refused.
	if err := setPolicy(true); err != nil {
		return err
	}
	if _, err := r.expectProbes(ctx, clients[0], servers[0], map[int]string{iperfPort: benchkit.ProbeConnected, closedPort: benchkit.ProbeTimeout}); err != nil {
		return fmt.Errorf("enforcement check with policy: %w", err)
	}
	if r.cfg.NoPolicy {
		if err := setPolicy(false); err != nil {
			return err
		}
		if _, err := r.expectProbes(ctx, clients[0], servers[0], map[int]string{closedPort: benchkit.ProbeRefused}); err != nil {
			return fmt.Errorf("enforcement check without policy: %w", err)
		}
	}

	variants := []bool{true}
	if r.cfg.NoPolicy {
		variants = []bool{true, false}
	}
	k := 0
	for round := range r.cfg.PodRepeats {
		for _, n := range r.cfg.Pairs {
			for _, t := range r.cfg.Traffic {
				order := slices.Clone(variants)
				if k%2 == 1 {
					// Start with the state the last measurement left.
					slices.Reverse(order)
				}
				k++
				for _, pol := range order {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					if err := setPolicy(pol); err != nil {
						return err
					}
					s, err := r.podSample(ctx, clients[:n], servers[:n], t)
					s.Mode, s.Policy, s.Round = mode, pol, round
					if err != nil {
						res.Errors = append(res.Errors, fmt.Sprintf("%s %s %d pairs policy=%v round %d: %v", mode, t.Name, n, pol, round+1, err))
						fmt.Fprintf(r.log, "pods %-6s %-9s %2d pairs policy=%-5v error: %v\n", mode, t.Name, n, pol, err)
						continue
					}
					res.Samples = append(res.Samples, s)
					loss := ""
					if t.UDP {
						loss = fmt.Sprintf("  loss %5.1f %%", s.LossPercent)
					}
					fmt.Fprintf(r.log, "pods %-6s %-9s %2d pairs policy=%-5v %7.3f Gbit/s%s\n", mode, t.Name, n, pol, s.Bps/1e9, loss)
				}
			}
		}
	}
	return nil
}

// podSample runs one iperf3 client per pair, all at once, and adds up the receivers'
// rates.
func (r *runner) podSample(ctx context.Context, clients, servers []*Pod, t Traffic) (PodSample, error) {
	s := PodSample{Traffic: t.Name, Pairs: len(clients), Fragments: t.Fragments(clients[0].MTU)}
	flows := make([]Flow, len(clients))
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	// How busy the CPUs were says whether the aggregate is CPU-bound (both near 100 %).
	cpu0, cpuErr := benchkit.ReadCPUTimes()
	t0 := time.Now()
	for i := range clients {
		wg.Go(func() {
			// The offered UDP load is shared: the pairs together offer UDPRate.
			argv := iperfArgs(r.cfg.Iperf3, servers[i], iperfPort, t, r.cfg.PodSeconds, r.cfg.UDPRate/float64(len(clients)))
			flows[i], errs[i] = runIperf(ctx, argv, clients[i], t.UDP, r.cfg.PodSeconds)
		})
	}
	wg.Wait()
	s.WallSeconds = time.Since(t0).Seconds()
	if cpu1, err := benchkit.ReadCPUTimes(); err == nil && cpuErr == nil {
		s.CPUBusy = benchkit.BusyPercent(cpu0, cpu1)
	}
	if err := errors.Join(errs...); err != nil {
		return s, err
	}
	var packets, lost int64
	for _, f := range flows {
		s.Bps += f.Bps
		s.PairBps = append(s.PairBps, f.Bps)
		s.Retransmits += f.Retransmits
		packets += f.Packets
		lost += f.LostPackets
	}
	if packets > 0 {
		s.LossPercent = 100 * float64(lost) / float64(packets)
	}
	if t.UDP && s.Bps <= 0 {
		return s, fmt.Errorf("no UDP datagram arrived (%d sent)", packets)
	}
	return s, nil
}

// summarizePods computes each combination's medians and its ratio to the first pair
// count (one pair) of the same round, mode, traffic and policy variant; the most pairs
// get a verdict against TargetPodRatio.
func summarizePods(res *PodsResult, pairs []int) {
	res.Summary = nil
	type key struct {
		mode, traffic string
		policy        bool
		pairs, round  int
	}
	byKey := map[key]PodSample{}
	var combos []PodSummary
	seen := map[key]bool{}
	for _, s := range res.Samples {
		byKey[key{s.Mode, s.Traffic, s.Policy, s.Pairs, s.Round}] = s
		k := key{s.Mode, s.Traffic, s.Policy, s.Pairs, 0}
		if !seen[k] {
			seen[k] = true
			combos = append(combos, PodSummary{Mode: s.Mode, Traffic: s.Traffic, Policy: s.Policy, Pairs: s.Pairs})
		}
	}
	maxPairs := slices.Max(pairs)
	for _, c := range combos {
		var bps, ratios, lo, hi, loss, busy []float64
		for _, s := range res.Samples {
			if s.Mode != c.Mode || s.Traffic != c.Traffic || s.Policy != c.Policy || s.Pairs != c.Pairs {
				continue
			}
			bps = append(bps, s.Bps)
			l, h := minMax(s.PairBps)
			lo, hi = append(lo, float64(l)), append(hi, float64(h))
			loss = append(loss, s.LossPercent)
			if len(s.CPUBusy) > 0 {
				busy = append(busy, mean(s.CPUBusy))
			}
			if one, ok := byKey[key{s.Mode, s.Traffic, s.Policy, pairs[0], s.Round}]; ok && one.Bps > 0 {
				ratios = append(ratios, s.Bps/one.Bps)
			}
		}
		c.Bps, c.Ratio, c.MinPairBps, c.MaxPairBps, c.LossPercent = median(bps), median(ratios), median(lo), median(hi), median(loss)
		c.CPUBusy = median(busy)
		if c.Pairs == maxPairs && c.Pairs != pairs[0] {
			c.Verdict = VerdictMiss
			if c.Ratio.Valid() && c.Ratio >= TargetPodRatio {
				c.Verdict = VerdictPass
			}
		}
		res.Summary = append(res.Summary, c)
	}
	// Modes in run order; then traffic in the configured order, policy first, pairs.
	rank := func(xs []string, x string) int { return slices.Index(xs, x) }
	var modes, traffic []string
	for _, s := range res.Samples {
		if !slices.Contains(modes, s.Mode) {
			modes = append(modes, s.Mode)
		}
		if !slices.Contains(traffic, s.Traffic) {
			traffic = append(traffic, s.Traffic)
		}
	}
	slices.SortStableFunc(res.Summary, func(a, b PodSummary) int {
		return cmp.Or(cmp.Compare(rank(modes, a.Mode), rank(modes, b.Mode)),
			cmp.Compare(rank(traffic, a.Traffic), rank(traffic, b.Traffic)),
			cmp.Compare(boolRank(a.Policy), boolRank(b.Policy)), cmp.Compare(a.Pairs, b.Pairs))
	})
}

func boolRank(b bool) int {
	if b {
		return 0
	}
	return 1
}

func mean(xs []float64) float64 {
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}
