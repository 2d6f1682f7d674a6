package applylatency

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/api"
)

// TargetMs is the target of issue 17: a 10,000-rule policy enforced within 150 ms of the
// apply call.
const (
	TargetMs    = 150
	TargetRules = 10000
)

// Build is one agent build under test: rampartd and rampart binaries.
type Build struct {
	Name              string
	Rampartd, Rampart string
}

// Config is one run of the benchmark.
type Config struct {
	Builds []Build
	Sizes  []int // rule counts
	Format Format
	Rounds int // samples per series
	// Instance prefixes the agents' instance names (one agent per build: Instance + index).
	Instance string
	// PodCIDR is split into one /24 per build, for its endpoints.
	PodCIDR    netip.Prefix
	AgentFlags []string
	WorkDir    string
	// Interval between connection attempts of a prober, and how long an attempt may go
	// unanswered before it counts as dropped.
	Interval, AttemptTimeout time.Duration
	Log                      func(format string, args ...any)
}

// Sample is one measured apply.
type Sample struct {
	APIMs      float64 `json:"api_ms"`      // apply call start to its answer
	EnforcedMs float64 `json:"enforced_ms"` // to both probed changes seen in packets
	AllowedMs  float64 `json:"allowed_ms"`  // to the first connection admitted by the last rule
	DeniedMs   float64 `json:"denied_ms"`   // to the first attempt of the old-only flow from which on all are dropped
	RevertMs   float64 `json:"revert_ms"`   // applying the one-rule policy back (API answer)
	// AgentCPUMs is the CPU time the agent used from the call to its answer: what the
	// apply costs whatever else the machine runs.
	AgentCPUMs float64 `json:"agent_cpu_ms"`
	Attempts   int     `json:"attempts"` // connection attempts of both probers
	Valid      bool    `json:"valid"`
	Note       string  `json:"note,omitempty"` // why a sample is not valid
}

// Series is the samples of one build and rule count; Control marks the A/A control, a
// second series measured exactly like the first.
type Series struct {
	Build   string   `json:"build"`
	Rules   int      `json:"rules"`
	Control bool     `json:"control"`
	Entries int      `json:"entries"` // server's policy map entries with the large policy
	Samples []Sample `json:"samples"`
	Invalid int      `json:"invalid"` // samples whose probes did not show a clean change
	APIP50  float64  `json:"api_p50_ms"`
	APIP95  float64  `json:"api_p95_ms"`
	EnfP50  float64  `json:"enforced_p50_ms"`
	EnfP95  float64  `json:"enforced_p95_ms"`
	Revert  float64  `json:"revert_p50_ms"`
	CPUP50  float64  `json:"agent_cpu_p50_ms"`
}

// Check is one target evaluated.
type Check struct {
	Build string  `json:"build"`
	What  string  `json:"what"`
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Pass  bool    `json:"pass"`
}

// Report is what a run writes.
type Report struct {
	Started    time.Time `json:"started"`
	Kernel     string    `json:"kernel"`
	CPUs       int       `json:"cpus"`
	LoadStart  float64   `json:"load_start"`
	LoadEnd    float64   `json:"load_end"`
	Rounds     int       `json:"rounds"`
	Sizes      []int     `json:"sizes"`
	Format     Format    `json:"format"`
	Builds     []string  `json:"builds"`
	IntervalMs float64   `json:"probe_interval_ms"`
	Series     []Series  `json:"series"`
	Checks     []Check   `json:"checks"`
}

// Find returns the series of build, rule count and control flag, or nil.
func (r *Report) Find(build string, rules int, control bool) *Series {
	for i := range r.Series {
		s := &r.Series[i]
		if s.Build == build && s.Rules == rules && s.Control == control {
			return s
		}
	}
	return nil
}

// bench is one build's agent and endpoints.
type bench struct {
	build                     Build
	format                    Format
	agent                     *benchkit.Agent
	client                    *api.Client
	clientEp, server, bystand *benchkit.Endpoint
	listeners                 []net.Listener
}

// Run measures every series, Rounds samples each, in rotating order so that every series
// sees the same machine; it removes everything it made, also on error.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if cfg.Rounds < 1 || len(cfg.Sizes) == 0 || len(cfg.Builds) == 0 {
		return nil, errors.New("applylatency: need rounds, sizes and builds")
	}
	if cfg.Format == "" {
		cfg.Format = YAML
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Millisecond
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 100 * time.Millisecond
	}
	if cfg.PodCIDR.Bits() > 24-bitsFor(len(cfg.Builds)) {
		return nil, fmt.Errorf("applylatency: pod range %v too small for %d builds (one /24 each)", cfg.PodCIDR, len(cfg.Builds))
	}
	docs := map[int]string{}
	for _, n := range cfg.Sizes {
		b, err := LargePolicy(n, cfg.Format)
		if err != nil {
			return nil, err
		}
		docs[n] = string(b)
	}
	rep = &Report{Started: time.Now().UTC(), Kernel: benchkit.Kernel(), CPUs: runtime.NumCPU(),
		LoadStart: benchkit.LoadAverage(), Rounds: cfg.Rounds, Sizes: cfg.Sizes, Format: cfg.Format,
		IntervalMs: float64(cfg.Interval) / float64(time.Millisecond)}

	var daemons benchkit.Daemons
	var benches []*bench
	defer func() {
		for _, b := range benches {
			for _, ln := range b.listeners {
				ln.Close()
			}
			if b.client != nil {
				b.client.Close()
			}
			if serr := b.agent.Stop(); serr != nil && err == nil {
				err = fmt.Errorf("stopping agent %s: %w", b.agent.Instance, serr)
			}
		}
		if serr := daemons.StopAll(); serr != nil && err == nil {
			err = serr
		}
	}()
	for i, bd := range cfg.Builds {
		rep.Builds = append(rep.Builds, bd.Name)
		pods := netip.PrefixFrom(benchkit.AddAddr(cfg.PodCIDR.Masked().Addr(), uint32(i)<<8), 24)
		work := filepath.Join(cfg.WorkDir, bd.Name)
		if err := os.MkdirAll(work, 0o755); err != nil {
			return nil, err
		}
		b := &bench{build: bd, format: cfg.Format, agent: benchkit.NewAgent(bd.Rampartd, bd.Rampart, fmt.Sprintf("%s%d", cfg.Instance, i), work, pods)}
		b.agent.Flags = cfg.AgentFlags
		benches = append(benches, b)
		if err := b.setUp(ctx, &daemons, pods); err != nil {
			return nil, fmt.Errorf("build %s: %w", bd.Name, err)
		}
		cfg.Log("build %s: agent %s up, endpoints in %v", bd.Name, b.agent.Instance, pods)
	}

	type key struct {
		b       *bench
		rules   int
		control bool
	}
	var order []key
	for _, n := range cfg.Sizes {
		for _, b := range benches {
			for _, c := range []bool{false, true} {
				order = append(order, key{b, n, c})
			}
		}
	}
	series := map[key]*Series{}
	// One unrecorded apply per build and size: the first apply of a policy size pays for
	// identities and map growth once, and shows the map entry count.
	for _, k := range order {
		if k.control {
			continue
		}
		s, err := k.b.measure(ctx, cfg, docs[k.rules])
		if err != nil {
			return nil, fmt.Errorf("build %s, %d rules, warm-up: %w", k.b.build.Name, k.rules, err)
		}
		entries, err := k.b.entriesAfter(ctx, docs[k.rules])
		if err != nil {
			return nil, err
		}
		cfg.Log("build %s, %d rules: warm-up api %.1f ms, enforced %.1f ms, %d policy map entries", k.b.build.Name, k.rules, s.APIMs, s.EnforcedMs, entries)
		for _, c := range []bool{false, true} {
			series[key{k.b, k.rules, c}] = &Series{Build: k.b.build.Name, Rules: k.rules, Control: c, Entries: entries}
		}
	}
	for round := range cfg.Rounds {
		for i := range order {
			k := order[(i+round)%len(order)]
			s, err := k.b.measure(ctx, cfg, docs[k.rules])
			if err != nil {
				return nil, fmt.Errorf("build %s, %d rules, round %d: %w", k.b.build.Name, k.rules, round+1, err)
			}
			if !s.Valid {
				cfg.Log("build %s, %d rules: sample not counted: %s", k.b.build.Name, k.rules, s.Note)
			}
			se := series[k]
			se.Samples = append(se.Samples, s)
		}
		cfg.Log("round %d/%d done", round+1, cfg.Rounds)
	}
	for _, k := range order {
		se := series[k]
		summarize(se)
		rep.Series = append(rep.Series, *se)
	}
	rep.LoadEnd = benchkit.LoadAverage()
	rep.Checks = Evaluate(rep)
	return rep, nil
}

func bitsFor(n int) int {
	b := 0
	for 1<<b < n {
		b++
	}
	return b
}

func (b *bench) setUp(ctx context.Context, d *benchkit.Daemons, pods netip.Prefix) error {
	if err := b.agent.Start(ctx, d); err != nil {
		return fmt.Errorf("starting the agent: %w", err)
	}
	var err error
	mk := func(name, app string, n uint32) *benchkit.Endpoint {
		if err != nil {
			return nil
		}
		var ep *benchkit.Endpoint
		ep, err = b.agent.AddEndpoint(ctx, benchNamespace, name, []string{"app=" + app}, benchkit.HostAddr(pods, n))
		return ep
	}
	b.clientEp = mk("client", clientApp, 10)
	b.server = mk("server", serverApp, 11)
	b.bystand = mk("bystander", bystanderApp, 12)
	if err != nil {
		return err
	}
	for _, port := range []int{NewPort, OldPort} {
		ln, err := serve(b.server.API.Netns, port)
		if err != nil {
			return fmt.Errorf("server: %w", err)
		}
		b.listeners = append(b.listeners, ln)
	}
	b.client = api.NewClient(b.agent.Socket)
	if _, err := b.apply(ctx, OldPolicy(b.format)); err != nil {
		return fmt.Errorf("applying the one-rule policy: %w", err)
	}
	return nil
}

func (b *bench) apply(ctx context.Context, doc []byte) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	_, err := b.client.Apply(ctx, api.ApplyRequest{Documents: []api.Document{{Source: "applylatency", Data: string(doc)}}})
	return time.Since(t0), err
}

// entriesAfter applies doc, counts the server's policy map entries, and applies the
// one-rule policy back.
func (b *bench) entriesAfter(ctx context.Context, doc string) (int, error) {
	if _, err := b.apply(ctx, []byte(doc)); err != nil {
		return 0, err
	}
	n, err := b.agent.PolicyEntries(b.server.Name)
	if err != nil {
		return 0, err
	}
	if _, err := b.apply(ctx, OldPolicy(b.format)); err != nil {
		return 0, err
	}
	return n, nil
}

// measure applies doc over the one-rule policy while the client probes the server's
// NewPort (admitted only by doc's last rule) and OldPort (admitted only by the one-rule
// policy), then applies the one-rule policy back.
func (b *bench) measure(ctx context.Context, cfg Config, doc string) (Sample, error) {
	type result struct {
		att []Attempt
		err error
	}
	stop := make(chan struct{})
	results := make([]chan result, 2)
	probers := make([]*prober, 2)
	for i, port := range []uint16{NewPort, OldPort} {
		results[i] = make(chan result, 1)
		p := &prober{nsPath: b.clientEp.API.Netns, dst: netip.AddrPortFrom(b.server.IP, port),
			interval: cfg.Interval, timeout: cfg.AttemptTimeout}
		probers[i] = p
		go func(ch chan result) {
			att, err := p.run(stop)
			ch <- result{att, err}
		}(results[i])
	}
	// Lead-in: attempts before the call show the old policy in force.
	time.Sleep(30 * time.Millisecond)
	cpu0, cerr := cpuTime(b.agent.Pid())
	t0 := time.Now()
	_, err := b.client.Apply(ctx, api.ApplyRequest{Documents: []api.Document{{Source: "applylatency", Data: doc}}})
	t1 := time.Now()
	cpu1, cerr1 := cpuTime(b.agent.Pid())
	// The agent answers only after the dataplane holds the new policy: attempts started
	// after the answer must all show it. Wait until both probers have tried for a while
	// past the answer (their threads may not have run meanwhile on a loaded machine).
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		after := t1.Add(20 * time.Millisecond).UnixNano()
		if probers[0].last.Load() >= after && probers[1].last.Load() >= after {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(stop)
	var atts [2][]Attempt
	for i, ch := range results {
		r := <-ch
		if r.err != nil && err == nil {
			err = r.err
		}
		atts[i] = r.att
	}
	if err != nil {
		return Sample{}, err
	}
	s := analyze(t0, t1, atts[0], atts[1])
	if cerr != nil || cerr1 != nil {
		return Sample{}, fmt.Errorf("agent CPU time: %v %v", cerr, cerr1)
	}
	s.AgentCPUMs = ms(cpu1 - cpu0)
	rev, err := b.apply(ctx, OldPolicy(b.format))
	if err != nil {
		return Sample{}, fmt.Errorf("applying the one-rule policy back: %w", err)
	}
	s.RevertMs = ms(rev)
	return s, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// analyze turns the probes of one apply into a sample: the new flow must be dropped
// before t0 and connect from some point on; the old flow must connect before t0 and be
// dropped from some point on.
func analyze(t0, t1 time.Time, newAtt, oldAtt []Attempt) Sample {
	s := Sample{APIMs: ms(t1.Sub(t0)), Attempts: len(newAtt) + len(oldAtt), Valid: true}
	bad := func(note string) {
		if s.Valid {
			s.Valid, s.Note = false, note
		}
	}
	allowed := time.Time{}
	for _, a := range newAtt {
		if a.OK {
			if a.Start.Before(t0) {
				bad("the last rule's flow connected before the apply")
			}
			allowed = a.Start
			break
		}
	}
	if allowed.IsZero() {
		after := 0
		for _, a := range newAtt {
			if !a.Start.Before(t1) {
				after++
			}
		}
		bad(fmt.Sprintf("the last rule's flow never connected (%d attempts, %d after the answer)", len(newAtt), after))
	} else {
		for _, a := range newAtt {
			if a.Start.After(allowed) && !a.OK {
				bad("the last rule's flow dropped again after it connected")
				break
			}
		}
	}
	lastOK := -1
	okBefore := false
	for i, a := range oldAtt {
		if a.OK {
			lastOK = i
			if a.Start.Before(t0) {
				okBefore = true
			}
		}
	}
	if !okBefore {
		bad("the old flow did not connect before the apply")
	}
	denied := time.Time{}
	if lastOK+1 < len(oldAtt) {
		denied = oldAtt[lastOK+1].Start
	} else {
		okAfter := 0
		for _, a := range oldAtt {
			if a.OK && !a.Start.Before(t1) {
				okAfter++
			}
		}
		bad(fmt.Sprintf("the old flow still connects after the apply (%d of %d attempts after the answer, the last %.1f ms after it)",
			okAfter, len(oldAtt), ms(oldAtt[len(oldAtt)-1].Start.Sub(t1))))
	}
	if !allowed.IsZero() {
		s.AllowedMs = ms(allowed.Sub(t0))
	}
	if !denied.IsZero() {
		s.DeniedMs = ms(denied.Sub(t0))
	}
	s.EnforcedMs = max(s.AllowedMs, s.DeniedMs)
	return s
}

func summarize(s *Series) {
	var api, enf, rev, cpu []float64
	for _, x := range s.Samples {
		rev = append(rev, x.RevertMs)
		cpu = append(cpu, x.AgentCPUMs)
		if !x.Valid {
			s.Invalid++
			continue
		}
		api = append(api, x.APIMs)
		enf = append(enf, x.EnforcedMs)
	}
	s.APIP50, s.APIP95 = percentile(api, 50), percentile(api, 95)
	s.EnfP50, s.EnfP95 = percentile(enf, 50), percentile(enf, 95)
	s.Revert = percentile(rev, 50)
	s.CPUP50 = percentile(cpu, 50)
}

// percentile is the nearest-rank percentile (NaN for no values).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Evaluate checks the target for every build that measured TargetRules rules: the median
// time from the apply call to enforcement seen in packets.
func Evaluate(rep *Report) []Check {
	var out []Check
	for _, b := range rep.Builds {
		s := rep.Find(b, TargetRules, false)
		if s == nil {
			continue
		}
		out = append(out, Check{Build: b, What: fmt.Sprintf("%d rules: enforced p50 ms", TargetRules),
			Value: s.EnfP50, Limit: TargetMs, Pass: s.EnfP50 <= TargetMs})
	}
	return out
}
