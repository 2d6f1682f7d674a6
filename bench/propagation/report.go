package propagation

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Report is one run's result (bench/results/propagation-<time>.json).
type Report struct {
	Benchmark string    `json:"benchmark"`
	Mode      string    `json:"mode"` // quick or full
	Config    config    `json:"config"`
	Started   time.Time `json:"started"`
	Kernel    string    `json:"kernel"`
	CPUs      int       `json:"cpus"`
	Tunnel    string    `json:"tunnel"`
	Target    float64   `json:"target_p99_seconds"`
	// Load is /proc/loadavg (the machine is shared) at the start, after the pods were made,
	// and at the end.
	Load struct {
		Start     string `json:"start"`
		AfterPods string `json:"after_pods"`
		End       string `json:"end"`
	} `json:"load"`
	Identity    []IdentityCase    `json:"identity"`
	Propagation PropagationResult `json:"propagation"`
}

// Dist is a distribution in seconds (nearest-rank percentiles).
type Dist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func (d Dist) String() string {
	return fmt.Sprintf("p50 %.3fs p95 %.3fs p99 %.3fs max %.3fs (n=%d)", d.P50, d.P95, d.P99, d.Max, d.N)
}

func dist(xs []time.Duration) Dist {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return Dist{}
	}
	return Dist{N: len(s), P50: benchkit.Percentile(s, 50).Seconds(), P95: benchkit.Percentile(s, 95).Seconds(),
		P99: benchkit.Percentile(s, 99).Seconds(), Max: s[len(s)-1].Seconds()}
}

// IdentityCase is the identity allocation of one batch of new pods.
type IdentityCase struct {
	Name       string `json:"name"` // distinct (a label set per pod) or shared
	Pods       int    `json:"pods"`
	LabelSets  int    `json:"label_sets"`
	Identities int    `json:"identities"` // distinct cluster identities the agents report
	// Allocated is how many SecurityIdentity objects the batch added to the API.
	Allocated int `json:"allocated"`
	// CreateSeconds: from the first Pod create until the last AddPod returned (Pod object,
	// CNI ADD, status.podIP), Parallel at a time.
	CreateSeconds float64 `json:"create_seconds"`
	// TotalSeconds: from the first Pod create until every node knew every pod's identity.
	TotalSeconds  float64 `json:"total_seconds"`
	PodsPerSecond float64 `json:"pods_per_second"`
	// PerPod: from the pod's create until the last node knew its identity.
	PerPod Dist `json:"per_pod"`
	// AddPod: the pod's create, CNI ADD (which waits for the pod's identity) and status.
	AddPod     Dist `json:"add_pod"`
	PollRounds int  `json:"poll_rounds"`
}

// PropagationResult is the policy writes' propagation.
type PropagationResult struct {
	Writes            int     `json:"writes"`
	SelectedEndpoints int     `json:"selected_endpoints"`
	Target            float64 `json:"target_p99_seconds"`
	// PerEndpoint: from the API write until a selected endpoint's node's pinned policy map
	// holds the new rule and not the old, over every endpoint and write.
	PerEndpoint Dist `json:"per_endpoint"`
	// PerNode: until the last selected endpoint of a node, over nodes and writes.
	PerNode Dist `json:"per_node"`
	// APIWrite: the update request's round trip.
	APIWrite     Dist          `json:"api_write"`
	Verdict      string        `json:"verdict"` // PASS: PerEndpoint.P99 <= Target
	Probes       int           `json:"probes"`
	ProbesFailed int           `json:"probes_failed"`
	PerWrite     []WriteResult `json:"per_write"`
}

// WriteResult is one write: the port it allows and when each node enforced it on all of
// its selected endpoints.
type WriteResult struct {
	Port       int                `json:"port"`
	APISeconds float64            `json:"api_seconds"`
	Nodes      map[string]float64 `json:"nodes_seconds"`
	MaxSeconds float64            `json:"max_seconds"`
	Endpoints  Dist               `json:"endpoints"`
}

// Table renders the report as markdown.
func (r *Report) Table() string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "policy propagation (%s run), %d nodes (%s), kernel %s, %d CPUs; load average (/proc/loadavg) at start %q, after the pods %q, at end %q\n\n",
		r.Mode, c.Nodes, r.Tunnel, r.Kernel, r.CPUs, r.Load.Start, r.Load.AfterPods, r.Load.End)
	b.WriteString("| identity allocation | pods | label sets | identities | allocated | all known on every node | pods/s | per pod p50 | p99 | max | AddPod p50 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, ic := range r.Identity {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %.2f s | %.1f | %.3f s | %.3f s | %.3f s | %.3f s |\n", ic.Name, ic.Pods, ic.LabelSets, ic.Identities, ic.Allocated,
			ic.TotalSeconds, ic.PodsPerSecond, ic.PerPod.P50, ic.PerPod.P99, ic.PerPod.Max, ic.AddPod.P50)
	}
	p := r.Propagation
	fmt.Fprintf(&b, "\n| propagation | writes | selected endpoints | p50 | p95 | p99 | max | target p99 | verdict |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	fmt.Fprintf(&b, "| per endpoint | %d | %d | %.3f s | %.3f s | %.3f s | %.3f s | %.1f s | %s |\n", p.Writes, p.SelectedEndpoints,
		p.PerEndpoint.P50, p.PerEndpoint.P95, p.PerEndpoint.P99, p.PerEndpoint.Max, p.Target, p.Verdict)
	fmt.Fprintf(&b, "| per node (last endpoint) | %d | | %.3f s | %.3f s | %.3f s | %.3f s | | |\n", p.Writes, p.PerNode.P50, p.PerNode.P95, p.PerNode.P99, p.PerNode.Max)
	fmt.Fprintf(&b, "| API write round trip | %d | | %.3f s | %.3f s | %.3f s | %.3f s | | |\n", p.Writes, p.APIWrite.P50, p.APIWrite.P95, p.APIWrite.P99, p.APIWrite.Max)
	fmt.Fprintf(&b, "\nprobes (real packets, a sample per write): %d of %d as the policy says\n", p.Probes-p.ProbesFailed, p.Probes)
	return b.String()
}

// Plot draws, per write, the endpoints' p50 and max time to enforcement, and the target.
func (r *Report) Plot(path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("policy write to enforcement, %d nodes, %d selected endpoints (%s run)", r.Config.Nodes, r.Propagation.SelectedEndpoints, r.Mode)
	p.X.Label.Text = "write"
	p.Y.Label.Text = "seconds"
	var p50, mx, tgt plotter.XYs
	for i, w := range r.Propagation.PerWrite {
		p50 = append(p50, plotter.XY{X: float64(i + 1), Y: w.Endpoints.P50})
		mx = append(mx, plotter.XY{X: float64(i + 1), Y: w.Endpoints.Max})
		tgt = append(tgt, plotter.XY{X: float64(i + 1), Y: r.Target})
	}
	for _, s := range []struct {
		name string
		xy   plotter.XYs
		dash bool
	}{{"endpoints p50", p50, false}, {"endpoints max", mx, false}, {"target p99", tgt, true}} {
		if len(s.xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(s.xy)
		if err != nil {
			return err
		}
		if s.dash {
			l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		} else if s.name == "endpoints max" {
			l.Width = vg.Points(2)
		}
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	// Room above the target line for the legend.
	p.Y.Min, p.Y.Max = 0, 1.35*r.Target
	for _, w := range r.Propagation.PerWrite {
		p.Y.Max = max(p.Y.Max, 1.1*w.Endpoints.Max)
	}
	p.Legend.Top = true
	if err := p.Save(8*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return fmt.Errorf("writing plot %s: %w", path, err)
	}
	return nil
}

// config is one run's size.
type config struct {
	Full       bool `json:"full"`
	Nodes      int  `json:"nodes"`
	Pods       int  `json:"pods"`        // pods with distinct label sets
	Shared     int  `json:"shared_pods"` // pods sharing SharedSets label sets
	SharedSets int  `json:"shared_sets"`
	Writes     int  `json:"writes"`
	Parallel   int  `json:"parallel"` // pods created at once
}
