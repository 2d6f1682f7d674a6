package egress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Config controls a run.
type Config struct {
	Quick   bool
	Counts  []int    // list sizes, ascending
	Filters []string // filters to run besides the baseline (empty: all)
	Repeats int      // pairs per filter and count
	// Durations of the iperf3 runs (whole seconds) and of the request/response run.
	TCPDuration, UDPDuration, CPUDuration, RRDuration time.Duration
	CPURate                                           string // iperf3 -b of the CPU run
	UDPLength                                         int    // iperf3 -l of the UDP runs
	PingCount                                         int
	PingInterval                                      time.Duration
	// Blocks splits each metric of a pair into this many short runs per side, alternating
	// between the filter's topology and the baseline (A B B A A B ...), so that slow
	// changes of the machine (steal time, other work) hit both sides alike.
	Blocks int
	// PingBlock is the most pings in one block: the latency run alternates sides more
	// often than the others (at least Blocks times), since a ping round trip of about 10 us
	// moves by tens of percent from one second to the next on a shared machine, and only
	// sides measured close together in time compare well.
	PingBlock int
	// ProbeInterval spaces the set-up probes: the resolution of the set-up time.
	ProbeInterval time.Duration
	// Budget is how long one filter may take at one count (set-up, measuring, removal);
	// a case predicted to take longer is skipped, one that does is stopped.
	Budget time.Duration
	// MemLimit is how much memory one filter may be predicted to need at one count (0: 60 %
	// of MemAvailable at the start).
	MemLimit int64
	Seed     uint64
	Mix      Mix
	// IPv6 runs every filter over IPv6: dual-stack topologies, lists of IPv6 prefixes drawn
	// with Mix6, traffic to the IPv6 addresses, paired with a no-filter baseline over IPv6.
	IPv6 bool
	Mix6 Mix6
	// CPU lists ("1", "0,1"; "" = not pinned) of the measured processes: iperf3, ping and
	// the request/response client on the client side, their servers on the other.
	ClientCPUs, ServerCPUs string
	Iptables               string // "legacy" or "nft"
	Rampartd, Rampart      string // agent and CLI binaries
	// AgentFlags are extra rampartd flags of the rampart filter's agent (e.g.
	// --attach=tcx). The agent-empty filter's agent always runs with --attach=tcx: it swaps
	// the programs of the agent's TCX links.
	AgentFlags []string
	// Self is a binary that runs the rr-server and rr-client subcommands (see Subcommand).
	Self   string
	OutDir string
	NoPlot bool
	Log    io.Writer // progress; nil: discarded
}

// DefaultCounts are the list sizes.
var DefaultCounts = []int{10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000}

// DefaultCounts6 are the list sizes over IPv6: up to 1M, which Rampart's IPv6 trie holds
// (MaxCount6).
var DefaultCounts6 = []int{10, 1_000, 100_000, 1_000_000}

// DefaultConfig is the full run: every filter at every count, three pairs each. See
// docs/benchmarks.md for how long it takes.
func DefaultConfig() Config {
	c := Config{
		Counts:        slices.Clone(DefaultCounts),
		Repeats:       3,
		TCPDuration:   3 * time.Second,
		UDPDuration:   3 * time.Second,
		CPUDuration:   3 * time.Second,
		RRDuration:    2 * time.Second,
		CPURate:       "1G",
		UDPLength:     1470,
		PingCount:     2000,
		PingInterval:  time.Millisecond,
		Blocks:        3,
		PingBlock:     100,
		ProbeInterval: time.Millisecond,
		Budget:        10 * time.Minute,
		Seed:          1,
		Mix:           DefaultMix,
		Mix6:          DefaultMix6,
		Iptables:      "legacy",
		OutDir:        "bench/results",
	}
	// Client and server on CPUs of their own, as on the two machines of the original
	// benchmark: the sender's CPU carries the whole path (its system calls, every filter,
	// the veth hops and forwarding run in its context, softirq included), the server's only
	// reads. Sharing one CPU would make the receiver compete with the sender, and UDP at an
	// unlimited rate would measure that contest instead of the filter.
	if n := runtime.NumCPU(); n >= 2 {
		c.ClientCPUs = "0"
		c.ServerCPUs = strconv.Itoa(n - 1)
	}
	return c
}

// QuickConfig is the smoke run for CI: two small counts, one pair, short runs.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Quick = true
	c.Counts = []int{10, 1000}
	c.Repeats = 1
	c.TCPDuration, c.UDPDuration, c.CPUDuration = time.Second, time.Second, time.Second
	c.RRDuration = 500 * time.Millisecond
	c.PingCount = 200
	c.Blocks = 1
	c.PingBlock = 200
	c.Budget = 3 * time.Minute
	return c
}

const (
	iperfPort     = 5201
	rrPort        = 5202
	readyTimeout  = 30 * time.Second
	checkTimeout  = 2 * time.Second
	reachTimeout  = 5 * time.Second // the listed address answering before set-up / after removal
	removeTimeout = 5 * time.Minute
	// Kernel memory is read once it has not moved by more than memSettleBytes over
	// memSettleStep (the previous filter's memory is freed after RCU grace periods), for at
	// most memSettleMax.
	memSettleStep  = 200 * time.Millisecond
	memSettleBytes = 1 << 20
	memSettleMax   = 10 * time.Second
)

// Subcommands are the helpers the benchmark runs inside the namespaces (benchkit.Helpers:
// the request/response server and client, and a TCP connection probe), and "report",
// which prints the table of a saved JSON report.
var Subcommands = []string{"rr-server", "rr-client", "probe", "report"}

// Subcommand runs subcommand name with args (the helpers: see benchkit.Helper).
//
//	report [--plot FILE.png] FILE.json   (prints the markdown table; redraws the plot)
func Subcommand(name string, args []string, stdout, stderr io.Writer) int {
	if name != "report" {
		return benchkit.Helper(name, args, stdout, stderr)
	}
	fs := benchkit.SubcommandFlags(name, stderr)
	plotPath := fs.String("plot", "", "also draw the report's plot into this PNG file")
	if fs.Parse(args) != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: egressbench report [--plot FILE.png] FILE.json")
		return 2
	}
	res, err := ReadResult(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "report: %v\n", err)
		return 1
	}
	res.WriteMarkdown(stdout)
	if *plotPath != "" {
		if err := WritePlot(res, *plotPath); err != nil {
			fmt.Fprintf(stderr, "report: plotting: %v\n", err)
			return 1
		}
	}
	return 0
}

type runner struct {
	cfg      Config
	log      io.Writer
	res      *Result
	daemons  benchkit.Daemons
	base     *topology // no filter
	work     string
	history  map[string][]caseCost // by filter, ascending counts
	failedAt map[string]string     // filter -> why larger counts are not tried
}

// caseCost is what one filter cost at one count, for predicting the next.
type caseCost struct {
	n                      int
	setup, measure, remove float64 // seconds
	// Memory in bytes: the kernel's growth with the set-up (noisy: other work on the
	// machine allocates too) and the user memory of the set-up command or daemon (exact).
	kernel, user int64
}

// Run measures every selected filter at every count and returns the report (also written
// to cfg.OutDir, the JSON after every count). Everything it creates is removed before it
// returns, also on error or when ctx is cancelled; a cancelled run returns what was
// measured so far.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the benchmark needs root (network namespaces, BPF, iptables)")
	}
	if err := benchkit.EnsureBPFFS(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, log: cfg.Log, history: map[string][]caseCost{}, failedAt: map[string]string{}}
	if r.log == nil {
		r.log = io.Discard
	}
	filters := cfg.Filters
	if len(filters) == 0 {
		filters = FilterNames[1:]
	}
	cidrs := benchkit.PodCIDRs(3)
	// Every topology has its own namespaces, so they can share the world's addresses: one
	// list (with one probe address) serves every filter.
	worldCIDR := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, cidrs[0].Addr().As4()[2], 0}), 24)
	probe, neighbour := worldAddrs(worldCIDR)
	if cfg.IPv6 {
		probe, neighbour = worldAddrs6(worldCIDR)
	}
	// The agent topology's server is a plain namespace in a range of its own (see addServer),
	// in 198.19.0.0/16 like the world's, which no drawn prefix overlaps.
	serverCIDR := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, cidrs[2].Addr().As4()[2], 0}), 24)
	instance := "eg" + benchkit.Suffix()
	memAvail := memAvailable()
	if cfg.MemLimit == 0 {
		cfg.MemLimit = memAvail * 6 / 10
		r.cfg.MemLimit = cfg.MemLimit
	}
	res = newResult(cfg, filters, cidrs, instance, probe, neighbour, memAvail)
	r.res = res

	if r.work, err = os.MkdirTemp("", "rp-egress-"); err != nil {
		return nil, err
	}
	var cleanups benchkit.Cleanups
	defer func() {
		// Clean-up must happen even when the run is being cancelled; servers first.
		var errs []error
		errs = append(errs, r.daemons.StopAll())
		errs = append(errs, cleanups.Run()...)
		errs = append(errs, os.RemoveAll(r.work))
		if cerr := errors.Join(errs...); cerr != nil {
			res.Errors = append(res.Errors, "clean-up: "+cerr.Error())
			err = errors.Join(err, cerr)
		}
		res.Finished = time.Now()
		res.Host.LoadEnd = benchkit.LoadAverage()
		summarize(res)
		if werr := r.write(res); werr != nil {
			err = errors.Join(err, werr)
		}
	}()
	fail := benchkit.FailFunc(res, &res.Errors)
	if res.Host.BPFStats, err = cleanups.BPFStatsOff(); err != nil {
		return fail(err)
	}
	res.Host.Versions["iperf3"] = version(ctx, "iperf3", "--version")
	res.Host.Versions["ping"] = version(ctx, "ping", "-V")

	if r.base, err = buildPlain("none", instance+"n", cidrs[0], worldCIDR, cfg.IPv6); err != nil {
		return fail(err)
	}
	cleanups.Add(r.base.Close)
	if err := r.startServers(r.base); err != nil {
		return fail(err)
	}

	fs, notAvailable, err := r.makeFilters(ctx, filters, instance, cidrs, serverCIDR, worldCIDR, &cleanups)
	if err != nil {
		return fail(err)
	}

	for _, n := range cfg.Counts {
		if ctx.Err() != nil {
			res.Incomplete = true
			return fail(fmt.Errorf("interrupted before %d prefixes: %w", n, ctx.Err()))
		}
		if err := r.runCount(ctx, n, filters, fs, notAvailable, probe); err != nil {
			if ctx.Err() != nil {
				res.Incomplete = true
			}
			return fail(err)
		}
		summarize(res)
		if _, err := res.WriteJSON(cfg.OutDir); err != nil {
			return fail(err)
		}
	}
	return res, nil
}

// newResult starts the report of a run with its settings: the pod ranges cidrs (none,
// peers, agent; with their IPv6 ones over IPv6) and the world's addresses.
func newResult(cfg Config, filters []string, cidrs []netip.Prefix, instance string, probe, neighbour netip.Addr, memAvail int64) *Result {
	res := &Result{
		Schema:  Schema,
		Started: time.Now(),
		Host: HostInfo{Machine: benchkit.ThisMachine(), LoadStart: benchkit.LoadAverage(),
			MemAvailableBytes: memAvail, Versions: map[string]string{}},
		Settings: Settings{
			Quick: cfg.Quick, Counts: cfg.Counts, Filters: append([]string{FilterNone}, filters...), Repeats: cfg.Repeats, Blocks: cfg.Blocks, PingBlock: cfg.PingBlock,
			TCPSeconds: cfg.TCPDuration.Seconds(), UDPSeconds: cfg.UDPDuration.Seconds(), CPUSeconds: cfg.CPUDuration.Seconds(),
			CPURate: cfg.CPURate, UDPLength: cfg.UDPLength, PingCount: cfg.PingCount, PingInterval: cfg.PingInterval.Seconds(),
			RRSeconds: cfg.RRDuration.Seconds(), ProbeInterval: cfg.ProbeInterval.Seconds(), BudgetSeconds: cfg.Budget.Seconds(),
			MemLimitBytes: cfg.MemLimit, Seed: cfg.Seed, Mix: cfg.Mix, ClientCPUs: cfg.ClientCPUs, ServerCPUs: cfg.ServerCPUs,
			Iptables: cfg.Iptables, Instance: instance, ProbeAddr: probe.String(), NeighbourAddr: neighbour.String(),
			PodCIDRs: map[string]string{"none": cidrs[0].String(), "peers": cidrs[1].String(), "agent": cidrs[2].String()},
			IPv6:     cfg.IPv6,
		},
	}
	if cfg.IPv6 {
		res.Settings.Mix6 = &cfg.Mix6
		for k, v := range map[string]netip.Prefix{"none": cidrs[0], "peers": cidrs[1], "agent": cidrs[2]} {
			res.Settings.PodCIDRs[k] += "," + range6Of(v, true).String()
		}
	}
	return res
}

// runCount generates the list of n prefixes and runs every filter on it. Errors of one
// filter are recorded in its result; only a broken baseline or an interruption ends the run.
func (r *runner) runCount(ctx context.Context, n int, filters []string, fs map[string]filter, notAvailable map[string]string, probe netip.Addr) error {
	t0 := time.Now()
	list, cr, lengths, err := r.generate(n, probe)
	if err != nil {
		return err
	}
	dir := filepath.Join(r.work, "count-"+strconv.Itoa(n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	listPath := filepath.Join(dir, "list.txt")
	if err := writeFile(listPath, func(w io.Writer) error { return list.WriteLines(w, "", "\n") }); err != nil {
		return err
	}
	if st, err := os.Stat(listPath); err == nil {
		cr.ListBytes = st.Size()
	}
	cr.GenerateSeconds = time.Since(t0).Seconds()
	fmt.Fprintf(r.log, "%s prefixes: %s and the probe address; generated in %.1f s\n", countText(n), lengths, cr.GenerateSeconds)

	base := FilterResult{Filter: FilterNone, Description: filterDescriptions[FilterNone], Status: StatusBaseline}
	var results []FilterResult
	for _, name := range filters {
		fr := FilterResult{Filter: name, Description: filterDescriptions[name]}
		switch {
		case notAvailable[name] != "":
			fr.Status, fr.Reason = StatusNotAvailable, notAvailable[name]
		case r.failedAt[name] != "":
			fr.Status, fr.Reason = StatusSkipped, r.failedAt[name]
		default:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.runFilter(ctx, fs[name], n, list, listPath, dir, &fr, &base)
		}
		fmt.Fprintf(r.log, "  %-9s %s\n", name, statusLine(fr))
		results = append(results, fr)
	}
	// A count where no filter ran still gets its baseline numbers.
	for len(base.Pairs) < r.cfg.Repeats {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		m, err := r.measure(ctx, r.base)
		if err != nil {
			return fmt.Errorf("measuring the baseline: %w", err)
		}
		base.Pairs = append(base.Pairs, Pair{Round: len(base.Pairs), Base: &m})
	}
	cr.Filters = append([]FilterResult{base}, results...)
	r.res.Counts = append(r.res.Counts, cr)
	return nil
}

// runFilter sets one filter up with the list, checks it, measures it in pairs with the
// baseline and removes it.
func (r *runner) runFilter(ctx context.Context, f filter, n int, list List, listPath, dir string, fr *FilterResult, base *FilterResult) {
	start := time.Now()
	defer func() { fr.WallSeconds = time.Since(start).Seconds() }()
	name := f.Name()
	if name == FilterControl || name == FilterEmptyTCX || name == FilterAgentEmpty {
		// None blocks anything: no set-up probe, measured like the A/A control.
		if name != FilterControl {
			if _, err := f.Install(ctx); err != nil {
				fr.Status, fr.Reason = StatusInvalid, err.Error()
				_ = f.Remove(ctx)
				return
			}
			defer func() {
				if err := f.Remove(ctx); err != nil {
					fr.Errors = append(fr.Errors, "removing: "+err.Error())
				}
			}()
		}
		r.runControl(ctx, f.Topology(), fr, base)
		return
	}
	if p := r.predict(name, n); p != nil {
		fr.Prediction = p
		var why string
		switch {
		case p.TotalSeconds > r.cfg.Budget.Seconds():
			why = fmt.Sprintf("predicted %.0f s (set-up %.0f s, measuring %.0f s, removal %.0f s, from %v) is over the %v budget",
				p.TotalSeconds, p.SetupSeconds, p.MeasureSeconds, p.RemoveSeconds, countsText(p.FromCounts), r.cfg.Budget)
		case p.MemoryBytes > r.memLimit():
			why = fmt.Sprintf("predicted %.1f GiB of memory (from %v) is over the %.1f GiB limit",
				float64(p.MemoryBytes)/(1<<30), countsText(p.FromCounts), float64(r.memLimit())/(1<<30))
		}
		if why != "" {
			fr.Status, fr.Reason = StatusSkipped, why
			r.failedAt[name] = "a smaller count was skipped: " + why
			return
		}
	}
	fail := func(status string, err error) {
		fr.Status = status
		fr.Reason = err.Error()
		if status == StatusFailed {
			r.failedAt[name] = fmt.Sprintf("failed at %s prefixes", countText(n))
		}
	}
	topo := f.Topology()
	if err := f.Prepare(ctx, list, listPath, dir); err != nil {
		fail(StatusInvalid, fmt.Errorf("preparing: %w", err))
		return
	}
	removed := false
	remove := func() error {
		if removed {
			return nil
		}
		removed = true
		t0 := time.Now()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
		defer cancel()
		err := f.Remove(rctx)
		fr.RemoveSeconds = time.Since(t0).Seconds()
		return err
	}
	defer func() {
		if err := remove(); err != nil {
			fr.Errors = append(fr.Errors, "removing: "+err.Error())
			fr.Status = StatusInvalid
		}
	}()

	// Set-up, timed by a stream of probes to the listed address.
	prober, err := StartProber(topo.Client.Netns, topo.addr(topo.World), r.cfg.ProbeInterval)
	if err != nil {
		fail(StatusInvalid, err)
		return
	}
	defer prober.Stop()
	if err := prober.WaitAnswered(reachTimeout); err != nil {
		fail(StatusInvalid, fmt.Errorf("the listed address is not reachable before set-up: %w", err))
		return
	}
	kernBefore, rssBefore := settledKernelMemory(), daemonRSS(f)
	stallBefore := readStalls()
	t0 := time.Now()
	sctx, cancel := context.WithTimeout(ctx, r.cfg.Budget)
	in, err := f.Install(sctx)
	cancel()
	cmdDone := time.Since(t0)
	setup := &Setup{CommandSeconds: cmdDone.Seconds(), Commands: in.Commands, Entries: in.Entries, ReportedBytes: in.Bytes, Report: in.Report}
	for _, c := range in.Commands {
		setup.PeakRSSBytes = max(setup.PeakRSSBytes, c.MaxRSSBytes)
	}
	if err != nil {
		fr.Setup = setup
		fail(StatusFailed, fmt.Errorf("set-up: %w", err))
		return
	}
	blocked, err := prober.WaitBlocked(t0, max(time.Minute, r.cfg.Budget-cmdDone), nil)
	setup.ProbesSent, setup.ProbesAnswered, setup.ProbeSendErrs = prober.Counts()
	prober.Stop()
	fr.Setup = setup
	if err != nil {
		fail(StatusInvalid, fmt.Errorf("enforcement: %w", err))
		return
	}
	setup.Seconds = blocked.Seconds()
	setup.StallMs = stallsSince(stallBefore)
	kernDelta, daemonDelta := settledKernelMemory()-kernBefore, daemonRSS(f)-rssBefore
	setup.MemoryBytes = kernDelta + daemonDelta
	if in.Entries >= 0 && in.Entries != list.Len() {
		fail(StatusInvalid, fmt.Errorf("the filter holds %d entries, the list has %d", in.Entries, list.Len()))
		return
	}
	fmt.Fprintf(r.log, "  %-9s set up in %.3f s (command %.3f s%s), %s\n", name, setup.Seconds, setup.CommandSeconds, stallNote(setup.StallMs), memNote(setup))

	measureStart := time.Now()
	if fr.Checks, err = r.checks(ctx, topo, true); err != nil {
		fail(StatusInvalid, err)
		return
	}
	if err := r.pairs(ctx, topo, fr, base); err != nil {
		fail(StatusInvalid, err)
		return
	}
	measured := time.Since(measureStart).Seconds()
	if err := remove(); err != nil {
		fr.Errors = append(fr.Errors, "removing: "+err.Error())
	}
	// Removal is checked too: the next filter must start from an open path.
	if err := r.reachable(ctx, topo); err != nil {
		fr.Errors = append(fr.Errors, "after removal: "+err.Error())
	} else {
		fr.Checks["listed address after removal"] = "answers"
	}
	fr.Status = StatusMeasured
	if len(fr.Errors) > 0 || len(fr.Pairs) == 0 {
		fr.Status = StatusInvalid
	}
	r.history[name] = append(r.history[name], caseCost{n: n, setup: setup.Seconds, measure: measured, remove: fr.RemoveSeconds,
		kernel: max(kernDelta, 0), user: max(setup.PeakRSSBytes, daemonDelta)})
}

// generate draws the list of n prefixes of the run's family, and returns it with the
// count's result (its lengths filled in) and the lengths as text for the log.
func (r *runner) generate(n int, probe netip.Addr) (List, CountResult, string, error) {
	cr := CountResult{Count: n}
	if r.cfg.IPv6 {
		l, err := Generate6(n, r.cfg.Mix6, r.cfg.Seed, probe)
		n32, n48, n128 := r.cfg.Mix6.Counts(n - 1)
		cr.Lengths6 = &Lengths6{N32: n32, N48: n48, N128: n128}
		return List{V6: l}, cr, fmt.Sprintf("%d /32, %d /48, %d /128", n32, n48, n128), err
	}
	l, err := Generate(n, r.cfg.Mix, r.cfg.Seed, probe)
	cr.N16, cr.N24, cr.N32 = r.cfg.Mix.Counts(n - 1)
	return List{V4: l}, cr, fmt.Sprintf("%d /16, %d /24, %d /32", cr.N16, cr.N24, cr.N32), err
}

// pairs measures the filter's topology paired with the baseline, cfg.Repeats times, and
// adds each baseline sample to the baseline row too.
func (r *runner) pairs(ctx context.Context, topo *topology, fr, base *FilterResult) error {
	for round := range r.cfg.Repeats {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted in round %d: %w", round+1, ctx.Err())
		}
		p, err := r.pair(ctx, topo, round)
		if err != nil {
			fr.Errors = append(fr.Errors, fmt.Sprintf("round %d: %v", round+1, err))
			continue
		}
		fr.Pairs = append(fr.Pairs, p)
		base.Pairs = append(base.Pairs, Pair{Round: len(base.Pairs), BaseFirst: p.BaseFirst, Base: p.Base})
	}
	return nil
}

// runControl measures the peers' topology with no filter, paired with the baseline as a
// filter is: an A/A test of the harness.
func (r *runner) runControl(ctx context.Context, topo *topology, fr, base *FilterResult) {
	var err error
	if fr.Checks, err = r.checks(ctx, topo, false); err != nil {
		fr.Status, fr.Reason = StatusInvalid, err.Error()
		return
	}
	if err := r.pairs(ctx, topo, fr, base); err != nil {
		fr.Status, fr.Reason = StatusInvalid, err.Error()
		return
	}
	fr.Status = StatusControl
	if len(fr.Errors) > 0 || len(fr.Pairs) == 0 {
		fr.Status = StatusInvalid
	}
}

// checks runs the enforcement checks: with a filter in place the listed address is
// blocked (without, it answers), its unlisted neighbour in the same namespace and the
// server are reachable.
func (r *runner) checks(ctx context.Context, t *topology, filtered bool) (map[string]string, error) {
	got := map[string]string{}
	var wrong []string
	for _, c := range []struct {
		name string
		to   netip.Addr
		want bool
	}{{"listed address", t.addr(t.World), !filtered}, {"unlisted neighbour", t.neighbour(), true}, {"server", t.addr(t.Server), true}} {
		ok, err := r.ping1(ctx, t, c.to)
		if err != nil {
			return got, err
		}
		got[c.name] = map[bool]string{true: "answers", false: "blocked"}[ok]
		if ok != c.want {
			wrong = append(wrong, fmt.Sprintf("%s %v %s", c.name, c.to, got[c.name]))
		}
	}
	out, err := r.tcpProbe(ctx, t, netip.AddrPortFrom(t.addr(t.Server), rrPort))
	if err != nil {
		return got, err
	}
	got["server TCP"] = out
	if out != benchkit.ProbeConnected {
		wrong = append(wrong, "server TCP "+out)
	}
	if len(wrong) > 0 {
		return got, fmt.Errorf("enforcement checks failed: %s", strings.Join(wrong, "; "))
	}
	return got, nil
}

// reachable checks that the listed address answers again (after removal).
func (r *runner) reachable(ctx context.Context, t *topology) error {
	deadline := time.Now().Add(reachTimeout)
	for {
		ok, err := r.ping1(ctx, t, t.addr(t.World))
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the listed address %v does not answer %v after the filter was removed", t.addr(t.World), reachTimeout)
		}
	}
}

// ping1 sends one echo request from the client and says whether it was answered.
func (r *runner) ping1(ctx context.Context, t *topology, to netip.Addr) (bool, error) {
	cmd := t.Client.Command(ctx, "ping", "-n", "-c", "1", "-W", strconv.Itoa(int(checkTimeout.Seconds())), to.String())
	out, err := cmd.CombinedOutput()
	if err == nil {
		return true, nil
	}
	var ee *exec.ExitError
	// ping exits 1 when no reply came (also when the sender's own stack refused to send,
	// as iptables DROP on OUTPUT makes it), 2 on other errors.
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		return false, nil
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if strings.Contains(string(out), "Operation not permitted") {
		return false, nil
	}
	return false, fmt.Errorf("ping %v: %w: %s", to, err, benchkit.Truncate(strings.TrimSpace(string(out)), 300))
}

// tcpProbe makes one TCP connection attempt from the client with the policy overhead
// benchmark's probe helper.
func (r *runner) tcpProbe(ctx context.Context, t *topology, to netip.AddrPort) (string, error) {
	out, err := benchkit.RunOutput(ctx, 30*time.Second, func(ctx context.Context) *exec.Cmd {
		return t.Client.Command(ctx, r.cfg.Self, "probe", "--addr", to.String(), "--timeout", "1s")
	})
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// pair measures the filter's topology and the baseline back to back. Each metric is run in
// cfg.Blocks short blocks per side, the sides alternating block by block in the order
// A B B A A B ... (A is the filter's topology in even rounds, the baseline in odd ones):
// the two sides of a ratio are then measured within seconds of each other, and a drift
// during the metric hits both alike. Blocks of one side are combined (throughputs over
// their total time, ping round trips pooled, request/response percentiles the median of
// the blocks').
func (r *runner) pair(ctx context.Context, t *topology, round int) (Pair, error) {
	p := Pair{Round: round, BaseFirst: round%2 == 1}
	a, b := t, r.base
	if p.BaseFirst {
		a, b = r.base, t
	}
	n := max(1, r.cfg.Blocks)
	order := func(i int) []*topology {
		if i%2 == 1 {
			return []*topology{b, a}
		}
		return []*topology{a, b}
	}
	var fm, bm Metrics
	side := func(x *topology) *Metrics {
		if x == r.base {
			return &bm
		}
		return &fm
	}
	// alternateN runs one block of metric what on each side, blocks times, in the pair's
	// order.
	alternateN := func(what string, blocks int, run func(x *topology) error) error {
		for i := range blocks {
			for _, x := range order(i) {
				if err := run(x); err != nil {
					return fmt.Errorf("%s: %s: %w", x.Name, what, err)
				}
			}
		}
		return nil
	}
	alternate := func(what string, run func(x *topology) error) error { return alternateN(what, n, run) }
	udp := []string{"-u", "-l", strconv.Itoa(r.cfg.UDPLength)}
	for _, k := range []struct {
		what  string
		d     time.Duration
		extra []string
		get   func(*Metrics) *Iperf
	}{
		{"TCP throughput", r.cfg.TCPDuration, nil, func(m *Metrics) *Iperf { return &m.TCP }},
		{"UDP throughput", r.cfg.UDPDuration, append(slices.Clone(udp), "-b", "0"), func(m *Metrics) *Iperf { return &m.UDP }},
		{"CPU at " + r.cfg.CPURate, r.cfg.CPUDuration, append(slices.Clone(udp), "-b", r.cfg.CPURate), func(m *Metrics) *Iperf { return &m.CPU }},
	} {
		blocks := map[*topology][]Iperf{}
		d := max(time.Second, (k.d / time.Duration(n)).Round(time.Second))
		err := alternate(k.what, func(x *topology) error {
			res, err := r.iperf(ctx, x, d, k.extra...)
			blocks[x] = append(blocks[x], res)
			return err
		})
		if err != nil {
			return p, err
		}
		for x, bs := range blocks {
			*k.get(side(x)) = combineIperf(bs)
		}
	}
	r.scaleCPU(&fm)
	r.scaleCPU(&bm)
	pings := map[*topology][]Ping{}
	pingBlocks := max(n, (r.cfg.PingCount+r.cfg.PingBlock-1)/r.cfg.PingBlock)
	count := max(1, r.cfg.PingCount/pingBlocks)
	err := alternateN("ping", pingBlocks, func(x *topology) error {
		res, err := r.ping(ctx, x, count)
		pings[x] = append(pings[x], res)
		return err
	})
	if err != nil {
		return p, err
	}
	rrs := map[*topology][]benchkit.RRResult{}
	d := max(250*time.Millisecond, r.cfg.RRDuration/time.Duration(n))
	err = alternate("request/response", func(x *topology) error {
		res, err := r.rr(ctx, x, d)
		rrs[x] = append(rrs[x], res)
		return err
	})
	if err != nil {
		return p, err
	}
	for _, x := range []*topology{a, b} {
		side(x).Ping = combinePing(pings[x])
		side(x).RR = combineRR(rrs[x])
	}
	p.Filter, p.Base = &fm, &bm
	return p, nil
}

// scaleCPU sets m.CPUPercent. CPU use is proportional to the packets sent: a sender that
// fell short of the rate (a slow filter, or other work on its CPU) is scaled to the rate,
// so that the number stays the cost of the traffic, not of how much of it got through.
func (r *runner) scaleCPU(m *Metrics) {
	if want, _ := parseRate(r.cfg.CPURate); m.CPU.SenderBps > 0 {
		m.CPUPercent = m.CPU.HostCPU * want / m.CPU.SenderBps
	}
}

// measure runs every metric once on topology t.
func (r *runner) measure(ctx context.Context, t *topology) (Metrics, error) {
	var m Metrics
	var err error
	udp := []string{"-u", "-l", strconv.Itoa(r.cfg.UDPLength)}
	if m.TCP, err = r.iperf(ctx, t, r.cfg.TCPDuration); err != nil {
		return m, fmt.Errorf("TCP throughput: %w", err)
	}
	if m.UDP, err = r.iperf(ctx, t, r.cfg.UDPDuration, append(udp, "-b", "0")...); err != nil {
		return m, fmt.Errorf("UDP throughput: %w", err)
	}
	if m.CPU, err = r.iperf(ctx, t, r.cfg.CPUDuration, append(udp, "-b", r.cfg.CPURate)...); err != nil {
		return m, fmt.Errorf("CPU at %s: %w", r.cfg.CPURate, err)
	}
	r.scaleCPU(&m)
	if m.Ping, err = r.ping(ctx, t, r.cfg.PingCount); err != nil {
		return m, fmt.Errorf("ping: %w", err)
	}
	if m.RR, err = r.rr(ctx, t, r.cfg.RRDuration); err != nil {
		return m, fmt.Errorf("request/response: %w", err)
	}
	return m, nil
}

// iperf runs the iperf3 client in t's client namespace against its server, retrying while
// the server is still busy with the previous run.
func (r *runner) iperf(ctx context.Context, t *topology, d time.Duration, extra ...string) (Iperf, error) {
	argv := append([]string{"iperf3", "-c", t.addr(t.Server).String(), "-p", strconv.Itoa(iperfPort),
		"-t", strconv.Itoa(int(math.Ceil(d.Seconds()))), "-J"}, extra...)
	argv = benchkit.Taskset(r.cfg.ClientCPUs, argv...)
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		before, err := benchkit.ReadCPUTimes()
		if err != nil {
			return Iperf{}, err
		}
		out, runErr := benchkit.RunOutput(ctx, d+r.cfg.Budget, func(ctx context.Context) *exec.Cmd {
			return t.Client.Command(ctx, argv...)
		})
		after, err := benchkit.ReadCPUTimes()
		if err != nil {
			return Iperf{}, err
		}
		res, err := parseIperf(out)
		if err == nil {
			for _, b := range benchkit.BusyPercent(before, after) {
				res.CPUBusy = append(res.CPUBusy, math.Round(b*10)/10)
			}
			return res, nil
		}
		if runErr != nil && len(out) == 0 {
			err = runErr
		}
		lastErr = err
		if !iperfRetryable(err) {
			break
		}
		select {
		case <-ctx.Done():
			return Iperf{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return Iperf{}, lastErr
}

// iperfRetryable says whether an iperf3 failure is one of its transient control channel
// errors (the server still busy with the previous run or restarting its listener, a reset
// control connection), after which the whole run is simply repeated.
func iperfRetryable(err error) bool {
	s := err.Error()
	for _, t := range []string{"busy", "unable to connect", "control message", "Connection reset by peer"} {
		if strings.Contains(s, t) {
			return true
		}
	}
	return false
}

// ping runs `ping -i INTERVAL -c count` from t's client to its server (an interval under
// 2 ms needs root).
func (r *runner) ping(ctx context.Context, t *topology, count int) (Ping, error) {
	argv := benchkit.Taskset(r.cfg.ClientCPUs, "ping", "-n", "-i", strconv.FormatFloat(r.cfg.PingInterval.Seconds(), 'f', -1, 64),
		"-c", strconv.Itoa(count), "-W", "1", t.addr(t.Server).String())
	out, err := benchkit.RunOutput(ctx, r.cfg.Budget, func(ctx context.Context) *exec.Cmd {
		return t.Client.Command(ctx, argv...)
	})
	p, perr := parsePing(out)
	if perr != nil {
		return p, errors.Join(perr, err)
	}
	// ping exits 1 when a reply was missing: that is loss, reported, not a failed run.
	return p, nil
}

// rr runs the request/response client in t's client namespace for d.
func (r *runner) rr(ctx context.Context, t *topology, d time.Duration) (benchkit.RRResult, error) {
	argv := benchkit.Taskset(r.cfg.ClientCPUs, r.cfg.Self, "rr-client", "--addr", netip.AddrPortFrom(t.addr(t.Server), rrPort).String(),
		"--duration", d.String())
	out, err := benchkit.RunOutput(ctx, d+r.cfg.Budget, func(ctx context.Context) *exec.Cmd {
		return t.Client.Command(ctx, argv...)
	})
	var rr benchkit.RRResult
	if err != nil {
		return rr, err
	}
	if err := json.Unmarshal(out, &rr); err != nil {
		return rr, fmt.Errorf("reading request/response result: %w", err)
	}
	if rr.Transactions == 0 {
		return rr, errors.New("no transactions")
	}
	return rr, nil
}

// startServers starts iperf3 and the request/response server in t's server namespace and
// waits until the client reaches both.
func (r *runner) startServers(t *topology) error {
	for _, s := range []struct {
		name string
		argv []string
	}{
		{"iperf3 server", []string{"iperf3", "-s", "-p", strconv.Itoa(iperfPort)}},
		{"rr server", []string{r.cfg.Self, "rr-server", "--listen", fmt.Sprintf(":%d", rrPort)}},
	} {
		if _, err := r.daemons.Start(s.name+" ("+t.Name+")", t.Server.Command(context.Background(), benchkit.Taskset(r.cfg.ServerCPUs, s.argv...)...)); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(readyTimeout)
	for _, port := range []uint16{iperfPort, rrPort} {
		for {
			out, err := r.tcpProbe(context.Background(), t, netip.AddrPortFrom(t.addr(t.Server), port))
			if err == nil && out == benchkit.ProbeConnected {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: server port %d not reachable within %v: %q %v", t.Name, port, readyTimeout, out, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// memLimit is the memory a case may be predicted to need: the configured limit, or less
// when other work on the machine has taken memory since the start.
func (r *runner) memLimit() int64 {
	return min(r.cfg.MemLimit, memAvailable()*8/10)
}

// memNoiseCount is the smallest count whose kernel memory growth is used to predict larger
// counts: below it, what other work on the machine allocates meanwhile is larger than what
// the filter does, and a tiny count's noise multiplied by a large count's size would skip
// filters that fit.
const memNoiseCount = 10_000

// maxPredictFactor is how far (count ratio) a prediction may extrapolate.
const maxPredictFactor = 100

// predict extrapolates a filter's cost at n from its last two counts (one: linearly). Set-up
// and memory grow at least linearly; measuring and removal as the history shows (iptables'
// per-packet walk makes measuring slower with every rule). Nil: no prediction (no history,
// or n more than maxPredictFactor times the last count).
func (r *runner) predict(name string, n int) *Prediction {
	h := r.history[name]
	if len(h) == 0 {
		return nil
	}
	last := h[len(h)-1]
	if n > maxPredictFactor*last.n {
		// Small counts are dominated by fixed costs (process start, the agent's tables):
		// from 10 prefixes to 10M, linear growth of those would predict hours. Such a
		// case runs, bounded by the budget's timeouts.
		return nil
	}
	var prev *caseCost
	if len(h) >= 2 {
		prev = &h[len(h)-2]
	}
	grow := func(get func(c caseCost) float64, minExp float64) float64 {
		k := minExp
		if prev != nil && get(*prev) > 0 && get(last) > 0 && prev.n < last.n {
			k = math.Log(get(last)/get(*prev)) / math.Log(float64(last.n)/float64(prev.n))
		}
		k = min(max(k, minExp), 2)
		return get(last) * math.Pow(float64(n)/float64(last.n), k)
	}
	p := &Prediction{
		SetupSeconds:   grow(func(c caseCost) float64 { return c.setup }, 1),
		MeasureSeconds: grow(func(c caseCost) float64 { return c.measure }, 0),
		RemoveSeconds:  grow(func(c caseCost) float64 { return c.remove }, 0),
	}
	// User memory (exact) linearly from the last count; kernel memory per prefix from the
	// last two counts large enough to show it, the smaller of the two (noise only adds).
	user := float64(last.user) * float64(n) / float64(last.n)
	perPrefix := math.Inf(1)
	for _, c := range h[max(0, len(h)-2):] {
		if c.n >= memNoiseCount {
			perPrefix = min(perPrefix, float64(c.kernel)/float64(c.n))
		}
	}
	if math.IsInf(perPrefix, 1) {
		perPrefix = 0
	}
	p.MemoryBytes = int64(user + perPrefix*float64(n))
	p.TotalSeconds = p.SetupSeconds + p.MeasureSeconds + p.RemoveSeconds
	for _, c := range h[max(0, len(h)-2):] {
		p.FromCounts = append(p.FromCounts, c.n)
	}
	return p
}

// write stores the JSON report, the markdown table and the plot.
func (r *runner) write(res *Result) (err error) {
	res.PlotPath, err = benchkit.WriteOutputs(res, r.cfg.OutDir, r.cfg.NoPlot, func(p string) error { return WritePlot(res, p) })
	return err
}

func (c *Config) validate() error {
	switch {
	case len(c.Counts) == 0:
		return errors.New("no counts")
	case c.Repeats < 1:
		return errors.New("repeats must be at least 1")
	case c.TCPDuration < time.Second || c.UDPDuration < time.Second || c.CPUDuration < time.Second:
		return errors.New("iperf3 durations must be at least 1 s")
	case c.RRDuration <= 0 || c.PingCount < 1 || c.PingBlock < 1 || c.PingInterval <= 0 || c.ProbeInterval <= 0:
		return errors.New("request/response duration, ping count, ping block and intervals must be positive")
	case c.Budget < 10*time.Second:
		return errors.New("the budget must be at least 10 s")
	case c.Iptables != "legacy" && c.Iptables != "nft":
		return fmt.Errorf("iptables backend %q: want legacy or nft", c.Iptables)
	case c.Self == "":
		return errors.New("no helper binary (Self) for the request/response server and client")
	case c.UDPLength < 64 || c.UDPLength > 65000:
		return errors.New("UDP length out of range")
	}
	if v, err := parseRate(c.CPURate); err != nil || v <= 0 {
		return fmt.Errorf("CPU rate %q: want a positive iperf3 rate such as 1G", c.CPURate)
	}
	if !slices.IsSorted(c.Counts) || c.Counts[0] < 1 {
		return errors.New("counts must be positive and ascending")
	}
	if last := c.Counts[len(c.Counts)-1]; c.IPv6 && last > MaxCount6 && (len(c.Filters) == 0 || slices.Contains(c.Filters, FilterRampart)) {
		return fmt.Errorf("over IPv6 the rampart filter holds at most %d prefixes (its IPv6 trie's capacity), not %s: lower --counts or leave rampart out of --filters", MaxCount6, countText(last))
	}
	for _, f := range c.Filters {
		if !slices.Contains(FilterNames[1:], f) && f != FilterEmptyTCX && f != FilterAgentEmpty {
			return fmt.Errorf("unknown filter %q (want some of %s)", f, strings.Join(FilterNames[1:], ","))
		}
		if f == FilterRampart && (c.Rampartd == "" || c.Rampart == "") {
			return errors.New("the rampart filter needs the rampartd and rampart binaries")
		}
	}
	if len(c.Filters) == 0 && (c.Rampartd == "" || c.Rampart == "") {
		return errors.New("the rampart filter needs the rampartd and rampart binaries")
	}
	for _, cpus := range []string{c.ClientCPUs, c.ServerCPUs} {
		if _, err := benchkit.ParseCPUList(cpus); err != nil {
			return err
		}
	}
	return nil
}

// toolMissing says why a peer cannot run here ("" when it can).
func toolMissing(name string, fam family, iptables string) string {
	ipt := fam.iptables + "-" + iptables
	var tools []string
	switch name {
	case FilterIptables:
		tools = []string{ipt, ipt + "-restore"}
	case FilterIpset:
		tools = []string{"ipset", ipt}
	case FilterNft:
		tools = []string{"nft"}
	}
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			return t + " not installed (scripts/setup.sh installs it)"
		}
	}
	return ""
}

// meminfo returns fields of /proc/meminfo (or of a process's status file, which has the
// same format) in bytes; missing ones are 0.
func meminfo(path string, keys ...string) map[string]int64 {
	out := map[string]int64{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && slices.Contains(keys, k) {
			var kb int64
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kb)
			out[k] = kb * 1024
		}
	}
	return out
}

// memAvailable returns MemAvailable in bytes (0 if unknown).
func memAvailable() int64 { return meminfo("/proc/meminfo", "MemAvailable")["MemAvailable"] }

// kernelMemory is what the kernel has allocated for itself: slab objects (netfilter rules
// and set elements, LPM trie nodes), vmalloc areas (x_tables blobs, ipset hash tables,
// large BPF maps) and per-CPU areas. Page cache is not in it, so writing the lists does not
// count.
func kernelMemory() int64 {
	m := meminfo("/proc/meminfo", "Slab", "VmallocUsed", "Percpu")
	return m["Slab"] + m["VmallocUsed"] + m["Percpu"]
}

// settledKernelMemory returns kernelMemory once it has settled.
func settledKernelMemory() int64 {
	deadline := time.Now().Add(memSettleMax)
	last := kernelMemory()
	for time.Now().Before(deadline) {
		time.Sleep(memSettleStep)
		now := kernelMemory()
		if d := now - last; d < memSettleBytes && d > -memSettleBytes {
			return now
		}
		last = now
	}
	return last
}

// daemonRSS is the resident memory of a filter's long-running process (Rampart's agent),
// 0 for filters without one.
func daemonRSS(f filter) int64 {
	d, ok := f.(interface{ daemonPid() int })
	if !ok || d.daemonPid() == 0 {
		return 0
	}
	return meminfo(fmt.Sprintf("/proc/%d/status", d.daemonPid()), "VmRSS")["VmRSS"]
}

func statusLine(f FilterResult) string {
	s := f.Summary
	switch f.Status {
	case StatusMeasured, StatusControl:
		s = summarizeFilter(&f)
		return fmt.Sprintf("TCP %.2f Gbit/s (x%.2f), UDP %.2f (x%.2f), CPU %.0f%% (x%.2f), ping p50 %.0f us (x%.2f), RR p50 %.0f us (x%.2f)",
			float64(s.TCPGbps), float64(s.TCPRatio), float64(s.UDPGbps), float64(s.UDPRatio), float64(s.CPUPercent), float64(s.CPURatio),
			float64(s.PingP50Us), float64(s.PingP50Ratio), float64(s.RRP50Us), float64(s.RRP50Ratio))
	case StatusInvalid:
		return fmt.Sprintf("INVALID: %s %s", f.Reason, strings.Join(f.Errors, "; "))
	}
	return f.Status + ": " + f.Reason
}

func memNote(s *Setup) string {
	note := fmt.Sprintf("memory %.1f MiB", float64(max(s.MemoryBytes, 0))/(1<<20))
	if s.PeakRSSBytes > 0 {
		note += fmt.Sprintf(", set-up peak RSS %.1f MiB", float64(s.PeakRSSBytes)/(1<<20))
	}
	if s.Entries >= 0 {
		note += fmt.Sprintf(", %d entries", s.Entries)
	}
	return note
}

func countsText(ns []int) string {
	var s []string
	for _, n := range ns {
		s = append(s, countText(n))
	}
	return strings.Join(s, " and ")
}

// makeFilters builds each filter with the topology it filters (the peers share one, each
// agent has its own) and starts the servers; what it creates goes into cleanups. A filter
// that cannot run here is in notAvailable with the reason.
func (r *runner) makeFilters(ctx context.Context, filters []string, instance string, cidrs []netip.Prefix, serverCIDR, worldCIDR netip.Prefix, cleanups *benchkit.Cleanups) (fs map[string]filter, notAvailable map[string]string, err error) {
	cfg := r.cfg
	var peers *topology
	fs, notAvailable = map[string]filter{}, map[string]string{}
	for _, name := range filters {
		switch name {
		case FilterControl, FilterIptables, FilterIpset, FilterNft, FilterLPM, FilterEmptyTCX:
			if peers == nil {
				if peers, err = buildPlain("peers", instance+"p", cidrs[1], worldCIDR, cfg.IPv6); err != nil {
					return nil, nil, err
				}
				cleanups.Add(peers.Close)
				if err := r.startServers(peers); err != nil {
					return nil, nil, err
				}
			}
			nb := netfilterBase{topo: peers, fam: familyOf(cfg.IPv6), iptables: cfg.Iptables, timeout: cfg.Budget}
			switch name {
			case FilterControl:
				fs[name] = &controlFilter{topo: peers}
			case FilterIptables:
				fs[name] = &iptablesFilter{netfilterBase: nb}
			case FilterIpset:
				fs[name] = &ipsetFilter{nb}
			case FilterNft:
				fs[name] = &nftFilter{nb}
			case FilterLPM:
				fs[name] = &lpmFilter{topo: peers}
			case FilterEmptyTCX:
				fs[name] = &emptyTCXFilter{topo: peers}
			}
			if why := toolMissing(name, familyOf(cfg.IPv6), cfg.Iptables); why != "" {
				notAvailable[name] = why
			}
		case FilterAgentEmpty:
			// An agent of its own (its namespaces are its own, so it can share the
			// addresses of the rampart filter's agent).
			rf, stop, err := startRampart(ctx, &r.cfg, &r.daemons, instance+"e", filepath.Join(r.work, "agent-empty"), cidrs[2], serverCIDR, worldCIDR, agentEmptyFlags)
			cleanups.Add(stop)
			if err != nil {
				return nil, nil, fmt.Errorf("starting the agent of %s: %w", name, err)
			}
			if err := r.startServers(rf.topo); err != nil {
				return nil, nil, err
			}
			fs[name] = &agentEmptyFilter{topo: rf.topo, agent: rf.agent}
		case FilterRampart:
			if why := rampartAvailable(ctx, cfg.Rampart); why != "" {
				notAvailable[name] = why
				fmt.Fprintf(r.log, "rampart: not available: %s\n", why)
				continue
			}
			rf, stop, err := startRampart(ctx, &r.cfg, &r.daemons, instance+"a", filepath.Join(r.work, "agent"), cidrs[2], serverCIDR, worldCIDR, r.cfg.AgentFlags)
			cleanups.Add(stop)
			if err != nil {
				return nil, nil, fmt.Errorf("starting the Rampart agent: %w", err)
			}
			if err := r.startServers(rf.topo); err != nil {
				return nil, nil, err
			}
			fs[name] = rf
		}
		if f := fs[name]; f != nil && notAvailable[name] == "" {
			if v := f.Version(ctx); v != "" {
				r.res.Host.Versions[name] = v
			}
		}
	}
	return fs, notAvailable, nil
}
