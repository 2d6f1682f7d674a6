package l7

import (
	"fmt"
	"image/color"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}

// plotPercentiles are where the latency curves are drawn (each only up to what its
// sample count resolves).
var plotPercentiles = []float64{1, 10, 25, 50, 75, 90, 95, 97, 99, 99.5, 99.7, 99.9, 99.95, 99.97, 99.99}

// nines maps a percentile to the x axis of the latency plot, which spreads the tail:
// 90 -> 1, 99 -> 2, 99.9 -> 3.
func nines(p float64) float64 { return -math.Log10(1 - p/100) }

// WritePlot draws the report as a PNG: latency against percentile at the fixed rate for
// every measured configuration (as in the paper's figure 2), and the highest sustained
// and closed-loop rates with the L7 target.
func WritePlot(res *Result, path string) error {
	top, err := latencyPlot(res)
	if err != nil {
		return err
	}
	bottom, err := ratePlot(res)
	if err != nil {
		return err
	}
	const w, h = 11 * vg.Inch, 10 * vg.Inch
	return benchkit.GridPNG([][]*plot.Plot{{top}, {bottom}}, benchkit.Tiles(2, 1, 0, vg.Points(18)), w, h, path)
}

func latencyPlot(res *Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Latency at a fixed %.0f requests/s (%d connections; median over %d rounds)",
		res.Settings.RateQPS, res.Settings.Connections, res.Settings.Repeats)
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = "latency (ms, log scale)"
	// Bottom right: the curves rise to the right, so that corner stays empty.
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.XOffs = -vg.Points(8)
	p.Legend.YOffs = vg.Points(8)
	p.Y.Scale = plot.LogScale{}
	var xticks []plot.Tick
	for _, t := range []float64{0, 90, 99, 99.9, 99.99} {
		xticks = append(xticks, plot.Tick{Value: nines(t), Label: strconv.FormatFloat(t, 'f', -1, 64)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(xticks)
	p.X.Min = 0
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, c := range res.Cases {
		if c.Summary.Verdict != VerdictMeasured {
			continue
		}
		var pts plotter.XYs
		for _, q := range plotPercentiles {
			if float64(c.Summary.Requests)/float64(len(c.Samples))*(1-q/100) < 1 {
				break // fewer than one request of a round beyond this percentile
			}
			var vs []float64
			for _, s := range c.Samples {
				vs = append(vs, HistogramPercentile(s.Latency.Histogram, q))
			}
			v := benchkit.Median(vs) / 1000
			if v > 0 && !math.IsNaN(v) {
				pts = append(pts, plotter.XY{X: nines(q), Y: v})
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, fmt.Errorf("latency curve %s: %w", c.Name, err)
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		sc.Color = l.Color
		sc.Shape = draw.CircleGlyph{}
		sc.Radius = vg.Points(2)
		p.Add(l, sc)
		p.Legend.Add(fmt.Sprintf("%s (max %s ms)", c.Name, ms(c.Summary.MaxUs)), l, sc)
		p.X.Max = math.Max(p.X.Max, pts[len(pts)-1].X+0.2)
	}
	if math.IsInf(lo, 1) {
		// Nothing measured: an empty frame with a valid log range, and a note.
		lo, hi = 0.1, 1
		p.Title.Text += ": no configuration measured"
		p.X.Max = 4
	}
	p.Y.Min, p.Y.Max = lo/1.3, hi*1.5
	p.Y.Tick.Marker = benchkit.LogTicks{}
	p.Add(plotter.NewGrid())
	return p, nil
}

func ratePlot(res *Result) (*plot.Plot, error) {
	p := plot.New()
	cr := res.Settings.Criterion
	p.Title.Text = fmt.Sprintf("Highest sustained rate (all 200, >= %.0f%% of target, p99 <= %s ms; median of %d rounds) and closed-loop rate",
		100*cr.MinAchieved, strconv.FormatFloat(cr.P99BoundUs/1000, 'g', -1, 64), res.Settings.Repeats)
	p.Y.Label.Text = "requests/s"
	p.Legend.Top = true
	p.Legend.Left = false
	p.Y.Min = 0
	names := make([]string, len(res.Cases))
	sust := make(plotter.Values, len(res.Cases))
	sat := make(plotter.Values, len(res.Cases))
	ymax := 1.0
	var l4 float64
	for i, c := range res.Cases {
		label := c.Name
		switch c.Summary.Verdict {
		case VerdictNotAvailable:
			label += "\nnot available"
		case VerdictInvalid:
			label += "\nINVALID"
		}
		names[i] = label
		if c.Summary.SustainedQPS.Valid() {
			sust[i] = float64(c.Summary.SustainedQPS)
		}
		if c.Summary.SaturationQPS.Valid() {
			sat[i] = float64(c.Summary.SaturationQPS)
		}
		ymax = math.Max(ymax, math.Max(sust[i], sat[i])*1.2)
		if c.Name == CaseL4 {
			l4 = sust[i]
		}
	}
	const barW = 26
	for k, s := range []struct {
		name string
		v    plotter.Values
	}{{"highest sustained rate", sust}, {"closed loop (as fast as the connections go)", sat}} {
		b, err := plotter.NewBarChart(s.v, vg.Points(barW))
		if err != nil {
			return nil, fmt.Errorf("bar chart: %w", err)
		}
		b.Color = palette[k]
		b.LineStyle.Width = 0
		b.Offset = vg.Points(barW * (float64(k) - 0.5))
		p.Add(b)
		p.Legend.Add(s.name, b)
	}
	if l4 > 0 {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: TargetL7OverL4 * l4}, {X: float64(len(res.Cases)) - 0.5, Y: TargetL7OverL4 * l4}})
		if err != nil {
			return nil, fmt.Errorf("target line: %w", err)
		}
		l.Color = color.RGBA{R: 0xc0, A: 0xff}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("L7 target: %.1f x L4 sustained", TargetL7OverL4), l)
	}
	p.Y.Max = ymax
	p.Y.Tick.Marker = wholeTicks{}
	p.Add(plotter.NewGrid())
	p.NominalX(names...)
	return p, nil
}

// wholeTicks labels the default ticks as whole numbers (rates, not "50000.00").
type wholeTicks struct{}

func (wholeTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', 0, 64)
		}
	}
	return ts
}
