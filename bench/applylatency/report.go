package applylatency

import (
	"fmt"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Table renders the report as markdown.
func Table(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apply to enforcement, %s, kernel %s, %d CPUs, %s documents, %d rounds, probes every %.1f ms, load average %.2f at start, %.2f at end\n\n",
		rep.Started.Format("2006-01-02 15:04 MST"), rep.Kernel, rep.CPUs, rep.Format, rep.Rounds, rep.IntervalMs, rep.LoadStart, rep.LoadEnd)
	b.WriteString("| build | rules | series | map entries | enforced p50 ms | p95 ms | API answer p50 ms | p95 ms | agent CPU p50 ms | revert p50 ms | invalid |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range rep.Sizes {
		for _, bd := range rep.Builds {
			for _, c := range []bool{false, true} {
				s := rep.Find(bd, n, c)
				if s == nil {
					continue
				}
				name := "A"
				if c {
					name = "A' (control)"
				}
				fmt.Fprintf(&b, "| %s | %d | %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %d/%d |\n", bd, n, name, s.Entries,
					s.EnfP50, s.EnfP95, s.APIP50, s.APIP95, s.CPUP50, s.Revert, s.Invalid, len(s.Samples))
			}
		}
	}
	b.WriteString("\n| build | rules | A/A: control / A, enforced p50 |")
	for _, bd := range rep.Builds[1:] {
		fmt.Fprintf(&b, " %s / %s |", bd, rep.Builds[0])
	}
	b.WriteString("\n|---|---:|---:|" + strings.Repeat("---:|", len(rep.Builds)-1) + "\n")
	for _, n := range rep.Sizes {
		for _, bd := range rep.Builds {
			a, c := rep.Find(bd, n, false), rep.Find(bd, n, true)
			if a == nil || c == nil {
				continue
			}
			fmt.Fprintf(&b, "| %s | %d | %.2f |", bd, n, c.EnfP50/a.EnfP50)
			for _, other := range rep.Builds[1:] {
				if bd != rep.Builds[0] {
					b.WriteString(" |")
					continue
				}
				if o := rep.Find(other, n, false); o != nil {
					fmt.Fprintf(&b, " %.2f |", o.EnfP50/a.EnfP50)
				}
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n| build | target | value | limit | |\n|---|---|---:|---:|---|\n")
	for _, c := range rep.Checks {
		verdict := "PASS"
		if !c.Pass {
			verdict = "MISS"
		}
		fmt.Fprintf(&b, "| %s | %s | %.1f | %.0f | %s |\n", c.Build, c.What, c.Value, c.Limit, verdict)
	}
	return b.String()
}

// Plot draws the enforced p50 of every build and series by rule count (log scales), with
// the target, to path (PNG).
func Plot(rep *Report, path string) error {
	p := plot.New()
	p.Title.Text = "apply to enforcement (p50)"
	p.X.Label.Text = "rules in the policy"
	p.Y.Label.Text = "ms"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	i := 0
	for _, bd := range rep.Builds {
		for _, c := range []bool{false, true} {
			var pts plotter.XYs
			for _, n := range rep.Sizes {
				if s := rep.Find(bd, n, c); s != nil && s.EnfP50 > 0 && !math.IsNaN(s.EnfP50) {
					pts = append(pts, plotter.XY{X: float64(n), Y: s.EnfP50})
				}
			}
			if len(pts) == 0 {
				continue
			}
			l, sc, err := plotter.NewLinePoints(pts)
			if err != nil {
				return fmt.Errorf("plotting: %w", err)
			}
			l.Color, sc.Color = plotutil.Color(i), plotutil.Color(i)
			sc.Shape = plotutil.Shape(i)
			if c {
				l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
			}
			label := bd
			if c {
				label += " (A/A control)"
			}
			p.Add(l, sc)
			p.Legend.Add(label, l, sc)
			i++
		}
	}
	tgt, err := plotter.NewScatter(plotter.XYs{{X: TargetRules, Y: TargetMs}})
	if err != nil {
		return fmt.Errorf("plotting: %w", err)
	}
	tgt.Shape = draw.PyramidGlyph{}
	tgt.Radius = vg.Points(5)
	p.Add(tgt)
	p.Legend.Add(fmt.Sprintf("target: %d ms at %d rules", TargetMs, TargetRules), tgt)
	p.Legend.Top, p.Legend.Left = true, true
	return benchkit.PlotPNG(p, 8*vg.Inch, 4.5*vg.Inch, path)
}
