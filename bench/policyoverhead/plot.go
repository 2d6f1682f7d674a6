package policyoverhead

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
}

type series struct {
	name string
	get  func(Summary) float64
}

// WritePlot draws the report as a PNG: throughput and transaction rate (higher is better)
// and latency percentiles (lower is better) of every case, as ratios to the baseline.
func WritePlot(res *Result, path string) error {
	names := make([]string, len(res.Cases))
	for i, c := range res.Cases {
		names[i] = fmt.Sprintf("%s\n%s", c.Name, c.Summary.Verdict)
	}
	var base Summary
	if len(res.Cases) > 0 {
		base = res.Cases[0].Summary
	}
	family := ""
	if res.Settings.IPv6 {
		family = "IPv6: "
	}
	top, err := barPlot(res, names,
		fmt.Sprintf("%sThroughput and request/response rate vs no agent (%.2f Gbit/s, %.0f transactions/s; target >= %.2f)",
			family, base.ThroughputBps/1e9, base.TPS, TargetThroughputRatio),
		"ratio to no-agent baseline (higher is better)",
		[]series{
			{"TCP throughput (iperf3)", func(s Summary) float64 { return s.ThroughputRatio }},
			{"transactions/s (1-byte TCP RR)", func(s Summary) float64 { return s.TPSRatio }},
		}, []float64{1, TargetThroughputRatio})
	if err != nil {
		return err
	}
	bottom, err := barPlot(res, names,
		fmt.Sprintf("Request/response latency vs no agent (p50 %.1f us, p90 %.1f us, p99 %.1f us); %d rounds, medians",
			base.P50Us, base.P90Us, base.P99Us, res.Settings.Repeats),
		"ratio to no-agent baseline (lower is better)",
		[]series{
			{"p50", func(s Summary) float64 { return s.P50Ratio }},
			{"p90", func(s Summary) float64 { return s.P90Ratio }},
			{"p99", func(s Summary) float64 { return s.P99Ratio }},
		}, []float64{1})
	if err != nil {
		return err
	}
	const w, h = 11 * vg.Inch, 9 * vg.Inch
	return benchkit.GridPNG([][]*plot.Plot{{top}, {bottom}}, benchkit.Tiles(2, 1, 0, vg.Points(16)), w, h, path)
}

func barPlot(res *Result, names []string, title, ylabel string, ss []series, lines []float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Y.Min = 0
	const barW = 18
	ymax := 1.4 // headroom above the 1.0 line for the legend
	for k, s := range ss {
		vals := make(plotter.Values, len(res.Cases))
		for i, c := range res.Cases {
			v := s.get(c.Summary)
			if math.IsNaN(v) || math.IsInf(v, 0) {
				v = 0 // no numbers: the verdict under the case name says INVALID
			}
			vals[i] = v
			ymax = math.Max(ymax, v*1.15)
		}
		b, err := plotter.NewBarChart(vals, vg.Points(barW))
		if err != nil {
			return nil, fmt.Errorf("bar chart %s: %w", s.name, err)
		}
		b.Color = palette[k%len(palette)]
		b.LineStyle.Width = 0
		b.Offset = vg.Points(barW * (float64(k) - float64(len(ss)-1)/2))
		p.Add(b)
		p.Legend.Add(s.name, b)
	}
	for _, y := range lines {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: y}, {X: float64(len(res.Cases)) - 0.5, Y: y}})
		if err != nil {
			return nil, fmt.Errorf("reference line: %w", err)
		}
		l.Color = color.Gray{Y: 0x60}
		if y != 1 {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			l.Color = color.RGBA{R: 0xc0, A: 0xff}
		}
		p.Add(l)
	}
	p.Y.Max = ymax
	p.Add(plotter.NewGrid())
	p.NominalX(names...)
	return p, nil
}
