package services

import (
	"fmt"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Table is the report as markdown: per count, each case's medians and ratios to direct,
// then the programming times and memory.
func Table(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Started %s, %d rounds, kernel %s, %d CPUs, load %.2f -> %.2f. Throughput: %s, %d workers, %.1f s samples; connect: %d connects per sample.\n\n",
		rep.Started.Format("2006-01-02T15:04:05Z"), rep.Rounds, rep.Kernel, rep.CPUs, rep.LoadStart, rep.LoadEnd,
		rep.Throughput, rep.Workers, rep.DurationS, rep.Connects)
	b.WriteString("| Services | case | connect p50 us | p50 ratio (min-max) | connect p99 us | p99 ratio | req/s | req/s ratio (min-max) |\n")
	b.WriteString("|---:|---|---:|---|---:|---:|---:|---|\n")
	for _, st := range rep.Stages {
		for _, c := range st.Cases {
			fmt.Fprintf(&b, "| %d | %s | %.1f | %.3f (%.3f-%.3f) | %.1f | %.3f | %.0f | %.3f (%.3f-%.3f) |\n",
				st.Services, label(c.Name), median(c.Samples, func(s Sample) float64 { return s.ConnectP50us }),
				c.ConnectP50Ratio.Median, c.ConnectP50Ratio.Min, c.ConnectP50Ratio.Max,
				median(c.Samples, func(s Sample) float64 { return s.ConnectP99us }), c.ConnectP99Ratio.Median,
				median(c.Samples, func(s Sample) float64 { return s.RPS }),
				c.RPSRatio.Median, c.RPSRatio.Min, c.RPSRatio.Max)
		}
	}
	b.WriteString("\n| Services | implementation | programmed in s (start to last Service answering) | of which start-up s (rampartd: until its API answers) | process RSS MB | Service maps MB |\n")
	b.WriteString("|---:|---|---:|---:|---:|---:|\n")
	for _, st := range rep.Stages {
		for _, p := range st.Programming {
			maps, up := "-", "-"
			if p.ServingSeconds > 0 {
				up = fmt.Sprintf("%.3f", p.ServingSeconds)
			}
			if p.MapBytes > 0 {
				maps = fmt.Sprintf("%.1f", float64(p.MapBytes)/1e6)
			}
			fmt.Fprintf(&b, "| %d | %s | %.3f | %s | %.1f | %s |\n", st.Services, p.Name, p.Seconds, up, float64(p.RSSBytes)/1e6, maps)
		}
	}
	return b.String()
}

func label(name string) string {
	switch name {
	case Direct:
		return "direct (baseline)"
	case Control:
		return "direct again (A/A control)"
	}
	return name
}

func median(xs []Sample, f func(Sample) float64) float64 {
	vs := make([]float64, 0, len(xs))
	for _, x := range xs {
		vs = append(vs, f(x))
	}
	return benchkit.Median(vs)
}

// Plot draws, per count, each case's connect p50 and req/s ratios to direct as bars
// to path (PNG); the table has the rounds' ranges.
func Plot(rep *Report, path string) error {
	p := plot.New()
	p.Title.Text = "Service translation: ratio to direct-to-backend (median over rounds)"
	p.Y.Label.Text = "ratio to direct"
	var names []string
	type bar struct {
		metric string
		f      func(Case) Ratio
	}
	bars := []bar{{"connect p50", func(c Case) Ratio { return c.ConnectP50Ratio }}, {"req/s", func(c Case) Ratio { return c.RPSRatio }}}
	w := vg.Points(14)
	for _, st := range rep.Stages {
		for _, c := range st.Cases[1:] { // direct is 1 by definition
			names = append(names, fmt.Sprintf("%s\n%d svc", c.Name, st.Services))
		}
	}
	for bi, bd := range bars {
		var vals plotter.Values
		for _, st := range rep.Stages {
			for _, c := range st.Cases[1:] {
				vals = append(vals, bd.f(c).Median)
			}
		}
		bc, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return fmt.Errorf("plotting: %w", err)
		}
		bc.Color = plotutil.Color(bi)
		bc.Offset = vg.Length(float64(bi)-0.5) * w
		p.Add(bc)
		p.Legend.Add(bd.metric, bc)
	}
	one, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(names)) - 0.5, Y: 1}})
	if err != nil {
		return fmt.Errorf("plotting: %w", err)
	}
	one.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	p.Add(one)
	p.NominalX(names...)
	// Room above the tallest bar for the legend.
	p.Y.Min, p.Y.Max = 0, p.Y.Max*1.2
	p.Legend.Top, p.Legend.Left = true, true
	return benchkit.PlotPNG(p, 9*vg.Inch, 4.5*vg.Inch, path)
}
