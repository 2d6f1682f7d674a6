package cluster

import (
	"math"
	"slices"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Schema names the report format.
const Schema = "rampart-bench-cluster/1"

// Targets (issue 17).
const (
	// TargetPodRatio: the aggregate throughput of the most pairs keeps this much of one
	// pair's (the paper measured about 0.5 for Cilium and Calico at 40 pods).
	TargetPodRatio = 0.9
	// TargetPolicyRatio: every policy count keeps this much of the no-policy throughput.
	TargetPolicyRatio = 0.95
)

// Verdicts.
const (
	VerdictPass     = "PASS"
	VerdictMiss     = "MISS"
	VerdictBaseline = "BASELINE"
	VerdictControl  = "CONTROL"
	VerdictInvalid  = "INVALID" // no sample
)

// Report is one run of the benchmark.
type Report struct {
	Schema     string          `json:"schema"`
	Started    time.Time       `json:"started"`
	Finished   time.Time       `json:"finished"`
	Host       Host            `json:"host"`
	Settings   Settings        `json:"settings"`
	Modes      []ModeInfo      `json:"modes"`
	Pods       *PodsResult     `json:"pods,omitempty"`
	Overlay    *OverlayResult  `json:"overlay,omitempty"`
	Policies   *PoliciesResult `json:"policies,omitempty"`
	Published  []Published     `json:"published"`
	Errors     []string        `json:"errors,omitempty"`
	Incomplete bool            `json:"incomplete,omitempty"`
}

// Host describes the machine.
type Host struct {
	Hostname  string  `json:"hostname"`
	Kernel    string  `json:"kernel"`
	Go        string  `json:"go"`
	Iperf3    string  `json:"iperf3"`
	CPUs      int     `json:"cpus"`
	LoadStart float64 `json:"load_start"`
	LoadEnd   float64 `json:"load_end"`
}

// Settings are what the run was asked to do.
type Settings struct {
	Quick        bool      `json:"quick"`
	Experiments  []string  `json:"experiments"`
	Modes        []string  `json:"modes"`
	Pairs        []int     `json:"pairs"`
	Traffic      []Traffic `json:"traffic"`
	NoPolicy     bool      `json:"no_policy"`
	UDPBps       float64   `json:"udp_offered_bits_per_second"` // all pairs together; 0: unlimited
	PodRepeats   int       `json:"pod_repeats"`
	PodSeconds   int       `json:"pod_seconds"`
	Repeats      int       `json:"repeats"` // overlay and policy experiments
	Seconds      int       `json:"seconds"` // iperf3 per sample there
	RRSeconds    float64   `json:"rr_seconds"`
	PolicyCounts []int     `json:"policy_counts"`
	PolicyTunnel string    `json:"policy_tunnel"`
	CPU          int       `json:"cpu"` // overlay and policy experiments; -1 unpinned
	// Prefix starts the instance and namespace names of everything the run made.
	Prefix string `json:"prefix"`
	// Control is the clusters' control plane: nodes (real nodes), k8s (API server, etcd,
	// pod runners) or agent
	// (each agent's API); empty in reports from before the Kubernetes mode: agent.
	Control string `json:"control_plane,omitempty"`
}

// ModeInfo says whether a tunnel mode could be measured.
type ModeInfo struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	PodMTU    int    `json:"pod_mtu,omitempty"`
}

// PodsResult is the pod scalability experiment.
type PodsResult struct {
	Samples []PodSample  `json:"samples"`
	Summary []PodSummary `json:"summary"`
	Errors  []string     `json:"errors,omitempty"`
}

// PodSample is one measurement: Pairs iperf3 clients at once.
type PodSample struct {
	Mode      string  `json:"mode"`
	Traffic   string  `json:"traffic"`
	Policy    bool    `json:"policy"`
	Pairs     int     `json:"pairs"`
	Round     int     `json:"round"`
	Fragments bool    `json:"fragments"` // UDP datagrams larger than the pod MTU
	Bps       float64 `json:"aggregate_bits_per_second"`
	// PairBps is each pair's receiver rate.
	PairBps     []float64 `json:"pair_bits_per_second"`
	LossPercent float64   `json:"loss_percent,omitempty"` // UDP: lost / sent datagrams
	Retransmits int64     `json:"retransmits,omitempty"`  // TCP
	// WallSeconds is from the first client's start to the last one's end: above the iperf3
	// duration by the start-up skew.
	WallSeconds float64 `json:"wall_seconds"`
	// CPUBusy is how busy each CPU was over the sample, in percent (everything on the
	// machine: both nodes, all pods, and any other work).
	CPUBusy []float64 `json:"cpu_busy_percent"`
}

// PodSummary is one mode, traffic, policy variant and pair count over the rounds.
type PodSummary struct {
	Mode        string         `json:"mode"`
	Traffic     string         `json:"traffic"`
	Policy      bool           `json:"policy"`
	Pairs       int            `json:"pairs"`
	Bps         benchkit.Float `json:"aggregate_bits_per_second"` // median over rounds
	Ratio       benchkit.Float `json:"ratio_to_one_pair"`         // median of the rounds' ratios
	MinPairBps  benchkit.Float `json:"min_pair_bits_per_second"`  // median over rounds
	MaxPairBps  benchkit.Float `json:"max_pair_bits_per_second"`
	LossPercent benchkit.Float `json:"loss_percent"`
	CPUBusy     benchkit.Float `json:"cpu_busy_percent"`  // mean over CPUs, median over rounds
	Verdict     string         `json:"verdict,omitempty"` // at the most pairs
}

// OverlayResult is the overlay cost experiment.
type OverlayResult struct {
	Cases  []OverlayCase `json:"cases"`
	Errors []string      `json:"errors,omitempty"`
}

// Overlay cases: the bare fabric, native routing twice, and the tunnels.
const (
	CaseFabric        = "fabric"
	CaseNative        = "native"
	CaseNativeControl = "native-control"
)

// OverlayCase is one path measured with one pair.
type OverlayCase struct {
	Name      string         `json:"name"`
	Mode      string         `json:"mode,omitempty"`
	Available bool           `json:"available"`
	Reason    string         `json:"reason,omitempty"`
	PodMTU    int            `json:"pod_mtu,omitempty"`
	Samples   []PathSample   `json:"samples"`
	Summary   OverlaySummary `json:"summary"`
	Errors    []string       `json:"errors,omitempty"`
}

// PathSample is one round's measurement of a path.
type PathSample struct {
	Round int               `json:"round"`
	Pair  int               `json:"pair"`
	Flow  Flow              `json:"iperf"`
	RR    benchkit.RRResult `json:"rr"`
	// Set-up of a policy case (policy experiment only).
	ApplySeconds    float64           `json:"apply_seconds,omitempty"`
	EnforcedSeconds float64           `json:"enforced_seconds,omitempty"`
	MapEntries      int               `json:"map_entries,omitempty"`
	Probes          map[string]string `json:"probes,omitempty"`
}

// OverlaySummary: medians over rounds, and ratios (medians of the rounds' ratios) to
// native routing and to the bare fabric measured in the same round.
type OverlaySummary struct {
	Bps         benchkit.Float `json:"bits_per_second"`
	TPS         benchkit.Float `json:"tps"`
	P50Us       benchkit.Float `json:"p50_us"`
	P99Us       benchkit.Float `json:"p99_us"`
	VsNativeBps benchkit.Float `json:"throughput_vs_native"`
	VsNativeTPS benchkit.Float `json:"tps_vs_native"`
	VsNativeP50 benchkit.Float `json:"p50_vs_native"`
	VsFabricBps benchkit.Float `json:"throughput_vs_fabric"`
	VsFabricTPS benchkit.Float `json:"tps_vs_fabric"`
	VsFabricP50 benchkit.Float `json:"p50_vs_fabric"`
}

// PoliciesResult is the policy scalability experiment.
type PoliciesResult struct {
	Mode   string       `json:"mode"`
	Cases  []PolicyCase `json:"cases"`
	Errors []string     `json:"errors,omitempty"`
}

// Policy cases besides policies-N.
const (
	CaseNoPolicy = "no-policy"
	CaseControl  = "control" // no policy, measured as a case: the A/A control
)

// PolicyCase is one policy count (or the baseline, or the control).
type PolicyCase struct {
	Name     string        `json:"name"`
	Policies int           `json:"policies"`
	Samples  []PathSample  `json:"samples"`
	Summary  PolicySummary `json:"summary"`
	Errors   []string      `json:"errors,omitempty"`
}

// PolicySummary: medians over the pairs; ratios are medians of each pair's ratio to the
// no-policy sample taken next to it.
type PolicySummary struct {
	Bps          benchkit.Float `json:"bits_per_second"`
	TPS          benchkit.Float `json:"tps"`
	P50Us        benchkit.Float `json:"p50_us"`
	P99Us        benchkit.Float `json:"p99_us"`
	Ratio        benchkit.Float `json:"throughput_ratio"`
	RatioMin     benchkit.Float `json:"throughput_ratio_min"`
	RatioMax     benchkit.Float `json:"throughput_ratio_max"`
	TPSRatio     benchkit.Float `json:"tps_ratio"`
	P50Ratio     benchkit.Float `json:"p50_ratio"`
	MapEntries   int            `json:"map_entries"`
	EnforcedSecs benchkit.Float `json:"enforced_seconds"`
	Verdict      string         `json:"verdict"`
}

// Published is a figure from the paper, as its text gives it (its charts carry no
// numbers).
type Published struct {
	Experiment string `json:"experiment"`
	System     string `json:"system"`
	Figure     string `json:"figure"`
	Value      string `json:"value"`
}

// published is seeds/001 (Shakeri, van Noort, Grosso, CloudNet 2019): Kubernetes, two
// 1-CPU worker VMs on separate machines over 10 Gbit/s, Cilium 1.6 (VXLAN) and Calico 3.5
// (IP-in-IP), iperf3, mean of three 300 s runs.
var published = []Published{
	{"pods", "Cilium, Calico", "abstract, Fig. 5", "about 50 % throughput degradation from 1 to 40 pods (ratio about 0.5)"},
	{"pods", "Calico (IP-in-IP)", "Sec. V, Fig. 5", "TCP: 1.2 Gbit/s lost at 40 pods; UDP: 0.3 Gbit/s lost"},
	{"pods", "Cilium (VXLAN)", "Sec. V, Fig. 5", "TCP: 1 Gbit/s lost at 40 pods; UDP: 0.1 Gbit/s lost"},
	{"pods", "Cilium", "Sec. VII, Fig. 6", "drops fragmented UDP datagrams (decides before reassembly); Calico compared at 1422-byte datagrams"},
	{"pods", "Cilium", "Sec. VII, Fig. 6", "etcd offloaded to another VM: throughput closer to Calico's"},
	{"overlay", "Calico vs Cilium", "Sec. VI", "Calico (IP-in-IP) always above Cilium (VXLAN): VXLAN adds more per packet"},
	{"policies", "Cilium, Calico", "Sec. V, Fig. 4", "little throughput degradation as policies grow (matched by the last); Calico's drop larger (iptables), Cilium's hash lookup O(1)"},
}

// median of xs ignoring NaN (NaN for none).
func median(xs []float64) benchkit.Float {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	return benchkit.Float(benchkit.Median(v))
}

func minMax(xs []float64) (benchkit.Float, benchkit.Float) {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return benchkit.NaN(), benchkit.NaN()
	}
	return benchkit.Float(slices.Min(v)), benchkit.Float(slices.Max(v))
}
