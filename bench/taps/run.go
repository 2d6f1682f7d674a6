package taps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/cluster"
	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/bench/l7"
	"github.com/rampartnet/rampart/bench/policyoverhead"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/monitor/suricata"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Config controls a run.
type Config struct {
	Quick bool
	// Repeats is the number of rounds; a round measures every case of a monitor phase once,
	// each as a pair with a no-tap sample right next to it.
	Repeats        int
	IperfSeconds   int           // iperf3 -t
	WebDuration    time.Duration // each fortio run
	WebConnections int           // fortio -c of the maximum-rate runs
	LatencyQPS     float64       // fortio -qps of the fixed-rate (latency) runs
	// SlowRules is the size of the slowed monitor's rule set: rules without a fast
	// pattern, so Suricata evaluates every one of them on every packet.
	SlowRules int
	Rampartd  string
	Rampart   string
	// Self runs the web server subcommand (see Subcommand) inside the server endpoint.
	Self     string
	Iperf3   string
	Fortio   string
	Suricata string // "" looks suricata up on PATH
	// CPU pins the measured processes (iperf3 and fortio, both ends) to this CPU; -1 for
	// no pinning. Suricata then runs on the other CPUs, as a monitor with CPUs of its own.
	CPU    int
	OutDir string
	NoPlot bool
	Log    io.Writer
}

// DefaultConfig is the full run: about eight minutes on a 2-core VM.
func DefaultConfig() Config {
	return Config{
		Repeats:        5,
		IperfSeconds:   2,
		WebDuration:    3 * time.Second,
		WebConnections: 8,
		LatencyQPS:     1000,
		SlowRules:      30,
		Iperf3:         "iperf3",
		Fortio:         "fortio",
		CPU:            runtime.NumCPU() - 1,
		OutDir:         "bench/results",
	}
}

// QuickConfig is the smoke run for CI: every case once, short runs.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Quick = true
	c.Repeats = 1
	c.IperfSeconds = 1
	c.WebDuration = time.Second
	return c
}

const (
	benchNamespace = "bench"
	monitorNS      = "sec"
	tunnel         = "vxlan" // the overlay between the nodes
	iperfPort      = 5201
	webPort        = 8080
	webPath        = "/v1" // what l7.ServeHTTP answers
	connectTimeout = 10 * time.Second
	statsTimeout   = 30 * time.Second
	flushTimeout   = 60 * time.Second // a monitor far behind works through its ring first
	latencyConns   = 4
)

// The nodes: A's (the tapped endpoint's, where every contract is added), the other B's,
// the other S's. Table II's placements put B and S on A's node or on these.
const (
	nodeA = cluster.NodeA
	nodeB = cluster.NodeB
	nodeS = 2
	nodes = 3
)

// caseDef is a case: how to measure it and which tap it adds for the measurement (none:
// the A/A control).
type caseDef struct {
	CaseResult
	tapArgs []string // rampart tap add arguments after the name; nil: no tap
	measure func(ctx context.Context) (Measurement, error)
	// steer hands the copies arriving in the monitor to its CPUs during the pair, as
	// `rampart monitor run --steer-copies` does (endpoint.SteerMonitorCopies).
	steer bool
}

// phase is a monitor configuration and the cases measured with it running.
type phase struct {
	name string
	// monitor is the monitor endpoint the phase's cases tap to; noMonitor runs the phase
	// with nothing reading its interfaces.
	monitor   *cluster.Pod
	noMonitor bool
	mode      suricata.Mode
	rules     []string
	cases     []*caseDef
}

type runner struct {
	cfg     Config
	log     io.Writer
	daemons benchkit.Daemons
	nodes   *cluster.AgentCluster
	// a is the client and b the servers, on A's node; bFar an iperf3 server on node B;
	// s and sFar the monitor endpoints on A's node and on node S.
	a, b, bFar, s, sFar *cluster.Pod
	monitor             *cluster.Pod // the running phase's
	mon                 *suricata.Monitor
	monitorCPUs         []int
	workDir             string
}

// Run measures every case and returns the report (also written to cfg.OutDir).
// Everything it creates is removed before it returns, also on error.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the benchmark needs root (network namespaces, BPF)")
	}
	suricataBin, err := suricata.Binary(cfg.Suricata)
	if err != nil {
		return nil, fmt.Errorf("the monitor: %w", err)
	}
	cfg.Suricata = suricataBin
	r := &runner{cfg: cfg, log: cfg.Log}
	if r.log == nil {
		r.log = io.Discard
	}
	if cfg.CPU >= 0 {
		for c := range runtime.NumCPU() {
			if c != cfg.CPU {
				r.monitorCPUs = append(r.monitorCPUs, c)
			}
		}
	}
	res = &Result{
		Schema:  Schema,
		Started: time.Now(),
		Host:    hostInfo(cfg),
		Settings: Settings{
			Quick: cfg.Quick, Repeats: cfg.Repeats, IperfSeconds: cfg.IperfSeconds, WebSeconds: cfg.WebDuration.Seconds(),
			WebConnections: cfg.WebConnections, LatencyQPS: cfg.LatencyQPS, CPU: cfg.CPU, MonitorCPUs: r.monitorCPUs,
			Instance: "tb" + benchkit.Suffix(), Nodes: nodes, Tunnel: tunnel,
			Monitor: "Suricata in passive mode (AF_PACKET on the monitor endpoint's tap-rx, one worker thread, " +
				"one content rule); inline cases: Suricata in AF_PACKET IPS mode between tap-rx and tap-tx",
			SlowMonitor: fmt.Sprintf("the same passive Suricata with %d pcre rules without a fast pattern, "+
				"evaluated on every packet", cfg.SlowRules),
			SlowRules: cfg.SlowRules,
		},
		Placements: placements(),
	}
	var cleanups benchkit.Cleanups
	defer func() {
		if r.mon != nil {
			if cerr := r.mon.Stop(); cerr != nil {
				res.Errors = append(res.Errors, "clean-up: stopping suricata: "+cerr.Error())
			}
		}
		if cerr := r.daemons.StopAll(); cerr != nil {
			res.Errors = append(res.Errors, "clean-up: "+cerr.Error())
		}
		// The agents stopped with the daemons; this uninstalls them.
		if r.nodes != nil {
			if cerr := r.nodes.Close(); cerr != nil {
				res.Errors = append(res.Errors, "clean-up: "+cerr.Error())
			}
		}
		res.Errors = append(res.Errors, benchkit.CleanupErrors(cleanups.Run())...)
		res.Finished = time.Now()
		res.Host.LoadEnd = benchkit.LoadAverage()
		summarize(res.Cases)
		if werr := r.write(res); werr != nil && err == nil {
			err = werr
		}
	}()
	fail := benchkit.FailFunc(res, &res.Errors)
	if res.Host.BPFStats, err = cleanups.BPFStatsOff(); err != nil {
		return fail(err)
	}
	if r.workDir, err = os.MkdirTemp("", "rp-bench-taps-"); err != nil {
		return fail(fmt.Errorf("creating work directory: %w", err))
	}
	cleanups.Add(func() error { return os.RemoveAll(r.workDir) })
	if err := benchkit.EnsureBPFFS(); err != nil {
		return fail(err)
	}
	if err := r.setup(ctx, res); err != nil {
		return fail(err)
	}
	phases := r.phases()
	for _, ph := range phases {
		for _, c := range ph.cases {
			res.Cases = append(res.Cases, c.CaseResult)
		}
	}

	// The cases of a phase share a monitor; the no-tap side of every pair runs with that
	// monitor idle, so a pair differs only by the tap.
	pairID := 0
	ci := 0
	for _, ph := range phases {
		r.monitor = ph.monitor
		undo := func() {}
		if ph.noMonitor {
			var err error
			if undo, err = r.discardCopies(ctx, ph.monitor); err != nil {
				return fail(err)
			}
		} else if err := r.startMonitor(ctx, ph); err != nil {
			return fail(err)
		}
		for round := range r.cfg.Repeats {
			for k := range ph.cases {
				// Rotate the order each round so no case always follows the same other one.
				idx := (k + round) % len(ph.cases)
				c := ph.cases[idx]
				if ctx.Err() != nil {
					res.Incomplete = true
					return fail(fmt.Errorf("interrupted in round %d: %w", round+1, ctx.Err()))
				}
				out := &res.Cases[ci+idx]
				s, err := r.steeredPair(ctx, c, round, pairID, pairID%2 == 1)
				pairID++
				if err != nil {
					out.Errors = append(out.Errors, fmt.Sprintf("round %d: %v", round+1, err))
					fmt.Fprintf(r.log, "round %d/%d %-22s error: %v\n", round+1, r.cfg.Repeats, c.Name, err)
					continue
				}
				out.Samples = append(out.Samples, s)
				fmt.Fprintf(r.log, "round %d/%d %-22s %s vs %s%s\n", round+1, r.cfg.Repeats, c.Name,
					out.text(s.Tap), out.text(s.Base), lostNote(s))
			}
		}
		ci += len(ph.cases)
		undo()
		if r.mon != nil {
			if err := r.mon.Stop(); err != nil {
				return fail(fmt.Errorf("stopping suricata (%s): %w", ph.name, err))
			}
			r.mon = nil
		}
	}
	return res, nil
}

func lostNote(s Sample) string {
	switch {
	case s.Counters == nil:
		return ""
	case s.Counters.RedirectedPackets > 0 && s.Monitor != nil:
		return fmt.Sprintf("  redirected %d, monitor passed %d dropped %d", s.Counters.RedirectedPackets, s.Monitor.Accepted, s.Monitor.Blocked)
	case s.Monitor == nil:
		return fmt.Sprintf("  mirrored %d, copies lost %d", s.Counters.MirroredPackets, s.Counters.CopiesLost)
	}
	remote := ""
	if s.Remote != nil {
		remote = fmt.Sprintf(", monitor's node delivered %d lost %d", s.Remote.Delivered, s.Remote.Lost)
	}
	return fmt.Sprintf("  mirrored %d, copies lost %d%s, monitor kernel drops %d of %d",
		s.Counters.MirroredPackets, s.Counters.CopiesLost, remote, s.Monitor.KernelDrops, s.Monitor.KernelPackets)
}

func (c *Config) validate() error {
	switch {
	case c.Repeats < 1:
		return errors.New("repeats must be at least 1")
	case c.IperfSeconds < 1:
		return errors.New("iperf3 duration must be at least 1 s")
	case c.WebDuration < time.Second:
		return errors.New("web duration must be at least 1 s")
	case c.WebConnections < 1 || c.LatencyQPS <= 0:
		return errors.New("web connections and latency rate must be positive")
	case c.SlowRules < 1:
		return errors.New("the slowed monitor needs at least one rule")
	case c.CPU >= runtime.NumCPU():
		return fmt.Errorf("CPU %d: this machine has %d", c.CPU, runtime.NumCPU())
	case c.Rampartd == "" || c.Rampart == "" || c.Self == "":
		return errors.New("need the rampartd, rampart and benchmark binaries")
	case c.Fortio == "" || c.Iperf3 == "":
		return errors.New("need iperf3 and fortio")
	}
	return nil
}

// phases are the monitor configurations with their cases, in order.
func (r *runner) phases() []phase {
	// B's web traffic: --port is the tapped endpoint's own port (docs/taps.md).
	webTap := func(action string) []string {
		return []string{"--endpoint", r.b.Name, "--monitor", r.s.Name, "--action", action,
			"--protocol", "TCP", "--port", strconv.Itoa(webPort)}
	}
	const passive = "Suricata, passive"
	passiveRules := []string{`alert tcp any any -> any any (msg:"rampart-attack"; content:"rampart-attack"; sid:1000001; rev:1;)`}
	mk := func(name, desc, metric, action, monitor string, target float64, pub *Published, tapArgs []string,
		measure func(context.Context) (Measurement, error)) *caseDef {
		return &caseDef{CaseResult: CaseResult{Name: name, Description: desc, Metric: metric, Action: action,
			Monitor: monitor, Target: target, Published: pub}, tapArgs: tapArgs, measure: measure}
	}
	// Table II mirrors A's outgoing traffic, as the paper's S "passively monitor[s]
	// outgoing traffic of A": all of it, which also lets flushStats's probe through.
	tableII := func(s *cluster.Pod) []string {
		return []string{"--endpoint", r.a.Name, "--monitor", s.Name, "--action", "mirror", "--direction", "egress"}
	}
	// placement is the case of a Table II row: iperf3 from A to its B, mirrored to its S.
	placement := func(name string, b, s *cluster.Pod, target float64) *caseDef {
		p := placementOf(name)
		return mk(name, "Table II, "+p.Name+": iperf3 A -> B, A's outgoing traffic mirrored to S", metricThroughput,
			"mirror", passive, target, p.Published, tableII(s), r.iperfTo(b))
	}
	onNode := placementOf(CaseMirrorThroughput)
	tableIII := &Published{Source: "FlowTap Table III", Baseline: 3195, Tap: 3004, Unit: "req/s", Ratio: 3004.0 / 3195}
	// steered is c with S's copies handed to S's CPUs (Suricata's).
	steered := func(c *caseDef) *caseDef {
		c.steer = true
		c.Description += "; the copies steered to the monitor's CPU (monitor run --steer-copies)"
		c.Monitor += ", copies steered to its CPU"
		return c
	}
	return []phase{
		{name: "no reader", monitor: r.s, noMonitor: true, cases: []*caseDef{
			mk(CaseMirrorNoReader, "iperf3 A -> B, A's outgoing traffic mirrored to S, whose interface discards the copies (a packet socket filter, no process): "+
				"the dataplane's share of the mirror's cost", metricThroughput, "mirror", "", 0, nil, tableII(r.s), r.iperfTo(r.b)),
		}},
		{name: "passive", monitor: r.s, mode: suricata.Passive, rules: passiveRules,
			cases: []*caseDef{
				mk(CaseAAThroughput, "A/A control: iperf3 A -> B, no tap on both sides of the pair", metricThroughput, "none", "", 0, nil, nil, r.iperfTo(r.b)),
				placement(CaseMirrorThroughput, r.b, r.s, TargetMirrorThroughput),
				placement(CaseMirrorBRemote, r.bFar, r.s, 0),
				mk(CaseAAWeb, "A/A control: web server B at its maximum rate (fortio in A), no tap on both sides", metricRate, "none", "", 0, nil, nil, r.webMax),
				mk(CaseMirrorWeb, "Table III: web server B at its maximum rate, its traffic mirrored to S", metricRate, "mirror", passive,
					TargetMirrorWeb, tableIII, webTap("mirror"), r.webMax),
				steered(mk(CaseMirrorThroughputSteered, "Table II, "+onNode.Name+": iperf3 A -> B, A's outgoing traffic mirrored to S", metricThroughput,
					"mirror", passive, TargetMirrorThroughput, onNode.Published, tableII(r.s), r.iperfTo(r.b))),
				steered(mk(CaseMirrorWebSteered, "Table III: web server B at its maximum rate, its traffic mirrored to S", metricRate, "mirror", passive,
					TargetMirrorWeb, tableIII, webTap("mirror"), r.webMax)),
			}},
		// The same passive Suricata in the monitor on node S: copies cross the overlay.
		{name: "remote", monitor: r.sFar, mode: suricata.Passive, rules: passiveRules,
			cases: []*caseDef{
				placement(CaseMirrorSRemote, r.b, r.sFar, 0),
				placement(CaseMirrorThreeNodes, r.bFar, r.sFar, 0),
			}},
		{name: "slow", monitor: r.s, mode: suricata.Passive, rules: slowRules(r.cfg.SlowRules),
			cases: []*caseDef{
				mk(CaseMirrorSlow, "iperf3 A -> B mirrored to a monitor that falls behind (heavy rule set): copies lost", metricThroughput,
					"mirror", "Suricata, passive, heavy rules", 0, nil, tableII(r.s), r.iperfTo(r.b)),
			}},
		{name: "inline", monitor: r.s, mode: suricata.IPS,
			rules: []string{`drop tcp any any -> any any (msg:"rampart-attack"; content:"rampart-attack"; sid:1000002; rev:1;)`},
			cases: []*caseDef{
				mk(CaseRedirectThroughput, "iperf3 A -> B redirected through Suricata inline (IPS) in S", metricThroughput, "redirect",
					"Suricata, IPS", 0, nil, []string{"--endpoint", r.a.Name, "--monitor", r.s.Name, "--action", "redirect"}, r.iperfTo(r.b)),
				mk(CaseRedirectLatency, fmt.Sprintf("requests to web server B at %.0f/s redirected through Suricata inline: p50/p90/p99", r.cfg.LatencyQPS),
					metricLatency, "redirect", "Suricata, IPS", 0, nil, webTap("redirect"), r.webFixed),
			}},
	}
}

// slowRules are n rules without a content (so no fast pattern prefilters them): each runs
// its regular expression over every packet's payload.
func slowRules(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`alert tcp any any -> any any (msg:"slow %d"; pcre:"/z%04d[a-f]{8}/"; sid:%d; rev:1;)`, i, i, 2000000+i)
	}
	return out
}

// setup starts the nodes (agents in node namespaces joined by a fabric, VXLAN between
// them, as the cluster benchmark's agent control plane makes them) with endpoints A
// (client), B (servers) and monitor S on node A, a second B on node B and a second S on
// node S, each declared on the other nodes.
func (r *runner) setup(ctx context.Context, res *Result) error {
	inst := res.Settings.Instance
	fmt.Fprintf(r.log, "starting %d nodes (instances %sa..., tunnel %s)\n", nodes, inst, tunnel)
	var err error
	r.nodes, err = cluster.NewAgentNodes(ctx, cluster.AgentBinaries{Rampartd: r.cfg.Rampartd, Rampart: r.cfg.Rampart},
		tunnel, inst, nodes, &r.daemons)
	if err != nil {
		return fmt.Errorf("starting the nodes: %w", err)
	}
	pods, err := r.nodes.AddPods(ctx, []cluster.PodSpec{
		{Node: nodeA, Namespace: benchNamespace, Name: "a", Labels: []string{"app=a"}},
		{Node: nodeA, Namespace: benchNamespace, Name: "b", Labels: []string{"app=b"}},
		{Node: nodeB, Namespace: benchNamespace, Name: "b-far", Labels: []string{"app=b"}},
		{Node: nodeA, Namespace: monitorNS, Name: "s", Labels: []string{"app=s"}, Monitor: true},
		{Node: nodeS, Namespace: monitorNS, Name: "s-far", Labels: []string{"app=s"}, Monitor: true},
	})
	if err != nil {
		return err
	}
	r.a, r.b, r.bFar, r.s, r.sFar = pods[0], pods[1], pods[2], pods[3], pods[4]
	for _, p := range pods {
		res.Settings.Endpoints = append(res.Settings.Endpoints, EndpointInfo{Name: p.Name, Node: cluster.NodeName(p.Node), IP: p.IP.String(), MTU: p.MTU})
	}
	for _, b := range []*cluster.Pod{r.b, r.bFar} {
		if _, err := r.daemons.Start("iperf3 server", b.Command(context.Background(),
			r.pin(r.cfg.Iperf3, "-s", "-p", strconv.Itoa(iperfPort))...)); err != nil {
			return err
		}
	}
	if _, err := r.daemons.Start("web server", r.b.Command(context.Background(),
		r.pin(r.cfg.Self, "http-server", "--listen", fmt.Sprintf(":%d", webPort))...)); err != nil {
		return err
	}
	return r.waitServer(ctx, netip.AddrPortFrom(r.b.IP, webPort))
}

// cli runs the CLI against the agent of A's node, where every contract is added.
func (r *runner) cli(ctx context.Context, args ...string) ([]byte, error) {
	return r.nodes.Agent(nodeA).CLI(ctx, time.Minute, args...)
}

// waitServer polls until the server accepts a connection from A.
func (r *runner) waitServer(ctx context.Context, addr netip.AddrPort) error {
	deadline := time.Now().Add(connectTimeout)
	for {
		out, err := benchkit.RunOutput(ctx, 30*time.Second, func(ctx context.Context) *exec.Cmd {
			return r.a.Command(ctx, r.cfg.Self, "probe", "--addr", addr.String())
		})
		if err == nil && strings.TrimSpace(string(out)) == benchkit.ProbeConnected {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("web server %s not reachable from A: %s %v", addr, out, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// discardCopies makes monitor s read its copies without a process: a packet socket on
// its receive interface whose filter discards each copy in the kernel. The agent counts a
// monitor that nothing reads as down and makes no copies for it, so the dataplane's share
// of the mirror's cost is measured with this reader that costs next to nothing. undo
// closes the socket.
func (r *runner) discardCopies(ctx context.Context, s *cluster.Pod) (undo func(), err error) {
	fd := -1
	err = endpoint.Do(s.Netns, func() error {
		l, err := net.InterfaceByName(endpoint.MonitorRxIfName)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		drop := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}} // accept 0 bytes: discard
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: 1, Filter: &drop[0]}); err != nil {
			return fmt.Errorf("socket filter: %w", err)
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: l.Index})
	})
	undo = func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	if err != nil {
		undo()
		return nil, fmt.Errorf("discarding %s's copies: %w", s.Name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := api.NewClient(r.nodes.Agent(s.Node).Socket).WaitMonitorReading(wctx, s.Name); err != nil {
		undo()
		return nil, fmt.Errorf("discarding %s's copies: %w", s.Name, err)
	}
	return undo, nil
}

// htons is v in network byte order, as the packet socket's protocol is given.
func htons(v uint16) uint16 { return v<<8 | v>>8 }

// startMonitor starts the phase's Suricata in S on the CPUs the measured processes do not
// use.
func (r *runner) startMonitor(ctx context.Context, ph phase) error {
	dir, err := os.MkdirTemp(r.workDir, "suricata-"+ph.name+"-")
	if err != nil {
		return err
	}
	fmt.Fprintf(r.log, "starting suricata (%s, %d rules) in %s on %s\n", ph.name, len(ph.rules), ph.monitor.Name, cluster.NodeName(ph.monitor.Node))
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	m, err := suricata.Start(sctx, suricata.Config{Mode: ph.mode, Netns: ph.monitor.Netns, Interface: "tap-rx",
		PeerInterface: "tap-tx", Dir: dir, Rules: ph.rules, Binary: r.cfg.Suricata, StartTimeout: 90 * time.Second})
	if err != nil {
		return fmt.Errorf("starting suricata (%s): %w", ph.name, err)
	}
	r.mon = m
	if len(r.monitorCPUs) > 0 {
		if err := benchkit.PinProcess(m.Pid(), r.monitorCPUs); err != nil {
			return fmt.Errorf("pinning suricata: %w", err)
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := api.NewClient(r.nodes.Agent(ph.monitor.Node).Socket).WaitMonitorReading(wctx, ph.monitor.Name); err != nil {
		return fmt.Errorf("suricata (%s): %w", ph.name, err)
	}
	// Its counters are published once a second: wait for the first.
	_, err = r.settledStats(ctx)
	return err
}

// steeredPair is pair with the monitor's copies steered to its CPUs while it runs, when
// case c says so.
func (r *runner) steeredPair(ctx context.Context, c *caseDef, round, pairID int, tapFirst bool) (Sample, error) {
	if !c.steer {
		return r.pair(ctx, c, round, pairID, tapFirst)
	}
	if len(r.monitorCPUs) == 0 {
		return Sample{}, errors.New("steering the copies needs the monitor on CPUs of its own (--cpu)")
	}
	if err := endpoint.SteerMonitorCopies(r.monitor.Netns, r.monitorCPUs); err != nil {
		return Sample{}, err
	}
	s, err := r.pair(ctx, c, round, pairID, tapFirst)
	return s, errors.Join(err, endpoint.SteerMonitorCopies(r.monitor.Netns, nil))
}

// pair measures case c with its tap and without, back to back, in the order tapFirst says.
func (r *runner) pair(ctx context.Context, c *caseDef, round, pairID int, tapFirst bool) (s Sample, err error) {
	s.Round, s.Pair, s.TapFirst = round, pairID, tapFirst
	base := func() (err error) {
		s.Base, err = c.measure(ctx)
		return err
	}
	withTap := func() error {
		if c.tapArgs == nil {
			var err error
			s.Tap, err = c.measure(ctx)
			return err
		}
		return r.tapped(ctx, c, pairID, &s)
	}
	steps := []func() error{base, withTap}
	if tapFirst {
		steps[0], steps[1] = steps[1], steps[0]
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return s, err
		}
	}
	return s, nil
}

// tapped adds the case's tap contract, measures, reads its counters and the monitor's (and
// those of the monitor's node, when it is another), and deletes the contract again. A run
// whose tap did not act (nothing mirrored or redirected) is an error, not a sample: the
// tap must have been in the path it claims to measure.
func (r *runner) tapped(ctx context.Context, c *caseDef, pairID int, s *Sample) (err error) {
	var before, after suricata.CaptureStats
	var rxBefore uint64
	if r.mon != nil {
		// What arrived on its interfaces first: Suricata's counters then include at
		// least that.
		if rxBefore, err = monitorRx(r.monitor.Netns); err != nil {
			return err
		}
		if before, err = r.mon.Stats(ctx); err != nil {
			return fmt.Errorf("reading suricata counters: %w", err)
		}
	}
	remote := r.monitor.Node != nodeA
	var delivered, lost uint64
	if remote {
		if delivered, lost, err = r.nodes.Agent(r.monitor.Node).TapRemoteCounters(ctx); err != nil {
			return err
		}
	}
	name := fmt.Sprintf("%s-%d", c.Name, pairID)
	if _, err := r.cli(ctx, append([]string{"tap", "add", name}, c.tapArgs...)...); err != nil {
		return fmt.Errorf("adding tap: %w", err)
	}
	deleted := false
	defer func() {
		if deleted {
			return
		}
		if _, derr := r.cli(context.WithoutCancel(ctx), "tap", "delete", name); derr != nil {
			err = errors.Join(err, fmt.Errorf("deleting tap: %w", derr))
		}
	}()
	if s.Tap, err = c.measure(ctx); err != nil {
		return err
	}
	if r.mon != nil {
		if after, err = r.flushStats(ctx, before, rxBefore); err != nil {
			return err
		}
	}
	out, err := r.cli(ctx, "tap", "get", name, "-o", "json")
	if err != nil {
		return fmt.Errorf("reading tap: %w", err)
	}
	var tp api.Tap
	if err := json.Unmarshal(out, &tp); err != nil {
		return fmt.Errorf("reading tap: %w", err)
	}
	if tp.Counters == nil {
		return fmt.Errorf("tap %s has no counters (monitor problem: %q)", name, tp.MonitorProblem)
	}
	s.Counters = &TapCounters{MirroredPackets: tp.Counters.MirroredPackets, RedirectedPackets: tp.Counters.RedirectedPackets,
		DroppedByMonitor: tp.Counters.DroppedByMonitor, CopiesLost: tp.Counters.CopiesLost}
	if remote {
		// The contract must have found its monitor on the other node, not a namesake here.
		if want := cluster.NodeName(r.monitor.Node); tp.MonitorNode != want {
			return fmt.Errorf("tap %s: monitor node %q, want %q (monitor problem: %q)", name, tp.MonitorNode, want, tp.MonitorProblem)
		}
		d, l, err := r.nodes.Agent(r.monitor.Node).TapRemoteCounters(ctx)
		if err != nil {
			return err
		}
		s.Remote = &RemoteCounters{Delivered: d - delivered, Lost: l - lost}
	}
	deleted = true
	if _, err := r.cli(ctx, "tap", "delete", name); err != nil {
		return fmt.Errorf("deleting tap: %w", err)
	}
	if r.mon == nil {
		if s.Counters.MirroredPackets+s.Counters.RedirectedPackets == 0 {
			return fmt.Errorf("tap %s mirrored and redirected nothing: the tap was not in the path", name)
		}
		return nil
	}
	s.Monitor = &MonitorRun{KernelPackets: after.KernelPackets - before.KernelPackets, KernelDrops: after.KernelDrops - before.KernelDrops,
		Accepted: after.Accepted - before.Accepted, Blocked: after.Blocked - before.Blocked}
	switch c.Action {
	case "mirror":
		if s.Counters.MirroredPackets == 0 || s.Monitor.KernelPackets+s.Monitor.KernelDrops == 0 ||
			(s.Remote != nil && s.Remote.Delivered == 0) {
			return fmt.Errorf("tap %s mirrored %d packets, monitor saw %d (%+v on its node): the tap was not in the path", name,
				s.Counters.MirroredPackets, s.Monitor.KernelPackets, s.Remote)
		}
	case "redirect":
		// Inline, Suricata counts what it passed on (ips.accepted) and dropped.
		if s.Counters.RedirectedPackets == 0 || s.Monitor.Accepted+s.Monitor.Blocked == 0 {
			return fmt.Errorf("tap %s redirected %d packets, monitor passed %d: the tap was not in the path", name,
				s.Counters.RedirectedPackets, s.Monitor.Accepted)
		}
	}
	return nil
}

// settledStats waits for Suricata's first published counters after it starts.
func (r *runner) settledStats(ctx context.Context) (suricata.CaptureStats, error) {
	deadline := time.Now().Add(statsTimeout)
	for {
		cur, err := r.mon.Stats(ctx)
		if err == nil {
			return cur, nil
		}
		if time.Now().After(deadline) {
			return cur, fmt.Errorf("reading suricata counters: %w", err)
		}
		select {
		case <-ctx.Done():
			return cur, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// flushStats returns Suricata's counters once they count every packet that arrived on the
// monitor's interfaces since rxBefore (their kernel counters, monitorRx). Its capture
// thread publishes them only while packets arrive (once a second), so the last second of a
// run shows up only with later traffic: flushStats sends some, a connection from A to B's
// web port through the tap still in place, once a second until the counters have caught
// up with what had arrived before that probe (statsCaughtUp), for at most flushTimeout.
// The probes' few packets are counted with the run.
func (r *runner) flushStats(ctx context.Context, before suricata.CaptureStats, rxBefore uint64) (suricata.CaptureStats, error) {
	deadline := time.Now().Add(flushTimeout)
	for {
		rx, err := monitorRx(r.monitor.Netns)
		if err != nil {
			return before, err
		}
		if _, err := benchkit.RunOutput(ctx, 10*time.Second, func(ctx context.Context) *exec.Cmd {
			return r.a.Command(ctx, r.cfg.Self, "probe", "--addr", netip.AddrPortFrom(r.b.IP, webPort).String())
		}); err != nil {
			return before, fmt.Errorf("flushing suricata counters: %w", err)
		}
		select {
		case <-ctx.Done():
			return before, ctx.Err()
		case <-time.After(1100 * time.Millisecond):
		}
		cur, err := r.mon.Stats(ctx)
		if err != nil {
			return before, fmt.Errorf("reading suricata counters: %w", err)
		}
		if statsCaughtUp(before, cur, rxBefore, rx) {
			return cur, nil
		}
		if time.Now().After(deadline) {
			return cur, fmt.Errorf("suricata counted %d packets %v after the run, %d arrived on its interfaces",
				captured(cur)-captured(before), flushTimeout, rx-rxBefore)
		}
	}
}

// captured is what arrived at Suricata's capture sockets: kernel_packets, the sockets'
// PACKET_STATISTICS tp_packets, which includes what they dropped for want of room
// (kernel_drops).
func captured(c suricata.CaptureStats) uint64 { return c.KernelPackets }

// statsCaughtUp says whether Suricata's counters cur, since before, count every packet
// that arrived on the monitor's interfaces between their readings rxBefore and rx.
func statsCaughtUp(before, cur suricata.CaptureStats, rxBefore, rx uint64) bool {
	return captured(cur) >= captured(before) && captured(cur)-captured(before) >= rx-rxBefore
}

// monitorRx is how many packets arrived on the monitor's interfaces (tap-rx and tap-tx in
// its namespace at nsPath), from their kernel counters.
func monitorRx(nsPath string) (uint64, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return 0, fmt.Errorf("opening the monitor's namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return 0, fmt.Errorf("netlink in the monitor's namespace: %w", err)
	}
	defer h.Close()
	var n uint64
	for _, name := range []string{"tap-rx", "tap-tx"} {
		l, err := h.LinkByName(name)
		if err != nil {
			return 0, fmt.Errorf("reading the monitor's %s: %w", name, err)
		}
		if st := l.Attrs().Statistics; st != nil {
			n += st.RxPackets
		}
	}
	return n, nil
}

// pin prefixes argv with taskset when the measured processes are pinned.
func (r *runner) pin(argv ...string) []string {
	if r.cfg.CPU < 0 {
		return argv
	}
	return append([]string{"taskset", "-c", strconv.Itoa(r.cfg.CPU)}, argv...)
}

// iperfTo measures one iperf3 client in A against server b, retrying while the server is
// starting.
func (r *runner) iperfTo(b *cluster.Pod) func(context.Context) (Measurement, error) {
	return func(ctx context.Context) (Measurement, error) { return r.iperf(ctx, b) }
}

func (r *runner) iperf(ctx context.Context, b *cluster.Pod) (Measurement, error) {
	deadline := time.Now().Add(connectTimeout)
	for {
		out, runErr := benchkit.RunOutput(ctx, time.Duration(r.cfg.IperfSeconds)*time.Second+30*time.Second, func(ctx context.Context) *exec.Cmd {
			return r.a.Command(ctx, r.pin(r.cfg.Iperf3, "-c", b.IP.String(), "-p", strconv.Itoa(iperfPort),
				"-t", strconv.Itoa(r.cfg.IperfSeconds), "-J")...)
		})
		res, err := policyoverhead.ParseIperf(out)
		if err == nil {
			return Measurement{Iperf: &res}, nil
		}
		if runErr != nil && len(out) == 0 {
			err = runErr
		}
		if !policyoverhead.IperfRetryable(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return Measurement{}, fmt.Errorf("iperf3: %w", err)
		}
		select {
		case <-ctx.Done():
			return Measurement{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// webMax runs fortio in A against B's web server as fast as its connections go.
func (r *runner) webMax(ctx context.Context) (Measurement, error) {
	return r.web(ctx, 0, r.cfg.WebConnections)
}

// webFixed runs fortio at the fixed latency rate.
func (r *runner) webFixed(ctx context.Context) (Measurement, error) {
	return r.web(ctx, r.cfg.LatencyQPS, latencyConns)
}

func (r *runner) web(ctx context.Context, qps float64, conns int) (Measurement, error) {
	url := fmt.Sprintf("http://%s%s", netip.AddrPortFrom(r.b.IP, webPort), webPath)
	argv := r.pin(r.cfg.Fortio, "load", "-qps", strconv.FormatFloat(qps, 'f', 0, 64), "-c", strconv.Itoa(conns),
		"-t", r.cfg.WebDuration.String(), "-uniform", "-r", "0.00001", "-p", "50,90,99",
		"-loglevel", "Error", "-log-errors=false", "-json", "-", url)
	out, err := benchkit.RunOutput(ctx, r.cfg.WebDuration+time.Minute, func(ctx context.Context) *exec.Cmd {
		return r.a.Command(ctx, argv...)
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("fortio: %w", err)
	}
	run, err := l7.ParseFortio(out)
	if err != nil {
		return Measurement{}, err
	}
	if run.Errors > 0 {
		return Measurement{}, fmt.Errorf("fortio: %d of %d responses not 200 (%v)", run.Errors, run.Requests, run.RetCodes)
	}
	run.Histogram = nil // the percentiles are kept; the buckets would only bloat the report
	return Measurement{Web: &run}, nil
}

// write stores the JSON report, the markdown table and the plot.
func (r *runner) write(res *Result) error {
	plot := func(path string) error {
		if r.cfg.NoPlot {
			return nil
		}
		res.PlotPath = path
		return WritePlot(res, path)
	}
	base, err := benchkit.WriteReport(r.cfg.OutDir, res.baseName(), res, res.Table(), plot)
	if err != nil {
		return err
	}
	res.JSONPath = base + ".json"
	return nil
}

func hostInfo(cfg Config) HostInfo {
	h := HostInfo{Machine: benchkit.ThisMachine(), LoadStart: benchkit.LoadAverage()}
	if out, err := exec.Command(cfg.Iperf3, "--version").Output(); err == nil {
		h.Iperf3, _, _ = strings.Cut(string(out), "\n")
	}
	if out, err := exec.Command(cfg.Fortio, "version").Output(); err == nil {
		h.Fortio = "fortio " + strings.TrimSpace(string(out))
	}
	if v, err := suricata.Version(cfg.Suricata); err == nil {
		h.Suricata = v
	}
	return h
}
