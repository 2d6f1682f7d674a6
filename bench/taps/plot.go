package taps

import (
	"fmt"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// WritePlot draws every case's ratio to no tap (median, with the range over the pairs as
// error bars), the targets and the paper's ratios, to path (PNG).
func WritePlot(res *Result, path string) error {
	p := plot.New()
	p.Title.Text = "flow taps: with tap / no tap (latency: no tap / tap)"
	p.Y.Label.Text = "ratio"
	p.Y.Min, p.Y.Max = 0, 1.4 // room for the legend above the bars
	var vals plotter.Values
	var errs plotter.YErrors
	var names []string
	var targets, published plotter.XYs
	for i, c := range res.Cases {
		s := c.Summary
		v := 0.0
		lo, hi := 0.0, 0.0
		if s.Ratio.Valid() {
			v = float64(s.Ratio)
			lo, hi = v-float64(s.RatioMin), float64(s.RatioMax)-v
		}
		vals = append(vals, v)
		errs = append(errs, struct{ Low, High float64 }{lo, hi})
		names = append(names, c.Name)
		if c.Target > 0 {
			targets = append(targets, plotter.XY{X: float64(i), Y: c.Target})
		}
		if c.Published != nil {
			published = append(published, plotter.XY{X: float64(i), Y: c.Published.Ratio})
		}
		if v > p.Y.Max {
			p.Y.Max = v * 1.1
		}
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(28))
	if err != nil {
		return fmt.Errorf("plotting: %w", err)
	}
	bars.Color = plotutil.Color(0)
	p.Add(bars)
	p.Legend.Add("median ratio (this run)", bars)
	pts := make(plotter.XYs, len(vals))
	for i, v := range vals {
		pts[i] = plotter.XY{X: float64(i), Y: v}
	}
	eb, err := plotter.NewYErrorBars(struct {
		plotter.XYs
		plotter.YErrors
	}{pts, errs})
	if err != nil {
		return fmt.Errorf("plotting: %w", err)
	}
	p.Add(eb)
	for _, m := range []struct {
		xys   plotter.XYs
		label string
		shape draw.GlyphDrawer
		color int
	}{{targets, "target", draw.PyramidGlyph{}, 1}, {published, "FlowTap (published)", draw.CircleGlyph{}, 2}} {
		if len(m.xys) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(m.xys)
		if err != nil {
			return fmt.Errorf("plotting: %w", err)
		}
		sc.Shape, sc.Radius, sc.Color = m.shape, vg.Points(5), plotutil.Color(m.color)
		p.Add(sc)
		p.Legend.Add(m.label, sc)
	}
	p.NominalX(names...)
	p.Legend.Top, p.Legend.Left = true, false
	return benchkit.PlotPNG(p, vg.Length(max(10, 1.4*float64(len(names))))*vg.Inch, 4.5*vg.Inch, path)
}
