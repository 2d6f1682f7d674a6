package egress

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// filterColors gives every filter the same colour in every panel.
var filterColors = map[string]color.Color{
	FilterNone:       color.RGBA{R: 0x50, G: 0x50, B: 0x50, A: 0xff},
	FilterControl:    color.RGBA{R: 0xa0, G: 0xa0, B: 0xa0, A: 0xff},
	FilterIptables:   color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	FilterIpset:      color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	FilterNft:        color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	FilterLPM:        color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	FilterEmptyTCX:   color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	FilterAgentEmpty: color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff},
	FilterRampart:    color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
}

// panel is one chart: a metric of every filter against the number of prefixes.
type panel struct {
	title, unit string
	logY        bool
	value       func(s Summary) benchkit.Float
	// baseline: whether the no-filter row is drawn (not for set-up time, which it has not).
	baseline bool
}

var panels = []panel{
	{"TCP throughput", "Gbit/s", false, func(s Summary) benchkit.Float { return s.TCPGbps }, true},
	{"UDP throughput (1470-byte datagrams, unlimited rate)", "Gbit/s", false, func(s Summary) benchkit.Float { return s.UDPGbps }, true},
	{"CPU of the sender at a fixed UDP rate (scaled to the rate when it fell short)", "iperf3 client CPU %, log scale", true, func(s Summary) benchkit.Float { return s.CPUPercent }, true},
	{"ping round trip, p50 (1 ms interval)", "us, log scale", true, func(s Summary) benchkit.Float { return s.PingP50Us }, true},
	{"TCP request/response, p50", "us, log scale", true, func(s Summary) benchkit.Float { return s.RRP50Us }, true},
	{"set-up time (command to listed address blocked)", "s, log scale", true, func(s Summary) benchkit.Float { return s.SetupSeconds }, false},
}

// WritePlot draws the report as a PNG: one panel per metric, the number of prefixes on a
// log axis, a line per filter (the paper's figures, as lines), the baseline dashed and the
// A/A control dotted.
func WritePlot(res *Result, path string) error {
	var plots [][]*plot.Plot
	for i := 0; i < len(panels); i += 2 {
		var row []*plot.Plot
		for _, pn := range panels[i:min(i+2, len(panels))] {
			p, err := panelPlot(res, pn)
			if err != nil {
				return err
			}
			row = append(row, p)
		}
		plots = append(plots, row)
	}
	const w, h = 14 * vg.Inch, 15 * vg.Inch
	return benchkit.GridPNG(plots, benchkit.Tiles(len(plots), 2, vg.Points(18), vg.Points(18)), w, h, path)
}

func panelPlot(res *Result, pn panel) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.title
	if res.Settings.IPv6 {
		p.Title.Text = "IPv6: " + pn.title // a run over IPv6 must not pass for an IPv4 one
	}
	p.X.Label.Text = "prefixes (log scale)"
	p.Y.Label.Text = pn.unit
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = countTicks{}
	p.Legend.Top = true
	p.Legend.Left = true
	if pn.logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = benchkit.LogTicks{}
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	xlo, xhi := math.Inf(1), math.Inf(-1)
	for _, name := range res.Settings.Filters {
		if (name == FilterNone || name == FilterControl) && !pn.baseline {
			continue
		}
		var pts plotter.XYs
		for _, c := range res.Counts {
			for _, f := range c.Filters {
				if f.Filter != name {
					continue
				}
				v := pn.value(f.Summary)
				if !v.Valid() || (pn.logY && v <= 0) {
					continue
				}
				pts = append(pts, plotter.XY{X: float64(c.Count), Y: float64(v)})
				lo, hi = math.Min(lo, float64(v)), math.Max(hi, float64(v))
			}
			xlo, xhi = math.Min(xlo, float64(c.Count)), math.Max(xhi, float64(c.Count))
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, fmt.Errorf("%s curve of %s: %w", pn.title, name, err)
		}
		col := filterColors[name]
		l.Color, sc.Color = col, col
		l.Width = vg.Points(1.5)
		switch name {
		case FilterNone:
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		case FilterControl:
			// The A/A control: the baseline measured again on the peers' topology; its
			// distance from the baseline's line is the noise.
			l.Dashes = []vg.Length{vg.Points(1), vg.Points(2)}
		}
		sc.Shape = draw.CircleGlyph{}
		sc.Radius = vg.Points(2.5)
		p.Add(l, sc)
		p.Legend.Add(name, l, sc)
	}
	if math.IsInf(lo, 1) {
		// Nothing measured: an empty frame with valid ranges.
		lo, hi = 1, 10
		p.Title.Text += ": nothing measured"
	}
	if math.IsInf(xlo, 1) {
		xlo, xhi = 10, 1e7
	}
	p.X.Min, p.X.Max = xlo/1.5, xhi*1.5
	if pn.logY {
		p.Y.Min, p.Y.Max = lo/1.5, hi*3
	} else {
		p.Y.Min, p.Y.Max = 0, hi*1.25
	}
	p.Add(plotter.NewGrid())
	return p, nil
}

// countTicks labels every decade of the prefix axis (10, 100, 1k, ..., 10M).
type countTicks struct{}

func (countTicks) Ticks(min, max float64) []plot.Tick {
	var out []plot.Tick
	for v := 1.0; v <= max*10; v *= 10 {
		if v >= min && v <= max {
			out = append(out, plot.Tick{Value: v, Label: countText(int(v))})
		}
	}
	return out
}
