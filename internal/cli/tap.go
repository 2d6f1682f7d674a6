package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/tap"
)

func (a *app) tapCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "tap",
		Aliases: []string{"taps"},
		Short:   "Add, list, inspect and delete tap contracts: flows copied or diverted to a monitor endpoint",
	}
	cmd.AddCommand(a.tapAdd(), a.tapList(), a.tapGet(), a.tapDelete())
	return cmd
}

// tapFlags are the flags of `tap add` that make a contract without a manifest.
type tapFlags struct {
	endpoint, monitor, direction, protocol, action, failMode string
	selector, nsSelector                                     []string
	peers, ports, peerPorts                                  []string
	icmpType, icmpCode                                       int
}

// manifest renders the flags as a TapContract manifest (JSON), which the agent parses as
// it parses files: one definition of what a contract may hold, and the same messages.
func (f *tapFlags) manifest(name string) ([]byte, error) {
	source := map[string]any{}
	if f.endpoint != "" {
		source["endpoint"] = f.endpoint
	}
	for _, s := range []struct {
		key  string
		vals []string
	}{{"selector", f.selector}, {"namespaceSelector", f.nsSelector}} {
		if len(s.vals) == 0 {
			continue
		}
		l, err := parseLabelSet(s.vals)
		if err != nil {
			return nil, err
		}
		source[s.key] = map[string]any{"matchLabels": l}
	}
	match := map[string]any{}
	if f.direction != "" {
		match["direction"] = f.direction
	}
	if f.protocol != "" {
		match["protocol"] = f.protocol
	}
	if len(f.peers) > 0 {
		match["peerCIDRs"] = splitList(f.peers)
	}
	if len(f.ports) > 0 {
		match["ports"] = splitList(f.ports)
	}
	if len(f.peerPorts) > 0 {
		match["peerPorts"] = splitList(f.peerPorts)
	}
	if f.icmpType >= 0 {
		match["icmpType"] = f.icmpType
	}
	if f.icmpCode >= 0 {
		match["icmpCode"] = f.icmpCode
	}
	spec := map[string]any{"source": source, "monitor": f.monitor, "match": match, "action": f.action}
	if f.failMode != "" {
		spec["failMode"] = f.failMode
	}
	return json.Marshal(map[string]any{
		"apiVersion": tap.APIVersion, "kind": tap.KindTapContract,
		"metadata": map[string]any{"name": name}, "spec": spec,
	})
}

// splitList reads repeated and comma-separated values.
func splitList(vals []string) []string {
	var out []string
	for _, v := range vals {
		for _, part := range strings.Split(v, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	return out
}

func (a *app) tapAdd() *cobra.Command {
	var f tapFlags
	var files []string
	cmd := &cobra.Command{
		Use: "add NAME (--endpoint NS/NAME | --selector k=v,... [--namespace-selector k=v,...]) --monitor NS/NAME --action mirror|redirect [match flags]\n" +
			"  rampart tap add -f FILE|DIR|- [-f ...]",
		Short: "Create or replace a tap contract from flags, or the TapContract and TrafficControl manifests of files (all of them or none)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var docs []api.Document
			switch {
			case len(files) > 0 && len(args) > 0:
				return fmt.Errorf("give a NAME with flags, or -f, not both")
			case len(files) > 0:
				var err error
				if docs, err = a.readManifests(files); err != nil {
					return err
				}
			case len(args) == 0:
				return fmt.Errorf("give a NAME and flags, or -f FILE")
			default:
				if f.monitor == "" || f.action == "" {
					return fmt.Errorf("a tap contract needs --monitor and --action")
				}
				data, err := f.manifest(args[0])
				if err != nil {
					return err
				}
				docs = []api.Document{{Source: "flags", Data: string(data)}}
			}
			res, err := a.client.AddTaps(contextOf(cmd), api.ApplyRequest{Documents: docs})
			if err != nil {
				return err
			}
			a.printChanges(res)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVarP(&files, "filename", "f", nil, "manifest file, directory or - for stdin (repeatable)")
	fl.StringVar(&f.endpoint, "endpoint", "", "the endpoint to tap, NAMESPACE/NAME")
	fl.StringSliceVar(&f.selector, "selector", nil, "tap every endpoint with these labels k=v,...")
	fl.StringSliceVar(&f.nsSelector, "namespace-selector", nil, "... in namespaces with these labels k=v,...")
	fl.StringVar(&f.monitor, "monitor", "", "the monitor endpoint, NAMESPACE/NAME (made with endpoint add --monitor)")
	fl.StringVar(&f.action, "action", "", "mirror (a copy to the monitor) or redirect (through the monitor)")
	fl.StringVar(&f.failMode, "fail-mode", "", "redirect only: closed (default: drop while the monitor is unavailable) or open (pass untapped)")
	fl.StringVar(&f.direction, "direction", "", "ingress, egress or both (default), seen from the endpoint")
	fl.StringVar(&f.protocol, "protocol", "", "TCP, UDP, ICMP or any (default)")
	fl.StringSliceVar(&f.peers, "peer", nil, "peer CIDRs (repeatable, comma-separated)")
	fl.StringSliceVar(&f.ports, "port", nil, "the endpoint's ports or ranges, e.g. 80,8000-8080 (TCP or UDP)")
	fl.StringSliceVar(&f.peerPorts, "peer-port", nil, "the peer's ports or ranges (TCP or UDP)")
	fl.IntVar(&f.icmpType, "icmp-type", -1, "ICMP type (protocol ICMP)")
	fl.IntVar(&f.icmpCode, "icmp-code", -1, "ICMP code (with --icmp-type)")
	return cmd
}

func (a *app) tapList() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List tap contracts with what they tap and their counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ts, err := a.client.ListTaps(contextOf(cmd))
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(ts)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tKIND\tACTION\tMONITOR\tENDPOINTS\tMATCH\tMIRRORED\tREDIRECTED\tMONITOR DROPS\tCOPIES LOST")
			for _, t := range ts {
				c := t.Counters
				if c == nil {
					c = &api.TapCounters{}
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%d\n", t.Name, t.Kind, actionString(t), monitorString(t), len(t.Endpoints), t.Match,
					packetsBytes(c.MirroredPackets, c.MirroredBytes), packetsBytes(c.RedirectedPackets, c.RedirectedBytes), c.DroppedByMonitor, c.CopiesLost)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			for _, t := range ts {
				a.tapNotes(t)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

func actionString(t api.Tap) string {
	if t.FailMode != "" {
		return t.Action + " (fail " + t.FailMode + ")"
	}
	return t.Action
}

func monitorString(t api.Tap) string {
	s := t.Monitor
	if t.MonitorNode != "" {
		s += "@" + t.MonitorNode
	}
	if t.MonitorProblem != "" {
		s += " (unavailable)"
	}
	return s
}

func packetsBytes(p, b uint64) string {
	return strconv.FormatUint(p, 10) + "/" + strconv.FormatUint(b, 10) + "B"
}

// tapNotes prints what a user must know of a contract's state.
func (a *app) tapNotes(t api.Tap) {
	if t.MonitorProblem != "" {
		effect := "its copies are lost"
		switch {
		case t.Action == "redirect" && t.FailMode == "open":
			effect = "matched traffic passes untapped (fail open)"
		case t.Action == "redirect":
			effect = "matched traffic is dropped (fail closed)"
		}
		a.printf("note: %s: %s: %s\n", t.Name, t.MonitorProblem, effect)
	}
	for _, c := range t.Conflicts {
		a.printf("note: %s overlaps %s (the first by name takes the packet)\n", t.Name, c)
	}
}

func (a *app) tapGet() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a tap contract: what it taps, where, its state and counters",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := a.client.GetTap(contextOf(cmd), args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(t)
			}
			a.printf("%s %s (from %s)\n", t.Kind, t.Name, t.Source)
			a.printf("  taps:      %s\n", t.Tapped)
			a.printf("  match:     %s\n", t.Match)
			a.printf("  action:    %s\n", actionString(t))
			a.printf("  monitor:   %s\n", monitorString(t))
			a.printf("  endpoints: %d %s\n", len(t.Endpoints), strings.Join(t.Endpoints, " "))
			if c := t.Counters; c != nil {
				a.printf("  mirrored %d packets (%d bytes), redirected %d packets (%d bytes), dropped by the monitor %d, copies lost %d, dropped while the monitor was unavailable %d\n",
					c.MirroredPackets, c.MirroredBytes, c.RedirectedPackets, c.RedirectedBytes, c.DroppedByMonitor, c.CopiesLost, c.DroppedUnavailable)
			}
			a.tapNotes(t)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

func (a *app) tapDelete() *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a tap contract",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := a.client.DeleteTap(contextOf(cmd), args[0])
			if err != nil {
				return err
			}
			a.printChanges(res)
			return nil
		},
	}
}
