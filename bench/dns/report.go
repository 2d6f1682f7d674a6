package dns

import (
	"fmt"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Table is the report as markdown: part one's cases with their ratios, part two's stages,
// and the agent's DNS counters.
func Table(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Started %s, kernel %s, %d CPUs, load %.2f -> %.2f. Query latency: %d sequential queries per sample; rate: %d clients for %.1f s; %d rounds.\n\n",
		rep.Started.Format("2006-01-02T15:04:05Z"), rep.Kernel, rep.CPUs, rep.LoadStart, rep.LoadEnd,
		rep.Queries, rep.Workers, rep.RateSecs, rep.Rounds)
	b.WriteString("| case | baseline | p50 us | p50 ratio (min-max) | added p50 us | p99 us | p99 ratio (min-max) | queries/s | q/s ratio (min-max) | failed queries |\n")
	b.WriteString("|---|---|---:|---|---:|---:|---|---:|---|---:|\n")
	for _, c := range rep.Cases {
		failed := 0
		for _, s := range c.Samples {
			failed += s.LatencyFailed + s.RateFailed
		}
		fmt.Fprintf(&b, "| %s | %s | %.1f | %s | %.1f | %.1f | %s | %.0f | %s | %d |\n", c.Name, c.Baseline,
			median(c.Samples, func(s Sample) float64 { return s.P50us }), c.P50Ratio, c.AddedP50us,
			median(c.Samples, func(s Sample) float64 { return s.P99us }), c.P99Ratio,
			median(c.Samples, func(s Sample) float64 { return s.QPS }), c.QPSRatio, failed)
	}
	l := rep.Learn
	fmt.Fprintf(&b, "\nNew names, each resolved through the proxy and connected to at once (TCP 80, %.0f ms timeout; a connection over 1 s lost its first SYN); %d rounds of %d names per policy and stage:\n\n",
		l.ConnectTimeoutMs, l.Rounds, l.NamesPerBlock)
	b.WriteString("| learnt addresses | policy | names | resolve p50 us | resolve p99 us | resolve max us | connect p50 us | connect p99 us | first packets dropped | no answer |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, st := range l.Stages {
		if f := l.Fill; i == 1 && f.Names > 0 {
			fmt.Fprintf(&b, "| %d-%d (fill, %.1f s) | toFQDNs (learning) | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %d | %d |\n",
				st.LearntAtStart-f.Names, st.LearntAtStart, l.FillSeconds, f.Names, f.ResolveP50us, f.ResolveP99us,
				f.ResolveMaxUs, f.ConnectP50us, f.ConnectP99us, f.FirstPacketDropped, f.NoAnswer)
		}
		for _, m := range []struct {
			name string
			s    LearnStats
		}{{"toFQDNs (learning)", st.Learning}, {"toCIDR (baseline)", st.Baseline}} {
			fmt.Fprintf(&b, "| %d-%d | %s | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %d | %d |\n", st.LearntAtStart, st.LearntAtEnd,
				m.name, m.s.Names, m.s.ResolveP50us, m.s.ResolveP99us, m.s.ResolveMaxUs, m.s.ConnectP50us, m.s.ConnectP99us,
				m.s.FirstPacketDropped, m.s.NoAnswer)
		}
	}
	b.WriteString("\n")
	for _, st := range l.Stages {
		fmt.Fprintf(&b, "Learning adds %.0f us at p50 with %d-%d learnt addresses (per round, learning p50 / baseline p50 us: %s).\n",
			st.AddedP50us, st.LearntAtStart, st.LearntAtEnd, roundPairs(st.Blocks))
	}
	d := rep.DNS
	fmt.Fprintf(&b, "\nAgent's DNS status at the end: %s, %d queries, %d allowed, %d refused, %d forwarded, %d upstream errors, %d learn errors, drops %s; %d names, %d addresses learnt, %d evicted.\n",
		d.State, d.Queries, d.Allowed, d.Refused, d.Forwarded, d.UpstreamErrors, d.LearnErrors, drops(d.Drops), d.Names, d.Addresses, d.Evicted)
	return b.String()
}

func (r Ratio) String() string {
	if !r.Median.Valid() {
		return "-"
	}
	return fmt.Sprintf("%.3f (%.3f-%.3f)", float64(r.Median), float64(r.Min), float64(r.Max))
}

func roundPairs(blocks []Block) string {
	byRound := map[int]map[string]float64{}
	var rounds []int
	for _, b := range blocks {
		if byRound[b.Round] == nil {
			byRound[b.Round] = map[string]float64{}
			rounds = append(rounds, b.Round)
		}
		byRound[b.Round][b.Mode] = b.ResolveP50us
	}
	var parts []string
	for _, r := range rounds {
		parts = append(parts, fmt.Sprintf("%.0f/%.0f", byRound[r][Learning], byRound[r][Baseline]))
	}
	return strings.Join(parts, ", ")
}

func drops(m map[string]uint64) string {
	if len(m) == 0 {
		return "none"
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func median(xs []Sample, f func(Sample) float64) float64 {
	vs := make([]float64, 0, len(xs))
	for _, x := range xs {
		vs = append(vs, f(x))
	}
	return benchkit.Median(vs)
}

// Plot draws part one's ratios (left) and part two's toFQDNs resolve latency against
// the learnt addresses, with the toCIDR baseline (right), to path (PNG).
func Plot(rep *Report, path string) error {
	left, err := plotRatios(rep)
	if err != nil {
		return err
	}
	right, err := plotCurve(rep)
	if err != nil {
		return err
	}
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Inch / 4, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	return benchkit.DrawPNG(13*vg.Inch, 4.5*vg.Inch, path, func(dc draw.Canvas) {
		for i, p := range []*plot.Plot{left, right} {
			p.Draw(tiles.At(dc, i, 0))
		}
	})
}

func plotRatios(rep *Report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "DNS queries: ratio to direct (median over rounds)"
	p.Y.Label.Text = "ratio to the case's direct baseline"
	var names []string
	var cases []Case
	for _, c := range rep.Cases {
		if c.Name != c.Baseline {
			names = append(names, c.Name)
			cases = append(cases, c)
		}
	}
	bars := []struct {
		metric string
		f      func(Case) Ratio
	}{{"latency p50", func(c Case) Ratio { return c.P50Ratio }}, {"latency p99", func(c Case) Ratio { return c.P99Ratio }},
		{"queries/s", func(c Case) Ratio { return c.QPSRatio }}}
	w := vg.Points(14)
	for bi, bd := range bars {
		var vals plotter.Values
		for _, c := range cases {
			v := float64(bd.f(c).Median)
			if !bd.f(c).Median.Valid() {
				v = 0
			}
			vals = append(vals, v)
		}
		bc, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, fmt.Errorf("plotting: %w", err)
		}
		bc.Color = plotutil.Color(bi)
		bc.Offset = vg.Length(float64(bi)-1) * w
		p.Add(bc)
		p.Legend.Add(bd.metric, bc)
	}
	one, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(names)) - 0.5, Y: 1}})
	if err != nil {
		return nil, fmt.Errorf("plotting: %w", err)
	}
	one.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	p.Add(one)
	p.NominalX(names...)
	p.Y.Min, p.Y.Max = 0, p.Y.Max*1.25
	p.Legend.Top, p.Legend.Left = true, true
	return p, nil
}

func plotCurve(rep *Report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "New name through the proxy: resolve time"
	p.X.Label.Text = "addresses learnt before"
	p.Y.Label.Text = "resolve time, ms"
	var p50, p99 plotter.XYs
	for _, c := range rep.Learn.Curve {
		p50 = append(p50, plotter.XY{X: float64(c.Learnt), Y: c.ResolveP50us / 1000})
		p99 = append(p99, plotter.XY{X: float64(c.Learnt), Y: c.ResolveP99us / 1000})
	}
	for i, s := range []struct {
		name string
		xy   plotter.XYs
	}{{"toFQDNs p50", p50}, {"toFQDNs p99 (groups of up to 100 names)", p99}} {
		if len(s.xy) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(s.xy)
		if err != nil {
			return nil, fmt.Errorf("plotting: %w", err)
		}
		l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
		p.Add(l, pts)
		p.Legend.Add(s.name, l, pts)
	}
	legend := false
	for _, st := range rep.Learn.Stages {
		y := st.Baseline.ResolveP50us / 1000
		base, err := plotter.NewLine(plotter.XYs{{X: float64(st.LearntAtStart), Y: y}, {X: float64(st.LearntAtEnd), Y: y}})
		if err != nil {
			return nil, fmt.Errorf("plotting: %w", err)
		}
		base.Color = plotutil.Color(2)
		base.Width = vg.Points(3)
		p.Add(base)
		if !legend {
			p.Legend.Add("toCIDR p50 (no learning)", base)
			legend = true
		}
	}
	p.Y.Min = 0
	p.Legend.Top, p.Legend.Left = true, true
	return p, nil
}
