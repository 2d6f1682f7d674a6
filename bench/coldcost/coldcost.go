package coldcost

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/endpoint"
)

// Program names: Rampart's two programs and the empty reference.
const (
	ProgFromEp = "rampart_from_ep" // the endpoint sends (egress policy)
	ProgToEp   = "rampart_to_ep"   // the endpoint receives (ingress policy)
	ProgEmpty  = "empty"           // returns "next program", ahead of Rampart's
)

// Build is a rampartd binary under a name.
type Build struct {
	Name     string `json:"name"`
	Rampartd string `json:"rampartd"`
}

// Config is one run.
type Config struct {
	Builds    []Build
	Rampart   string // the CLI, for the endpoint
	Rounds    int
	Pings     int
	Interval  time.Duration
	ClientCPU int    // CPU the ping runs on
	Instance  string // agent instance name (namespaces, pins)
	WorkDir   string
	PodCIDR   netip.Prefix
	Log       func(format string, args ...any)
}

// Sample is one build's programs over one round of pings.
type Sample struct {
	Round int    `json:"round"`
	Build string `json:"build"`
	// NsPerRun by program name (ProgFromEp, ProgToEp, ProgEmpty).
	NsPerRun map[string]float64 `json:"ns_per_run"`
	Runs     map[string]uint64  `json:"runs"`
}

// Report is a whole run.
type Report struct {
	Started  time.Time     `json:"started"`
	Kernel   string        `json:"kernel"`
	CPUs     int           `json:"cpus"`
	Builds   []Build       `json:"builds"`
	Rounds   int           `json:"rounds"`
	Pings    int           `json:"pings_per_round"`
	Interval time.Duration `json:"interval_ns"`
	Samples  []Sample      `json:"samples"`
	// Median ns per run over the rounds, by build, then program.
	Median map[string]map[string]float64 `json:"median_ns_per_run"`
}

// Run measures every build, round after round, and returns the report. It needs root.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if len(cfg.Builds) == 0 || cfg.Rounds < 1 || cfg.Pings < 1 {
		return nil, errors.New("coldcost: need builds, rounds >= 1 and pings >= 1")
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enabling BPF run-time statistics: %w", err)
	}
	defer stats.Close() // the kernel stops counting when the last holder closes

	rep = &Report{Started: time.Now().UTC(), Kernel: kernel(), CPUs: numCPU(), Builds: cfg.Builds,
		Rounds: cfg.Rounds, Pings: cfg.Pings, Interval: cfg.Interval}
	daemons := &benchkit.Daemons{}
	agent := benchkit.NewAgent(cfg.Builds[0].Rampartd, cfg.Rampart, cfg.Instance, cfg.WorkDir, cfg.PodCIDR)
	defer func() {
		err = errors.Join(err, agent.Stop(), daemons.StopAll())
	}()
	if err := agent.Start(ctx, daemons); err != nil {
		return nil, fmt.Errorf("starting the agent: %w", err)
	}
	client, err := agent.AddEndpoint(ctx, "coldcost", "client", []string{"app=coldcost"}, benchkit.HostAddr(cfg.PodCIDR, 10))
	if err != nil {
		return nil, err
	}
	router := benchkit.HostAddr(cfg.PodCIDR, 1) // the router: the node's address on the endpoint's route
	nodeNetns := endpoint.NetnsPath(agent.NodeNetns())
	hostIf := client.API.HostInterface

	for r := 0; r < cfg.Rounds; r++ {
		for _, b := range cfg.Builds {
			if err := agent.Restart(ctx, daemons, b.Rampartd); err != nil {
				return rep, fmt.Errorf("round %d, build %s: %w", r, b.Name, err)
			}
			s, err := measure(ctx, cfg, nodeNetns, hostIf, client, router)
			if err != nil {
				return rep, fmt.Errorf("round %d, build %s: %w", r, b.Name, err)
			}
			s.Round, s.Build = r, b.Name
			rep.Samples = append(rep.Samples, s)
			if cfg.Log != nil {
				cfg.Log("round %d %-10s from_ep %4.0f ns  to_ep %4.0f ns  empty %4.0f ns", r, b.Name,
					s.NsPerRun[ProgFromEp], s.NsPerRun[ProgToEp], s.NsPerRun[ProgEmpty])
			}
		}
	}
	rep.Median = Summarize(rep.Samples)
	return rep, nil
}

// Summarize returns each build's median ns per run of each program over its samples.
func Summarize(samples []Sample) map[string]map[string]float64 {
	vals := map[string]map[string][]float64{}
	for _, s := range samples {
		if vals[s.Build] == nil {
			vals[s.Build] = map[string][]float64{}
		}
		for prog, v := range s.NsPerRun {
			vals[s.Build][prog] = append(vals[s.Build][prog], v)
		}
	}
	out := map[string]map[string]float64{}
	for b, progs := range vals {
		out[b] = map[string]float64{}
		for prog, vs := range progs {
			out[b][prog] = benchkit.Median(vs)
		}
	}
	return out
}

// attached is a program on the endpoint's veth with its statistics at the start.
type attached struct {
	name  string
	prog  *ebpf.Program
	start *ebpf.ProgramStats
}

// openAttached opens program id, found on a hook, with its name.
func openAttached(id ebpf.ProgramID) (attached, error) {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return attached{}, fmt.Errorf("opening program %d: %w", id, err)
	}
	info, err := p.Info()
	if err != nil {
		p.Close()
		return attached{}, fmt.Errorf("reading program %d: %w", id, err)
	}
	return attached{name: info.Name, prog: p}, nil
}

// measure attaches the empty program ahead of Rampart's on both hooks of the endpoint's
// host-side veth, pings the router and returns the programs' cost per run over the pings.
func measure(ctx context.Context, cfg Config, nodeNetns, hostIf string, client *benchkit.Endpoint, router netip.Addr) (Sample, error) {
	s := Sample{NsPerRun: map[string]float64{}, Runs: map[string]uint64{}}
	var progs []attached
	defer func() {
		for _, p := range progs {
			p.prog.Close()
		}
	}()
	var links []link.Link
	defer func() {
		for _, l := range links {
			l.Close()
		}
	}()
	empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: ProgEmpty, Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}, // TC_ACT_UNSPEC: go on
	})
	if err != nil {
		return s, fmt.Errorf("loading the empty program: %w", err)
	}
	// One program on both hooks: its statistics are the mean over them.
	progs = append(progs, attached{name: ProgEmpty, prog: empty})

	err = endpoint.Do(nodeNetns, func() error {
		l, err := netlink.LinkByName(hostIf)
		if err != nil {
			return fmt.Errorf("finding the endpoint's veth %s: %w", hostIf, err)
		}
		ifc := l.Attrs().Index
		// Rampart's programs are cls_bpf filters (rampartd --attach=tc, the default) or
		// TCX links (--attach=tcx, and builds before the flag): the empty TCX program at
		// the head returns "next", so the filters run after it too.
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := netlink.FilterList(l, parent)
			if err != nil {
				continue // no clsact qdisc: TCX
			}
			for _, f := range fs {
				bf, ok := f.(*netlink.BpfFilter)
				if !ok {
					continue
				}
				p, err := openAttached(ebpf.ProgramID(bf.Id))
				if err != nil {
					return err
				}
				progs = append(progs, p)
			}
		}
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: ifc, Attach: at})
			if err != nil {
				return fmt.Errorf("listing the programs on %s: %w", hostIf, err)
			}
			for _, ap := range res.Programs {
				p, err := openAttached(ap.ID)
				if err != nil {
					return err
				}
				progs = append(progs, p)
			}
			l, err := link.AttachTCX(link.TCXOptions{Interface: ifc, Program: empty, Attach: at, Anchor: link.Head()})
			if err != nil {
				return fmt.Errorf("attaching the empty program to %s: %w", hostIf, err)
			}
			links = append(links, l)
		}
		return nil
	})
	if err != nil {
		return s, err
	}
	seen := map[string]bool{}
	for i := range progs {
		seen[progs[i].name] = true
		if progs[i].start, err = progs[i].prog.Stats(); err != nil {
			return s, fmt.Errorf("reading the statistics of %s: %w", progs[i].name, err)
		}
	}
	if !seen[ProgFromEp] || !seen[ProgToEp] {
		return s, fmt.Errorf("the endpoint's veth %s does not run %s and %s", hostIf, ProgFromEp, ProgToEp)
	}

	ping := client.Command(ctx, "taskset", "-c", strconv.Itoa(cfg.ClientCPU), "ping", "-q", "-n",
		"-i", strconv.FormatFloat(cfg.Interval.Seconds(), 'f', -1, 64), "-c", strconv.Itoa(cfg.Pings),
		"-W", "1", router.String())
	if out, err := ping.CombinedOutput(); err != nil {
		return s, fmt.Errorf("ping: %w: %s", err, benchkit.Truncate(string(out), 300))
	}

	for _, p := range progs {
		end, err := p.prog.Stats()
		if err != nil {
			return s, fmt.Errorf("reading the statistics of %s: %w", p.name, err)
		}
		runs := end.RunCount - p.start.RunCount
		if runs == 0 {
			return s, fmt.Errorf("%s did not run during the pings", p.name)
		}
		s.Runs[p.name] = runs
		s.NsPerRun[p.name] = float64(end.Runtime-p.start.Runtime) / float64(runs)
	}
	if min := uint64(cfg.Pings); s.Runs[ProgFromEp] < min || s.Runs[ProgToEp] < min {
		return s, fmt.Errorf("programs ran %d and %d times for %d pings", s.Runs[ProgFromEp], s.Runs[ProgToEp], cfg.Pings)
	}
	return s, nil
}

// Table renders the medians as markdown: each build's programs, and the same minus the
// empty program's cost.
func Table(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| build | %s ns | %s ns | both | empty program ns | both above two empty runs |\n|---|---:|---:|---:|---:|---:|\n", ProgFromEp, ProgToEp)
	names := make([]string, 0, len(rep.Builds))
	for _, bd := range rep.Builds {
		names = append(names, bd.Name)
	}
	for _, n := range names {
		m := rep.Median[n]
		both := m[ProgFromEp] + m[ProgToEp]
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.0f | %.0f | %.0f |\n", n, m[ProgFromEp], m[ProgToEp], both, m[ProgEmpty], both-2*m[ProgEmpty])
	}
	fmt.Fprintf(&b, "\nMedians over %d rounds of %d pings at %v each, builds taking turns on one endpoint; %d CPUs, kernel %s. Ns per run from the kernel's BPF statistics (run time / run count).\n",
		rep.Rounds, rep.Pings, rep.Interval, rep.CPUs, rep.Kernel)
	return b.String()
}

func kernel() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

func numCPU() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0
	}
	return set.Count()
}
