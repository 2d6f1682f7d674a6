package cluster

import (
	"fmt"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Plot draws the report as a PNG at path: the pod scalability ratios by pair count (with
// the target and the paper's 0.5), the overlay cost ratios to native routing, and the
// policy scalability ratios to no policy.
func Plot(rep *Report, path string) error {
	var rows [][]*plot.Plot
	if rep.Pods != nil {
		p, err := podsPlot(rep)
		if err != nil {
			return err
		}
		rows = append(rows, []*plot.Plot{p})
	}
	if rep.Overlay != nil {
		p, err := overlayPlot(rep.Overlay)
		if err != nil {
			return err
		}
		rows = append(rows, []*plot.Plot{p})
	}
	if rep.Policies != nil {
		p, err := policiesPlot(rep.Policies)
		if err != nil {
			return err
		}
		rows = append(rows, []*plot.Plot{p})
	}
	if len(rows) == 0 {
		return fmt.Errorf("nothing to plot")
	}
	w, h := 11*vg.Inch, vg.Length(len(rows))*4.5*vg.Inch
	return benchkit.GridPNG(rows, benchkit.Tiles(len(rows), 1, 0, vg.Points(16)), w, h, path)
}

func hline(p *plot.Plot, y float64, label string, dashed bool) {
	l := plotter.NewFunction(func(float64) float64 { return y })
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	} else {
		l.Dashes = []vg.Length{vg.Points(1), vg.Points(3)}
	}
	p.Add(l)
	p.Legend.Add(label, l)
}

func podsPlot(rep *Report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Pod scalability: aggregate throughput of n pairs / 1 pair (allow policy; %d CPUs)", rep.Host.CPUs)
	p.X.Label.Text = "client/server pod pairs (clients on node A, servers on node B)"
	p.Y.Label.Text = "ratio to 1 pair"
	i := 0
	top := 1.2
	seen := map[string]bool{}
	for _, s := range rep.Pods.Summary {
		k := s.Mode + " " + s.Traffic
		if !s.Policy || seen[k] {
			continue
		}
		seen[k] = true
		var pts plotter.XYs
		for _, t := range rep.Pods.Summary {
			if t.Mode == s.Mode && t.Traffic == s.Traffic && t.Policy && t.Ratio.Valid() {
				pts = append(pts, plotter.XY{X: float64(t.Pairs), Y: float64(t.Ratio)})
				top = max(top, float64(t.Ratio)*1.1)
			}
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, fmt.Errorf("plotting %s: %w", k, err)
		}
		line.Color, points.Color = plotutil.Color(i), plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(k, line, points)
		i++
	}
	// Pair counts grow geometrically: a log axis spaces them evenly.
	var ticks []plot.Tick
	for _, n := range rep.Settings.Pairs {
		ticks = append(ticks, plot.Tick{Value: float64(n), Label: fmt.Sprint(n)})
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	hline(p, TargetPodRatio, fmt.Sprintf("target %.1f", TargetPodRatio), true)
	hline(p, 0.5, "paper: Cilium, Calico at 40 pods (about 0.5)", false)
	// Room above the lines for the legend.
	p.Y.Min, p.Y.Max = 0, top+0.15*float64(i+2)
	p.Legend.Top = true
	return p, nil
}

func bars(p *plot.Plot, names []string, series []string, vals [][]float64) error {
	w := vg.Points(14)
	for i, name := range series {
		v := make(plotter.Values, len(names))
		copy(v, vals[i])
		b, err := plotter.NewBarChart(v, w)
		if err != nil {
			return fmt.Errorf("plotting %s: %w", name, err)
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = w * (vg.Length(i) - vg.Length(len(series)-1)/2)
		p.Add(b)
		p.Legend.Add(name, b)
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
	return nil
}

// val is f, or 0 (no bar) when it has no value.
func val(f benchkit.Float) float64 {
	if !f.Valid() {
		return 0
	}
	return float64(f)
}

func overlayPlot(o *OverlayResult) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Overlay cost: one pair, ratio to native routing (higher is better; fabric = two namespaces on the fabric veth)"
	p.Y.Label.Text = "ratio to native"
	var names []string
	vals := make([][]float64, 2)
	top := 1.2
	for _, c := range o.Cases {
		names = append(names, c.Name)
		s := c.Summary
		vals[0] = append(vals[0], val(s.VsNativeBps))
		vals[1] = append(vals[1], val(s.VsNativeTPS))
		top = max(top, vals[0][len(vals[0])-1]*1.1, vals[1][len(vals[1])-1]*1.1)
	}
	if err := bars(p, names, []string{"TCP throughput (iperf3)", "transactions/s (1-byte TCP RR)"}, vals); err != nil {
		return nil, err
	}
	hline(p, 1, "native", true)
	p.Y.Min, p.Y.Max = 0, top
	p.Legend.Top = true
	return p, nil
}

func policiesPlot(r *PoliciesResult) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Policy scalability across nodes (%s): ratio to no policy, the matching policy last", r.Mode)
	p.Y.Label.Text = "ratio to no policy"
	var names []string
	vals := make([][]float64, 2)
	top := 1.2
	for _, c := range r.Cases {
		names = append(names, c.Name+"\n"+c.Summary.Verdict)
		s := c.Summary
		vals[0] = append(vals[0], val(s.Ratio))
		vals[1] = append(vals[1], val(s.TPSRatio))
		top = max(top, vals[0][len(vals[0])-1]*1.1, vals[1][len(vals[1])-1]*1.1)
	}
	if err := bars(p, names, []string{"TCP throughput (iperf3)", "transactions/s (1-byte TCP RR)"}, vals); err != nil {
		return nil, err
	}
	hline(p, TargetPolicyRatio, fmt.Sprintf("target %.2f", TargetPolicyRatio), true)
	p.Y.Min, p.Y.Max = 0, top
	p.Legend.Top = true
	return p, nil
}
