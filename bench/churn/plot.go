package churn

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Plot writes the p50 of each method by size, add and delete side by side, to path (PNG).
func Plot(rep *Report, path string) error {
	names := make([]string, len(rep.Sizes))
	for i, s := range rep.Sizes {
		names[i] = strconv.Itoa(s)
	}
	var plots []*plot.Plot
	for _, op := range []string{OpAdd, OpDelete} {
		p := plot.New()
		p.Title.Text = "endpoint " + op + " (p50)"
		p.X.Label.Text = "endpoints present"
		p.Y.Label.Text = "ms"
		w := vg.Points(12)
		methods := Methods
		top := 0.0
		for i, m := range methods {
			vals := make(plotter.Values, len(rep.Sizes))
			for j, size := range rep.Sizes {
				if s := rep.Find(size, m, op); s != nil {
					vals[j] = s.P50
					top = max(top, s.P50)
				}
			}
			bars, err := plotter.NewBarChart(vals, w)
			if err != nil {
				return fmt.Errorf("plotting %s %s: %w", m, op, err)
			}
			bars.Color = plotutil.Color(i)
			bars.LineStyle.Width = 0
			bars.Offset = w * (vg.Length(i) - vg.Length(len(methods)-1)/2)
			p.Add(bars)
			p.Legend.Add(m, bars)
		}
		if op == OpAdd {
			line := plotter.NewFunction(func(float64) float64 { return TargetAddMs })
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			p.Add(line)
			top = max(top, TargetAddMs)
			p.Legend.Add(fmt.Sprintf("target %.0f ms", TargetAddMs), line)
		}
		p.Legend.Top = true
		p.NominalX(names...)
		p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
		p.Y.Min, p.Y.Max = 0, top*1.3
		plots = append(plots, p)
	}
	const width, height = 11 * vg.Inch, 4.5 * vg.Inch
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Points(10)}
	return benchkit.GridPNG([][]*plot.Plot{plots}, tiles, width, height, path)
}

// Table renders the report as markdown: the latencies, the targets and the idle agent.
func Table(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "endpoint churn, %s, kernel %s, %d CPUs, %d rounds per size\n\n", rep.Started.Format("2006-01-02 15:04 MST"), rep.Kernel, rep.CPUs, rep.Rounds)
	b.WriteString("| endpoints present | method | add p50 ms | add p99 ms | delete p50 ms | delete p99 ms |\n|---|---|---|---|---|---|\n")
	for _, size := range rep.Sizes {
		for _, m := range Methods {
			a, d := rep.Find(size, m, OpAdd), rep.Find(size, m, OpDelete)
			if a == nil || d == nil {
				continue
			}
			fmt.Fprintf(&b, "| %d | %s | %.1f | %.1f | %.1f | %.1f |\n", size, m, a.P50, a.P99, d.P50, d.P99)
		}
	}
	attach := rep.AttachBaseline
	if attach == "" {
		attach = MethodBaselineTCX
	}
	fmt.Fprintf(&b, "\n| endpoints present | A/A: baseline-aa / baseline, add p50 | A/A delete p50 | agent's share of an add: api - %s p50, ms | of a delete, ms | agent CPU ms per change |\n|---|---|---|---|---|---|\n", attach)
	for _, size := range rep.Sizes {
		p50 := func(m, op string) float64 {
			if s := rep.Find(size, m, op); s != nil {
				return s.P50
			}
			return math.NaN()
		}
		fmt.Fprintf(&b, "| %d | %.2f | %.2f | %.1f | %.1f | %.1f |\n", size,
			p50(MethodBaselineAA, OpAdd)/p50(MethodBaseline, OpAdd), p50(MethodBaselineAA, OpDelete)/p50(MethodBaseline, OpDelete),
			p50(MethodAPI, OpAdd)-p50(attach, OpAdd), p50(MethodAPI, OpDelete)-p50(attach, OpDelete),
			rep.AgentCPUPerChange[size])
	}
	b.WriteString("\n| endpoints present | method | target | value | limit | |\n|---|---|---|---|---|---|\n")
	for _, c := range rep.Checks {
		verdict := "PASS"
		if !c.Pass {
			verdict = "MISS"
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %.2f | %.2f | %s |\n", c.Size, c.Method, c.What, c.Value, c.Limit, verdict)
	}
	if i := rep.Idle; i != nil {
		fmt.Fprintf(&b, "\nidle agent with %d endpoints: anonymous RSS %.1f MiB, BPF maps %.1f MiB (memlock of %d maps), CPU %.0f ms over %.0f s (%.2f %% of a core)\n",
			i.Endpoints, float64(i.RssAnon)/(1<<20), float64(i.MapMemlock)/(1<<20), i.Maps, i.CPUMs, i.Interval, i.CPUPercent)
	}
	return b.String()
}
