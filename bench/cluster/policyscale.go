package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// policies runs the policy scalability experiment on one cluster and one pair: each
// case (the control, then policies-N) is measured in pairs with the no-policy baseline,
// the order of the two alternating; every round rotates the order of the cases.
func (r *runner) policies(ctx context.Context, res *PoliciesResult) (err error) {
	res.Cases = append(res.Cases, PolicyCase{Name: CaseNoPolicy}, PolicyCase{Name: CaseControl})
	files := map[string]string{}
	for _, n := range r.cfg.PolicyCounts {
		name := fmt.Sprintf("policies-%d", n)
		res.Cases = append(res.Cases, PolicyCase{Name: name, Policies: n})
		m, err := policiesManifest(n)
		if err != nil {
			return err
		}
		if files[name], err = writeFile(r.workDir, name+".yaml", m); err != nil {
			return err
		}
	}
	lc := r.clusters[r.cfg.PolicyTunnel]
	if lc.c == nil {
		return fmt.Errorf("tunnel %s: %w", r.cfg.PolicyTunnel, lc.err)
	}
	c, client, server := lc.c, lc.policyClient, lc.policyServer
	ds, err := r.startServers([]*Pod{server}, true, true)
	defer func() { err = errors.Join(err, stopAll(ds)) }()
	if err != nil {
		return err
	}
	if n, err := c.PolicyEntries(server); err != nil {
		return err
	} else if n != 0 {
		return fmt.Errorf("the server has %d policy entries before any policy was applied", n)
	}

	// baseline measures the no-policy state, after checking it: the closed port refuses.
	baseline := func() (PathSample, error) {
		p, err := r.expectProbes(ctx, client, server, map[int]string{closedPort: benchkit.ProbeRefused})
		if err != nil {
			return PathSample{}, fmt.Errorf("no-policy check: %w", err)
		}
		s, err := r.measurePath(ctx, client, server)
		s.Probes = p
		return s, err
	}
	// withPolicies applies the case's policies, checks them, measures and deletes them.
	withPolicies := func(pc *PolicyCase) (s PathSample, err error) {
		file := files[pc.Name]
		t0 := time.Now()
		if err := c.Apply(ctx, NodeB, file); err != nil {
			return s, err
		}
		defer func() {
			dctx := context.WithoutCancel(ctx)
			if derr := c.Delete(dctx, NodeB, file); derr != nil {
				err = errors.Join(err, derr)
			} else if _, derr := waitEntries(dctx, c, []*Pod{server}, func(n int) bool { return n == 0 }); derr != nil {
				err = errors.Join(err, fmt.Errorf("waiting for the policies to go: %w", derr))
			}
		}()
		s.ApplySeconds = time.Since(t0).Seconds()
		// n-1 filler ports and the last policy's two.
		if s.MapEntries, err = waitEntries(ctx, c, []*Pod{server}, func(n int) bool { return n >= pc.Policies+1 }); err != nil {
			return s, fmt.Errorf("waiting for %d policy entries: %w", pc.Policies+1, err)
		}
		s.EnforcedSeconds = time.Since(t0).Seconds()
		// The last policy admits the request/response port; the closed port is dropped.
		p, err := r.expectProbes(ctx, client, server, map[int]string{rrPort: benchkit.ProbeConnected, closedPort: benchkit.ProbeTimeout})
		if err != nil {
			return s, fmt.Errorf("enforcement check: %w", err)
		}
		m, err := r.measurePath(ctx, client, server)
		m.ApplySeconds, m.EnforcedSeconds, m.MapEntries, m.Probes = s.ApplySeconds, s.EnforcedSeconds, s.MapEntries, p
		return m, err
	}

	cases := len(res.Cases) - 1 // all but the baseline
	pair := 0
	for round := range r.cfg.Repeats {
		for k := range cases {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			pc := &res.Cases[1+(k+round)%cases]
			baseFirst := pair%2 == 0
			var cs, bs PathSample
			var cerr, berr error
			if baseFirst {
				bs, berr = baseline()
			}
			if berr == nil {
				if pc.Name == CaseControl {
					cs, cerr = baseline()
				} else {
					cs, cerr = withPolicies(pc)
				}
			}
			if !baseFirst && cerr == nil {
				bs, berr = baseline()
			}
			if err := errors.Join(berr, cerr); err != nil {
				pc.Errors = append(pc.Errors, fmt.Sprintf("round %d: %v", round+1, err))
				fmt.Fprintf(r.log, "policies round %d/%d %-14s error: %v\n", round+1, r.cfg.Repeats, pc.Name, err)
				pair++
				continue
			}
			cs.Round, cs.Pair, bs.Round, bs.Pair = round, pair, round, pair
			pair++
			pc.Samples = append(pc.Samples, cs)
			res.Cases[0].Samples = append(res.Cases[0].Samples, bs)
			note := ""
			if cs.MapEntries > 0 {
				note = fmt.Sprintf("  enforced in %.3f s (%d entries)", cs.EnforcedSeconds, cs.MapEntries)
			}
			fmt.Fprintf(r.log, "policies round %d/%d %-14s %7.3f vs %7.3f Gbit/s (%.3f)  %6.0f vs %6.0f tps%s\n",
				round+1, r.cfg.Repeats, pc.Name, cs.Flow.Bps/1e9, bs.Flow.Bps/1e9, cs.Flow.Bps/bs.Flow.Bps,
				cs.RR.TPS, bs.RR.TPS, note)
		}
	}
	return nil
}

// summarizePolicies computes each case's medians and its ratios to the baseline sample
// of the same pair.
func summarizePolicies(res *PoliciesResult) {
	if len(res.Cases) == 0 {
		return
	}
	base := map[int]PathSample{}
	for _, s := range res.Cases[0].Samples {
		base[s.Pair] = s
	}
	for i := range res.Cases {
		c := &res.Cases[i]
		var bps, tps, p50, p99, rb, rt, rp, enf []float64
		entries := 0
		for _, s := range c.Samples {
			bps, tps, p50, p99 = append(bps, s.Flow.Bps), append(tps, s.RR.TPS), append(p50, s.RR.P50Us), append(p99, s.RR.P99Us)
			entries = max(entries, s.MapEntries)
			if s.EnforcedSeconds > 0 {
				enf = append(enf, s.EnforcedSeconds)
			}
			if b, ok := base[s.Pair]; ok {
				rb, rt, rp = append(rb, ratio(s.Flow.Bps, b.Flow.Bps)), append(rt, ratio(s.RR.TPS, b.RR.TPS)), append(rp, ratio(s.RR.P50Us, b.RR.P50Us))
			}
		}
		sum := PolicySummary{Bps: median(bps), TPS: median(tps), P50Us: median(p50), P99Us: median(p99),
			Ratio: median(rb), TPSRatio: median(rt), P50Ratio: median(rp), MapEntries: entries, EnforcedSecs: median(enf)}
		sum.RatioMin, sum.RatioMax = minMax(rb)
		switch {
		case i == 0:
			sum.Verdict = VerdictBaseline
		case c.Name == CaseControl:
			sum.Verdict = VerdictControl
		case !sum.Ratio.Valid():
			sum.Verdict = VerdictInvalid
		case sum.Ratio >= TargetPolicyRatio:
			sum.Verdict = VerdictPass
		default:
			sum.Verdict = VerdictMiss
		}
		c.Summary = sum
	}
}
