package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// Experiments.
const (
	ExpPods     = "pods"
	ExpOverlay  = "overlay"
	ExpPolicies = "policies"
)

// Experiments lists them in run order.
var Experiments = []string{ExpPods, ExpOverlay, ExpPolicies}

// Config controls a run.
type Config struct {
	Quick       bool
	Experiments []string
	// Modes are the tunnel modes to measure (native, vxlan, ipip); a mode the agent
	// refuses is reported as not available.
	Modes   []string
	Pairs   []int     // pod scalability: pair counts; the first is the reference (1)
	Traffic []Traffic // pod scalability: tcp, udp-N
	// NoPolicy measures the pod scalability also without the pairs' allow policy.
	NoPolicy bool
	// UDPRate is the UDP load all pairs together offer, in bits/s, shared equally; 0:
	// each sender as fast as it can.
	UDPRate    float64
	PodRepeats int // rounds of the pod scalability experiment
	PodSeconds int // iperf3 -t there
	// Repeats and Seconds are the rounds and iperf3 -t of the overlay and policy
	// experiments; RRDuration their request/response run per sample.
	Repeats      int
	Seconds      int
	RRDuration   time.Duration
	PolicyCounts []int
	PolicyTunnel string // the mode of the policy experiment's cluster
	// CPU pins the measured processes of the overlay and policy experiments (one pair:
	// iperf3 and the request/response ends, both sides) to this CPU; -1 leaves them
	// unpinned. The pod scalability experiment is never pinned: its pairs share the CPUs.
	CPU int
	// Control is the control plane of the clusters: ControlNodes (the default: real
	// nodes, as users run them, each cluster in a lab slot of the host), ControlK8s (an
	// API server, etcd and a pod runner per node in place of kubelet and containerd) or
	// ControlAgent.
	Control string
	Bin     AgentBinaries
	K8s     K8sBinaries // ControlK8s
	Self    string      // this benchmark's binary: the rr-server, rr-client and probe helpers
	Iperf3  string
	OutDir  string
	NoPlot  bool
	Log     io.Writer
	// NewCluster makes a two-node cluster in mode (default: NewK8sCluster or
	// NewAgentCluster, by Control); prefix starts its instance and namespace names.
	NewCluster func(ctx context.Context, mode, prefix string, d *benchkit.Daemons) (Cluster, error)
}

// DefaultConfig is the full run: 30 to 45 minutes on a 2-CPU VM (on real nodes, half of it
// or more the policy experiment, whose 10,000 policies take a minute or more to reach the
// agents through the API).
func DefaultConfig() Config {
	return Config{
		Experiments:  Experiments,
		Modes:        []string{"native", "vxlan", "ipip"},
		Pairs:        []int{1, 2, 5, 10, 20, 40},
		Traffic:      []Traffic{{Name: "tcp"}, {Name: "udp-1400", UDP: true, Len: 1400}, {Name: "udp-8000", UDP: true, Len: 8000}},
		NoPolicy:     true,
		PodRepeats:   1,
		PodSeconds:   5,
		Repeats:      5,
		Seconds:      3,
		RRDuration:   time.Second,
		PolicyCounts: []int{1, 10, 100, 1000, 10000},
		PolicyTunnel: "vxlan",
		CPU:          runtime.NumCPU() - 1,
		Control:      ControlNodes,
		Iperf3:       "iperf3",
		OutDir:       "bench/results",
	}
}

// QuickConfig is the smoke run for CI: every experiment and mode, small and short.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Quick = true
	c.Pairs = []int{1, 2}
	c.Traffic = []Traffic{{Name: "tcp"}, {Name: "udp-8000", UDP: true, Len: 8000}}
	c.PodSeconds = 1
	c.Repeats = 1
	c.Seconds = 1
	c.RRDuration = 200 * time.Millisecond
	c.PolicyCounts = []int{1, 1000}
	return c
}

const (
	connectTimeout = 10 * time.Second       // servers starting, policy settling
	probeTimeout   = 500 * time.Millisecond // a dropped SYN is retransmitted after 1 s
	enforceTimeout = 2 * time.Minute        // apply until the maps hold the entries
)

type runner struct {
	cfg     Config
	log     io.Writer
	daemons benchkit.Daemons
	workDir string
	prefix  string
	rep     *Report
	// clusters by name: a mode, or CaseNativeControl
	clusters map[string]*liveCluster
}

// Run runs the experiments and returns the report (also written to cfg.OutDir, with its
// markdown table and plot). Everything it creates is removed before it returns, also on
// error or when ctx is cancelled; a cancelled run returns what was measured so far.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the benchmark needs root (network namespaces, BPF)")
	}
	if cfg.NewCluster == nil {
		bin, k8s := cfg.Bin, cfg.K8s
		cfg.NewCluster = func(ctx context.Context, mode, prefix string, d *benchkit.Daemons) (Cluster, error) {
			switch cfg.Control {
			case ControlAgent:
				return NewAgentCluster(ctx, bin, mode, prefix, d)
			case ControlNodes:
				return NewNodesCluster(ctx, mode, cfg.Log)
			}
			return NewK8sCluster(ctx, k8s, mode, prefix)
		}
	}
	r := &runner{cfg: cfg, log: cfg.Log, prefix: "cb" + benchkit.Suffix()[:5], clusters: map[string]*liveCluster{}}
	if r.log == nil {
		r.log = io.Discard
	}
	rep = &Report{
		Schema: Schema, Started: time.Now().UTC(), Host: hostInfo(cfg.Iperf3), Published: published,
		Settings: Settings{
			Quick: cfg.Quick, Experiments: cfg.Experiments, Modes: cfg.Modes, Pairs: cfg.Pairs,
			Traffic: cfg.Traffic, NoPolicy: cfg.NoPolicy, UDPBps: cfg.UDPRate, PodRepeats: cfg.PodRepeats, PodSeconds: cfg.PodSeconds,
			Repeats: cfg.Repeats, Seconds: cfg.Seconds, RRSeconds: cfg.RRDuration.Seconds(),
			PolicyCounts: cfg.PolicyCounts, PolicyTunnel: cfg.PolicyTunnel, CPU: cfg.CPU, Prefix: r.prefix,
			Control: cfg.Control,
		},
	}
	r.rep = rep
	defer func() {
		// The experiments stop their servers; the agents go with their clusters.
		if cerr := r.tearDown(); cerr != nil {
			rep.Errors = append(rep.Errors, "clean-up: "+cerr.Error())
		}
		if cerr := r.daemons.StopAll(); cerr != nil {
			rep.Errors = append(rep.Errors, "clean-up: "+cerr.Error())
		}
		if r.workDir != "" {
			os.RemoveAll(r.workDir)
		}
		rep.Finished = time.Now().UTC()
		rep.Host.LoadEnd = benchkit.LoadAverage()
		if ctx.Err() != nil {
			rep.Incomplete = true
		}
	}()
	if err := benchkit.EnsureBPFFS(); err != nil {
		return rep, err
	}
	if r.workDir, err = os.MkdirTemp("", "rp-clusterbench-"); err != nil {
		return rep, err
	}
	if err := r.setUp(ctx); err != nil {
		rep.Errors = append(rep.Errors, err.Error())
		return rep, err
	}
	for _, e := range cfg.Experiments {
		if ctx.Err() != nil {
			break
		}
		var err error
		switch e {
		case ExpPods:
			rep.Pods = &PodsResult{}
			err = r.pods(ctx, rep.Pods)
			summarizePods(rep.Pods, cfg.Pairs)
		case ExpOverlay:
			rep.Overlay = &OverlayResult{}
			err = r.overlay(ctx, rep.Overlay)
			summarizeOverlay(rep.Overlay)
		case ExpPolicies:
			rep.Policies = &PoliciesResult{Mode: cfg.PolicyTunnel}
			err = r.policies(ctx, rep.Policies)
			summarizePolicies(rep.Policies)
		}
		if err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", e, err))
			fmt.Fprintf(r.log, "%s: %v\n", e, err)
		}
	}
	if ctx.Err() != nil {
		return rep, fmt.Errorf("interrupted: %w", ctx.Err())
	}
	return rep, nil
}

func (c *Config) validate() error {
	switch {
	case len(c.Experiments) == 0:
		return errors.New("no experiment")
	case c.PodRepeats < 1 || c.Repeats < 1:
		return errors.New("repeats must be at least 1")
	case c.PodSeconds < 1 || c.Seconds < 1:
		return errors.New("iperf3 durations must be at least 1 s (iperf3 -t takes whole seconds; 0 means forever)")
	case c.UDPRate < 0:
		return errors.New("UDP rate must not be negative")
	case c.RRDuration <= 0:
		return errors.New("request/response duration must be positive")
	case c.CPU >= runtime.NumCPU():
		return fmt.Errorf("CPU %d: this machine has %d", c.CPU, runtime.NumCPU())
	case c.Self == "":
		return errors.New("no helper binary (Self) for the request/response server and client and the probe")
	case c.Control != ControlNodes && c.Control != ControlK8s && c.Control != ControlAgent:
		return fmt.Errorf("control plane %q: want %s, %s or %s", c.Control, ControlNodes, ControlK8s, ControlAgent)
	case c.NewCluster == nil && c.Control == ControlNodes && len(c.clusterNames()) > nodetest.MaxSlots:
		// The clusters are kept at once: one more than the host's lab slots would wait
		// for a slot that only this run could free.
		return fmt.Errorf("real nodes: a host holds %d clusters at once and this run keeps %d (%s) live: pass fewer modes",
			nodetest.MaxSlots, len(c.clusterNames()), strings.Join(c.clusterNames(), ", "))
	case c.NewCluster == nil && c.Control == ControlAgent && (c.Bin.Rampartd == "" || c.Bin.Rampart == ""):
		return errors.New("the agent cluster needs the rampartd and rampart binaries")
	case c.NewCluster == nil && c.Control == ControlK8s && (c.K8s.BinDir == "" || c.K8s.K8sBinDir == ""):
		return errors.New("the Kubernetes cluster needs the agent, CNI and pod runner binaries and the control plane's")
	}
	for _, e := range c.Experiments {
		if !slices.Contains(Experiments, e) {
			return fmt.Errorf("experiment %q: want one of %v", e, Experiments)
		}
	}
	if slices.Contains(c.Experiments, ExpPods) {
		if len(c.Pairs) == 0 || len(c.Traffic) == 0 || len(c.Modes) == 0 {
			return errors.New("pod scalability needs pair counts, traffic and modes")
		}
		for _, n := range c.Pairs {
			if n < 1 || n > 200 {
				return fmt.Errorf("pair count %d: want 1..200 (a node's /24)", n)
			}
		}
	}
	for _, n := range c.PolicyCounts {
		if n < 1 || n > MaxPolicies {
			return fmt.Errorf("policy count %d: want 1..%d", n, MaxPolicies)
		}
	}
	return nil
}

func (r *runner) modeInfo(mode string, ok bool, reason string, mtu int) {
	for i, m := range r.rep.Modes {
		if m.Name == mode {
			if mtu != 0 {
				r.rep.Modes[i].PodMTU = mtu
			}
			return
		}
	}
	r.rep.Modes = append(r.rep.Modes, ModeInfo{Name: mode, Available: ok, Reason: reason, PodMTU: mtu})
}

// pairSpecs are n clients on node A and n servers on node B.
func pairSpecs(n int) []PodSpec {
	var specs []PodSpec
	for i := range n {
		specs = append(specs, PodSpec{Node: NodeA, Namespace: benchNamespace, Name: fmt.Sprintf("client-%02d", i), Labels: []string{"app=" + clientApp}})
	}
	for i := range n {
		specs = append(specs, PodSpec{Node: NodeB, Namespace: benchNamespace, Name: fmt.Sprintf("server-%02d", i), Labels: []string{"app=" + serverApp}})
	}
	return specs
}

// pin prefixes argv with taskset when the measured processes are pinned.
func (r *runner) pin(pinned bool, argv ...string) []string {
	if !pinned || r.cfg.CPU < 0 {
		return argv
	}
	return append([]string{"taskset", "-c", strconv.Itoa(r.cfg.CPU)}, argv...)
}

// startServers starts iperf3 (and, with rr, the request/response server) in each server
// pod; they answer until stopped.
func (r *runner) startServers(servers []*Pod, rr, pinned bool) ([]*benchkit.Daemon, error) {
	var ds []*benchkit.Daemon
	for _, s := range servers {
		d, err := r.daemons.Start(s.Name+" iperf3 server",
			s.Command(context.Background(), r.pin(pinned, r.cfg.Iperf3, "-s", "-p", strconv.Itoa(iperfPort))...))
		if err != nil {
			return ds, err
		}
		ds = append(ds, d)
		if !rr {
			continue
		}
		d, err = r.daemons.Start(s.Name+" rr server",
			s.Command(context.Background(), r.pin(pinned, r.cfg.Self, "rr-server", "--listen", fmt.Sprintf(":%d", rrPort))...))
		if err != nil {
			return ds, err
		}
		ds = append(ds, d)
	}
	return ds, nil
}

func stopAll(ds []*benchkit.Daemon) error {
	var errs []error
	for i := len(ds) - 1; i >= 0; i-- {
		errs = append(errs, ds[i].Stop(5*time.Second))
	}
	return errors.Join(errs...)
}

// probe connects from a pod to addr:port and says connected, refused or timeout.
func (r *runner) probe(ctx context.Context, from, to *Pod, port int) (string, error) {
	out, err := benchkit.RunOutput(ctx, 30*time.Second, func(ctx context.Context) *exec.Cmd {
		return from.Command(ctx, r.cfg.Self, "probe", "--addr", fmt.Sprintf("%s:%d", to.IP, port), "--timeout", probeTimeout.String())
	})
	if err != nil {
		return "", fmt.Errorf("probe from %s: %w", from.Name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// expectProbes checks that each port of to gives the wanted outcome from from.
func (r *runner) expectProbes(ctx context.Context, from, to *Pod, want map[int]string) (map[string]string, error) {
	got := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, 0, len(want))
	for port, w := range want {
		wg.Go(func() {
			g, err := r.probe(ctx, from, to, port)
			// A SYN-ACK late under load looks like a drop: an answer that should come
			// gets two more tries; a drop stays a drop, and an answer that should not
			// come fails at once.
			for try := 0; try < 2 && err == nil && g == benchkit.ProbeTimeout && w != benchkit.ProbeTimeout; try++ {
				g, err = r.probe(ctx, from, to, port)
			}
			mu.Lock()
			defer mu.Unlock()
			got[strconv.Itoa(port)] = g
			if err == nil && g != w {
				err = fmt.Errorf("%s -> %s port %d: %s, want %s", from.Name, to.Name, port, g, w)
			}
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	return got, errors.Join(errs...)
}

// waitEntries polls the policy entry count of every pod until ok accepts each.
func waitEntries(ctx context.Context, c Cluster, pods []*Pod, ok func(int) bool) (int, error) {
	deadline := time.Now().Add(enforceTimeout)
	for {
		n, all := 0, true
		for _, p := range pods {
			k, err := c.PolicyEntries(p)
			if err != nil {
				return k, err
			}
			n = k
			if !ok(k) {
				all = false
				break
			}
		}
		if all {
			return n, nil
		}
		if time.Now().After(deadline) {
			return n, fmt.Errorf("still %d policy entries after %v", n, enforceTimeout)
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// rr runs the request/response client from client to server.
func (r *runner) rr(ctx context.Context, client, server *Pod, pinned bool) (benchkit.RRResult, error) {
	out, err := benchkit.RunOutput(ctx, r.cfg.RRDuration+connectTimeout+30*time.Second, func(ctx context.Context) *exec.Cmd {
		return client.Command(ctx, r.pin(pinned, r.cfg.Self, "rr-client",
			"--addr", fmt.Sprintf("%s:%d", server.IP, rrPort),
			"--duration", r.cfg.RRDuration.String(), "--connect-timeout", connectTimeout.String())...)
	})
	if err != nil {
		return benchkit.RRResult{}, fmt.Errorf("request/response from %s: %w", client.Name, err)
	}
	var res benchkit.RRResult
	if err := json.Unmarshal(out, &res); err != nil {
		return res, fmt.Errorf("reading request/response result: %w", err)
	}
	if res.Transactions == 0 {
		return res, fmt.Errorf("request/response from %s: no transactions", client.Name)
	}
	return res, nil
}

// measurePath runs one pair's TCP iperf3, then its request/response test.
func (r *runner) measurePath(ctx context.Context, client, server *Pod) (s PathSample, err error) {
	argv := r.pin(true, iperfArgs(r.cfg.Iperf3, server, iperfPort, Traffic{Name: "tcp"}, r.cfg.Seconds, 0)...)
	if s.Flow, err = runIperf(ctx, argv, client, false, r.cfg.Seconds); err != nil {
		return s, err
	}
	s.RR, err = r.rr(ctx, client, server, true)
	return s, err
}

func hostInfo(iperf3 string) Host {
	h := Host{CPUs: runtime.NumCPU(), Go: runtime.Version(), Kernel: benchkit.Kernel(), LoadStart: benchkit.LoadAverage()}
	h.Hostname, _ = os.Hostname()
	if out, err := exec.Command(iperf3, "--version").Output(); err == nil {
		h.Iperf3, _, _ = strings.Cut(string(out), "\n")
	}
	return h
}
