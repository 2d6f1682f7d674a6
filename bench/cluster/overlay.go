package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// overlayPath is a case's live state.
type overlayPath struct {
	c       *OverlayCase
	client  *Pod
	server  *Pod
	servers []*benchkit.Daemon
}

// overlay runs the overlay cost experiment: one pair on each path, all built first and
// measured in turns, every round in a rotated order, so that each round's ratios compare
// samples taken seconds apart.
func (r *runner) overlay(ctx context.Context, res *OverlayResult) (err error) {
	names := []string{CaseFabric, CaseNative, CaseNativeControl}
	for _, m := range r.cfg.Modes {
		if m != CaseNative {
			names = append(names, m)
		}
	}
	var paths []*overlayPath
	var fabric *bareFabric
	defer func() {
		for _, p := range paths {
			err = errors.Join(err, stopAll(p.servers))
		}
		if fabric != nil {
			err = errors.Join(err, fabric.Close())
		}
	}()
	for _, name := range names {
		oc := OverlayCase{Name: name, Mode: name}
		switch name {
		case CaseNativeControl:
			oc.Mode = CaseNative
		case CaseFabric:
			oc.Mode = ""
		}
		res.Cases = append(res.Cases, oc)
	}
	for i := range res.Cases {
		oc := &res.Cases[i]
		p := &overlayPath{c: oc}
		if oc.Name == CaseFabric {
			if fabric, err = newBareFabric(r.prefix + "f-"); err != nil {
				return err
			}
			p.client, p.server = fabric.pods[0], fabric.pods[1]
		} else {
			lc := r.clusters[oc.Name]
			if lc.c == nil {
				oc.Reason = lc.err.Error()
				continue
			}
			p.client, p.server = lc.clients[0], lc.servers[0]
		}
		oc.Available, oc.PodMTU = true, p.client.MTU
		paths = append(paths, p)
		if p.servers, err = r.startServers([]*Pod{p.server}, true, true); err != nil {
			return fmt.Errorf("%s: %w", oc.Name, err)
		}
	}
	for round := range r.cfg.Repeats {
		for k := range paths {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			p := paths[(k+round)%len(paths)]
			s, err := r.measurePath(ctx, p.client, p.server)
			s.Round, s.Pair = round, round
			if err != nil {
				p.c.Errors = append(p.c.Errors, fmt.Sprintf("round %d: %v", round+1, err))
				fmt.Fprintf(r.log, "overlay round %d/%d %-14s error: %v\n", round+1, r.cfg.Repeats, p.c.Name, err)
				continue
			}
			p.c.Samples = append(p.c.Samples, s)
			fmt.Fprintf(r.log, "overlay round %d/%d %-14s %7.3f Gbit/s  %7.0f tps  p50 %6.1f us\n",
				round+1, r.cfg.Repeats, p.c.Name, s.Flow.Bps/1e9, s.RR.TPS, s.RR.P50Us)
		}
	}
	return nil
}

// summarizeOverlay computes medians, and each case's per-round ratios to native routing
// and to the bare fabric.
func summarizeOverlay(res *OverlayResult) {
	byRound := func(name string) map[int]PathSample {
		m := map[int]PathSample{}
		for _, c := range res.Cases {
			if c.Name == name {
				for _, s := range c.Samples {
					m[s.Round] = s
				}
			}
		}
		return m
	}
	native, fabric := byRound(CaseNative), byRound(CaseFabric)
	for i := range res.Cases {
		c := &res.Cases[i]
		var bps, tps, p50, p99, nb, nt, np, fb, ft, fp []float64
		for _, s := range c.Samples {
			bps, tps, p50, p99 = append(bps, s.Flow.Bps), append(tps, s.RR.TPS), append(p50, s.RR.P50Us), append(p99, s.RR.P99Us)
			if n, ok := native[s.Round]; ok {
				nb, nt, np = append(nb, ratio(s.Flow.Bps, n.Flow.Bps)), append(nt, ratio(s.RR.TPS, n.RR.TPS)), append(np, ratio(s.RR.P50Us, n.RR.P50Us))
			}
			if f, ok := fabric[s.Round]; ok {
				fb, ft, fp = append(fb, ratio(s.Flow.Bps, f.Flow.Bps)), append(ft, ratio(s.RR.TPS, f.RR.TPS)), append(fp, ratio(s.RR.P50Us, f.RR.P50Us))
			}
		}
		c.Summary = OverlaySummary{
			Bps: median(bps), TPS: median(tps), P50Us: median(p50), P99Us: median(p99),
			VsNativeBps: median(nb), VsNativeTPS: median(nt), VsNativeP50: median(np),
			VsFabricBps: median(fb), VsFabricTPS: median(ft), VsFabricP50: median(fp),
		}
	}
}

func ratio(x, base float64) float64 { return benchkit.Ratio(x, base) }
