package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/monitor/join"
	"github.com/rampartnet/rampart/internal/monitor/suricata"
)

func (a *app) monitorCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "monitor",
		Aliases: []string{"monitors"},
		Short:   "Run Suricata in a monitor endpoint and read its alerts joined to Rampart's flows, endpoints, identities and tap contracts",
	}
	cmd.AddCommand(a.monitorRun(), a.monitorAlerts())
	return cmd
}

// monitorPollInterval is how often a running or followed monitor's EVE file is read.
const monitorPollInterval = 100 * time.Millisecond

// monitorDir is a monitor endpoint's own directory: its Suricata configuration, rules,
// logs and EVE file, under the agent's state directory, so that `monitor alerts` finds
// what `monitor run` wrote.
func (a *app) monitorDir(ctx context.Context, dir, ns, name string) (string, error) {
	if dir != "" {
		return filepath.Abs(dir)
	}
	st, err := a.client.Status(ctx)
	if err != nil {
		return "", err
	}
	if st.StateDir == "" {
		return "", errors.New("the agent reports no state directory: give --dir")
	}
	return filepath.Join(st.StateDir, api.MonitorsDirName, ns, name), nil
}

type monitorOutput struct {
	json bool
	enc  *json.Encoder
}

func (a *app) newMonitorOutput(format string) (*monitorOutput, error) {
	if format != "text" && format != "json" {
		return nil, fmt.Errorf("-o %q: want text or json", format)
	}
	return &monitorOutput{json: format == "json", enc: json.NewEncoder(a.io.Out)}, nil
}

// emit joins the alert and drop records among evs to the agent's view of now and prints
// them; counts (nil: none) counts what it printed and keeps Suricata's capture counters.
func (a *app) emit(ctx context.Context, out *monitorOutput, monitor string, evs []suricata.Event, counts *monitorCounts) error {
	var v *join.View
	for _, ev := range evs {
		if ev.Type == suricata.TypeStats {
			counts.stats(ev)
			continue
		}
		if ev.Type != suricata.TypeAlert && ev.Type != suricata.TypeDrop {
			continue
		}
		if v == nil { // read once per batch, and only when there is something to join
			var err error
			if v, err = a.monitorView(ctx, monitor); err != nil {
				return err
			}
		}
		flows, err := a.flowsOf(ctx, ev)
		if err != nil {
			return err
		}
		v.Flows = flows
		al, ok := join.Join(v, ev)
		if !ok {
			continue
		}
		if out.json {
			err = out.enc.Encode(al)
		} else {
			_, err = fmt.Fprintln(a.io.Out, join.Format(al))
		}
		if err != nil {
			return err
		}
		counts.add(al)
	}
	return nil
}

// monitorView reads what the join needs from the agent.
func (a *app) monitorView(ctx context.Context, monitor string) (*join.View, error) {
	v := &join.View{Monitor: monitor}
	var err error
	if v.Endpoints, err = a.client.ListEndpoints(ctx); err != nil {
		return nil, fmt.Errorf("listing endpoints: %w", err)
	}
	if v.Remotes, err = a.client.ListRemoteEndpoints(ctx); err != nil {
		return nil, fmt.Errorf("listing remote endpoints: %w", err)
	}
	if v.Nodes, err = a.client.ListNodes(ctx); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	if v.Identities, err = a.client.ListIdentities(ctx); err != nil {
		return nil, fmt.Errorf("listing identities: %w", err)
	}
	if v.Taps, err = a.client.ListTaps(ctx); err != nil {
		return nil, fmt.Errorf("listing tap contracts: %w", err)
	}
	return v, nil
}

// flowsOf reads the agent's recent flow events of the record's protocol and ports: the
// join picks the connection's among them.
func (a *app) flowsOf(ctx context.Context, ev suricata.Event) ([]api.Flow, error) {
	var flows []api.Flow
	req := api.ObserveRequest{Filter: api.FlowFilter{Port: ev.Tuple.Dst.Port(), Type: "l3l4"}, SinceStart: true}
	if p := strings.ToLower(ev.Tuple.Proto); p == "tcp" || p == "udp" || p == "icmp" || p == "sctp" {
		req.Filter.Protocol = p
	}
	err := a.client.Observe(ctx, req, func(f api.Flow) error {
		flows = append(flows, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading flows: %w", err)
	}
	return flows, nil
}

// monitorEndpoint checks that NS/NAME is a monitor endpoint of this node.
func (a *app) monitorEndpoint(ctx context.Context, key string) (api.Endpoint, error) {
	ns, name, err := splitKey(key)
	if err != nil {
		return api.Endpoint{}, err
	}
	ep, err := a.client.GetEndpoint(ctx, ns, name)
	if err != nil {
		return api.Endpoint{}, err
	}
	if !ep.Monitor {
		return api.Endpoint{}, fmt.Errorf("endpoint %s is not a monitor (rampart endpoint add %s --monitor)", key, key)
	}
	return ep, nil
}

// monitorRunFlags are monitor run's flags.
type monitorRunFlags struct {
	mode, dir, output     string
	ruleFiles, rules, lua []string
	luaAllow, steer       bool
	homeNet               []string
	startTimeout          time.Duration
}

// config is Suricata's configuration the flags ask for (the monitor's namespace and
// directory not yet known).
func (o *monitorRunFlags) config() (suricata.Config, error) {
	cfg := suricata.Config{Interface: endpoint.MonitorRxIfName, LuaRules: o.luaAllow, HomeNet: o.homeNet, Rules: o.rules, StartTimeout: o.startTimeout}
	switch strings.ToLower(o.mode) {
	case "passive":
		cfg.Mode = suricata.Passive
	case "inline":
		cfg.Mode, cfg.PeerInterface = suricata.IPS, endpoint.MonitorTxIfName
	default:
		return cfg, fmt.Errorf("--mode %q: want passive or inline", o.mode)
	}
	for _, list := range []struct {
		from []string
		to   *[]string
	}{{o.ruleFiles, &cfg.RuleFiles}, {o.lua, &cfg.LuaScripts}} {
		for _, f := range list.from {
			p, err := filepath.Abs(f)
			if err != nil {
				return cfg, err
			}
			*list.to = append(*list.to, p)
		}
	}
	if len(o.lua) > 0 && !o.luaAllow {
		return cfg, errors.New("--lua needs --lua-allow: Suricata refuses Lua rules unless allowed")
	}
	return cfg, nil
}

func (a *app) monitorRun() *cobra.Command {
	var o monitorRunFlags
	cmd := &cobra.Command{
		Use:   "run NAMESPACE/NAME --mode passive|inline [--rules FILE]... [--rule RULE]... [--lua-allow [--lua SCRIPT]...] [-o text|json]",
		Short: "Run Suricata in a monitor endpoint until interrupted, printing its alerts joined to Rampart's view",
		Long: `Run Suricata 7 in the monitor endpoint's network namespace, in its own directory
(the agent's state directory, monitors/NAMESPACE/NAME, or --dir), and print each alert and
drop joined to Rampart's view: the flow, its endpoints and identities, and the tap contracts
that sent it to this monitor. passive reads the copies of mirror taps (tap-rx); inline sits
between tap-rx and tap-tx (AF_PACKET IPS) on the path of redirect taps: while it does not
run, redirected traffic stops. Ctrl-C stops Suricata and the command.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := contextOf(cmd)
			out, err := a.newMonitorOutput(o.output)
			if err != nil {
				return err
			}
			cfg, err := o.config()
			if err != nil {
				return err
			}
			ep, err := a.monitorEndpoint(ctx, args[0])
			if err != nil {
				return err
			}
			if cfg.Netns = ep.Netns; cfg.Netns == "" {
				return fmt.Errorf("endpoint %s has no network namespace on this node", args[0])
			}
			if cfg.Dir, err = a.monitorDir(ctx, o.dir, ep.Namespace, ep.Name); err != nil {
				return err
			}
			if o.steer {
				cpus, err := steerCopies(cfg.Netns)
				if err != nil {
					return err
				}
				defer endpoint.SteerMonitorCopies(cfg.Netns, nil)
				fmt.Fprintf(a.io.Err, "monitor %s: copies handed to CPUs %v\n", ep.Key(), cpus)
			}
			m, err := suricata.Start(ctx, cfg)
			if err != nil {
				return fmt.Errorf("starting the monitor %s: %w", args[0], err)
			}
			defer m.Stop()
			status := a.io.Out
			if out.json {
				status = a.io.Err
			}
			// "running" is printed once the agent sees Suricata read, so that copies sent
			// after it are delivered rather than counted lost to a monitor shown down.
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err = a.client.WaitMonitorReading(wctx, ep.Key())
			cancel()
			if err != nil {
				return fmt.Errorf("suricata runs: %w", err)
			}
			fmt.Fprintf(status, "monitor %s running: suricata %s mode, pid %d, directory %s (Ctrl-C stops it)\n", ep.Key(), cfg.Mode, m.Pid(), cfg.Dir)
			return a.followMonitor(ctx, m, ep, out, status)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.mode, "mode", "", "passive (mirror taps: alerts) or inline (redirect taps: alerts and drops)")
	f.StringArrayVar(&o.ruleFiles, "rules", nil, "a Suricata rule file (repeatable)")
	f.StringArrayVar(&o.rules, "rule", nil, "one Suricata rule (repeatable)")
	f.BoolVar(&o.luaAllow, "lua-allow", false, "allow Lua rules (security.lua.allow-rules); Suricata then runs one capture thread, so that a script's state sees every flow")
	f.StringArrayVar(&o.lua, "lua", nil, "a Lua script that rules name (lua:FILE), copied into the monitor's directory (repeatable)")
	f.StringArrayVar(&o.homeNet, "home-net", nil, "$HOME_NET CIDRs (default any)")
	f.StringVar(&o.dir, "dir", "", "the monitor's directory (default STATE_DIR/monitors/NAMESPACE/NAME)")
	f.DurationVar(&o.startTimeout, "start-timeout", 30*time.Second, "how long Suricata may take to start")
	f.BoolVar(&o.steer, "steer-copies", false, "hand the copies arriving on tap-rx to the CPUs this command runs on (start it under taskset -c LIST): bulk traffic keeps more throughput, small packets pay an interrupt per batch")
	f.StringVarP(&o.output, "output", "o", "text", "output format: text or json (one joined alert per line)")
	cmd.MarkFlagRequired("mode")
	return cmd
}

// followMonitor prints the running monitor m's alerts and drops as it writes them, and
// reports their counts to the agent, until ctx ends (then Suricata is stopped and what it
// flushed is printed too) or Suricata exits.
func (a *app) followMonitor(ctx context.Context, m *suricata.Monitor, ep api.Endpoint, out *monitorOutput, status io.Writer) error {
	// The agent's metrics get the counts of this run after each read, and at the end
	// those with the records Suricata flushed as it stopped.
	counts := newMonitorCounts(a.io.Err)
	reporter := startMonitorReporter(ep.Key(), func(ctx context.Context, r api.MonitorReport) error {
		return a.client.ReportMonitor(ctx, ep.Namespace, ep.Name, r)
	})
	defer func() {
		for _, w := range reporter.close(counts.report()) {
			fmt.Fprintln(a.io.Err, w)
		}
	}()
	tick := time.NewTicker(monitorPollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			// Suricata flushes what it holds as it stops: those records too.
			stopErr := m.Stop()
			evs, err := m.Events()
			// The API calls of the join need a context that is not done.
			ctx2, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err != nil {
				fmt.Fprintf(a.io.Err, "warning: reading the monitor's events: %v\n", err)
			}
			if err := a.emit(ctx2, out, ep.Key(), evs, counts); err != nil {
				return err
			}
			fmt.Fprintf(status, "monitor %s stopped\n", ep.Key())
			return stopErr
		case <-m.Exited():
			evs, _ := m.Events()
			a.emit(context.Background(), out, ep.Key(), evs, counts)
			return fmt.Errorf("the monitor %s exited: %w", ep.Key(), m.Stop())
		case <-tick.C:
		}
		evs, err := m.Events()
		if err != nil {
			// A record that does not parse is skipped, the rest are still joined.
			fmt.Fprintf(a.io.Err, "warning: reading the monitor's events: %v\n", err)
		}
		if err := a.emit(ctx, out, ep.Key(), evs, counts); err != nil && ctx.Err() == nil {
			return err
		}
		if w := reporter.offer(counts.report()); w != "" {
			fmt.Fprintln(a.io.Err, w)
		}
	}
}

// steerCopies hands the copies arriving in the monitor at netnsPath to the CPUs this
// process may run on, which Suricata inherits; it refuses when that is every CPU, where
// steering would only add interrupts.
func steerCopies(netnsPath string) ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("--steer-copies: reading this command's CPUs: %w", err)
	}
	online, err := endpoint.OnlineCPUs()
	if err != nil {
		return nil, fmt.Errorf("--steer-copies: %w", err)
	}
	var cpus []int
	for _, c := range online {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == len(online) {
		return nil, errors.New("--steer-copies: this command may run on every CPU; start it under taskset -c LIST so that the monitor has CPUs of its own")
	}
	return cpus, endpoint.SteerMonitorCopies(netnsPath, cpus)
}

func (a *app) monitorAlerts() *cobra.Command {
	var (
		dir, output string
		follow      bool
	)
	cmd := &cobra.Command{
		Use:   "alerts NAMESPACE/NAME [--follow] [-o text|json]",
		Short: "Show a monitor's alerts and drops joined to Rampart's view: flow, endpoints, identities, tap contracts",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := contextOf(cmd)
			out, err := a.newMonitorOutput(output)
			if err != nil {
				return err
			}
			ep, err := a.monitorEndpoint(ctx, args[0])
			if err != nil {
				return err
			}
			if dir, err = a.monitorDir(ctx, dir, ep.Namespace, ep.Name); err != nil {
				return err
			}
			r := suricata.NewReader(filepath.Join(dir, "eve.json"))
			tick := time.NewTicker(monitorPollInterval)
			defer tick.Stop()
			for {
				evs, err := r.Next()
				if err != nil {
					fmt.Fprintf(a.io.Err, "warning: reading the monitor's events: %v\n", err)
				}
				if err := a.emit(ctx, out, ep.Key(), evs, nil); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				if !follow {
					return nil
				}
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
			}
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "keep printing new alerts")
	f.StringVar(&dir, "dir", "", "the monitor's directory (default STATE_DIR/monitors/NAMESPACE/NAME, where monitor run writes)")
	f.StringVarP(&output, "output", "o", "text", "output format: text or json (one joined alert per line)")
	return cmd
}
