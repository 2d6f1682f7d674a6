package coldcost

import (
	"fmt"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plot writes a bar chart of each build's median ns per run, by program, to path (PNG).
func Plot(rep *Report, path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Rampart programs per packet at a ping every %v (cold)", rep.Interval)
	p.Y.Label.Text = "ns per run (median over rounds)"
	names := make([]string, len(rep.Builds))
	for i, b := range rep.Builds {
		names[i] = b.Name
	}
	progs := []string{ProgFromEp, ProgToEp, ProgEmpty}
	w := vg.Points(18)
	top := 0.0
	for i, prog := range progs {
		vals := make(plotter.Values, len(names))
		for j, n := range names {
			vals[j] = rep.Median[n][prog]
			top = max(top, vals[j])
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return fmt.Errorf("plotting %s: %w", prog, err)
		}
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(i-1)
		p.Add(bars)
		p.Legend.Add(prog, bars)
	}
	p.Legend.Top = true
	p.NominalX(names...)
	// Room on both sides for the bars around each build, and above them for the legend.
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
	p.Y.Min, p.Y.Max = 0, top*1.35
	if err := p.Save(7*vg.Inch, 4*vg.Inch, path); err != nil {
		return fmt.Errorf("writing plot %s: %w", path, err)
	}
	return nil
}
