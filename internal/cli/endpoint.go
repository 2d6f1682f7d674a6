package cli

import (
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampartnet/rampart/internal/api"
)

func (a *app) endpointCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "endpoint",
		Aliases: []string{"endpoints", "ep"},
		Short:   "Add, list, inspect, relabel and delete endpoints, and run commands in them",
	}
	cmd.AddCommand(a.endpointAdd(), a.endpointList(), a.endpointGet(), a.endpointDelete(), a.endpointLabel(), a.endpointAudit(), a.endpointExec())
	return cmd
}

func (a *app) endpointAdd() *cobra.Command {
	var lbls, ports []string
	var ip, sa, output string
	var monitor, audit bool
	cmd := &cobra.Command{
		Use:   "add NAMESPACE/NAME [--labels k=v,...] [--ip ADDR] [--port NAME=PORT/PROTO ...] [--service-account SA] [--monitor] [--audit]",
		Short: "Create an endpoint: network namespace, veth, address, identity, policy",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parsePodDecl(args[0], lbls, ports)
			if err != nil {
				return err
			}
			spec := api.EndpointSpec{Namespace: d.ns, Name: d.name, Labels: d.labels, Ports: d.ports, IP: ip, ServiceAccount: sa, Monitor: monitor, Audit: audit}
			ep, err := a.client.AddEndpoint(contextOf(cmd), spec)
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(ep)
			}
			kind := "endpoint"
			if ep.Monitor {
				kind = "monitor endpoint"
			}
			ip6 := ""
			if ep.IP6 != "" {
				ip6 = ", ip6 " + ep.IP6
			}
			a.printf("%s %s created: ip %s%s, identity %d, interface %s\n", kind, ep.Key(), ep.IP, ip6, ep.Identity, ep.HostInterface)
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&lbls, "labels", nil, "labels k=v,k2=v2")
	cmd.Flags().StringVar(&ip, "ip", "", "a specific free address of the pod range")
	cmd.Flags().StringArrayVar(&ports, "port", nil, "named port NAME=PORT/PROTO (repeatable)")
	cmd.Flags().StringVar(&sa, "service-account", "", "service account")
	cmd.Flags().BoolVar(&monitor, "monitor", false, "make it a monitor for tap contracts (never tapped itself; see docs/taps.md)")
	cmd.Flags().BoolVar(&audit, "audit", false, "put it in audit mode: its policies are not enforced, and what they would drop is forwarded and reported with verdict AUDIT (docs/observability.md)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

// podDecl is what endpoint add and remote add read alike: the NAMESPACE/NAME argument,
// --labels and --port.
type podDecl struct {
	ns, name string
	labels   map[string]string
	ports    []api.NamedPort
}

func parsePodDecl(key string, lbls, ports []string) (podDecl, error) {
	var d podDecl
	var err error
	if d.ns, d.name, err = splitKey(key); err != nil {
		return podDecl{}, err
	}
	if d.labels, err = parseLabelSet(lbls); err != nil {
		return podDecl{}, err
	}
	if d.ports, err = parseNamedPorts(ports); err != nil {
		return podDecl{}, err
	}
	return d, nil
}

// parseNamedPorts reads the values of --port flags.
func parseNamedPorts(in []string) ([]api.NamedPort, error) {
	var out []api.NamedPort
	for _, s := range in {
		np, err := parseNamedPort(s)
		if err != nil {
			return nil, err
		}
		out = append(out, np)
	}
	return out, nil
}

// parseNamedPort reads NAME=PORT/PROTO.
func parseNamedPort(s string) (api.NamedPort, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return api.NamedPort{}, fmt.Errorf("port %q: want NAME=PORT/PROTO", s)
	}
	port, proto, err := parsePortProto(rest)
	if err != nil {
		return api.NamedPort{}, fmt.Errorf("port %q: %w", s, err)
	}
	if port == 0 {
		return api.NamedPort{}, fmt.Errorf("port %q: number must be 1-65535", s)
	}
	return api.NamedPort{Name: name, Port: port, Protocol: proto}, nil
}

func (a *app) endpointList() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List endpoints",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			eps, err := a.client.ListEndpoints(contextOf(cmd))
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(eps)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ENDPOINT\tIP\tIDENTITY\tENFORCEMENT\tLABELS")
			for _, ep := range eps {
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", ep.Key(), endpointAddrs(ep), ep.Identity, enforcement(ep), labelString(ep.Labels))
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

// endpointAddrs is an endpoint's address, or on a dual-stack node its IPv4 and IPv6
// addresses separated by a comma.
func endpointAddrs(ep api.Endpoint) string { return addrPair(ep.IP, ep.IP6) }

// addrPair is ip, or ip and ip6 separated by a comma when there is an ip6.
func addrPair(ip, ip6 string) string {
	if ip6 == "" {
		return ip
	}
	return ip + "," + ip6
}

func enforcement(ep api.Endpoint) string {
	switch {
	case ep.EnforceIngress && ep.EnforceEgress:
		return "ingress,egress"
	case ep.EnforceIngress:
		return "ingress"
	case ep.EnforceEgress:
		return "egress"
	}
	return "none"
}

func labelString(l map[string]string) string {
	parts := make([]string, 0, len(l))
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "<none>"
	}
	return strings.Join(parts, ",")
}

func (a *app) endpointGet() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get NAMESPACE/NAME",
		Short: "Show an endpoint: address, identity, labels, named ports, enforcement, counters",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := splitKey(args[0])
			if err != nil {
				return err
			}
			ep, err := a.client.GetEndpoint(contextOf(cmd), ns, name)
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(ep)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 1, ' ', 0)
			fmt.Fprintf(w, "Endpoint:\t%s\n", ep.Key())
			fmt.Fprintf(w, "IP:\t%s\n", ep.IP)
			if ep.IP6 != "" {
				fmt.Fprintf(w, "IPv6:\t%s\n", ep.IP6)
			}
			fmt.Fprintf(w, "Identity:\t%d\n", ep.Identity)
			fmt.Fprintf(w, "Labels:\t%s\n", labelString(ep.Labels))
			fmt.Fprintf(w, "Identity labels:\t%s\n", strings.Join(ep.IdentityLabels, ","))
			if ep.ServiceAccount != "" {
				fmt.Fprintf(w, "Service account:\t%s\n", ep.ServiceAccount)
			}
			var ports []string
			for _, p := range ep.Ports {
				ports = append(ports, fmt.Sprintf("%s=%d/%s", p.Name, p.Port, p.Protocol))
			}
			if len(ports) == 0 {
				ports = []string{"<none>"}
			}
			fmt.Fprintf(w, "Named ports:\t%s\n", strings.Join(ports, ","))
			fmt.Fprintf(w, "Enforcement:\t%s\n", enforcement(ep))
			fmt.Fprintf(w, "Endpoint id:\t%d\n", ep.EpID)
			fmt.Fprintf(w, "Host interface:\t%s\n", ep.HostInterface)
			fmt.Fprintf(w, "Network namespace:\t%s\n", ep.Netns)
			if ep.CNI != nil {
				fmt.Fprintf(w, "CNI attachment:\tcontainer %s, interface %s\n", ep.CNI.ContainerID, ep.CNI.IfName)
			}
			if ep.Monitor {
				fmt.Fprintf(w, "Monitor:\tyes (tap contracts may name it; it is never tapped)\n")
			}
			if ep.Audit {
				fmt.Fprintf(w, "Audit:\tyes (policies not enforced; would-be drops reported as AUDIT)\n")
			}
			if c := ep.Counters; c != nil {
				fmt.Fprintf(w, "Ingress:\t%d packets, %d bytes, %d dropped\n", c.IngressPackets, c.IngressBytes, c.IngressDrops)
				fmt.Fprintf(w, "Egress:\t%d packets, %d bytes, %d dropped\n", c.EgressPackets, c.EgressBytes, c.EgressDrops)
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

func (a *app) endpointDelete() *cobra.Command {
	return &cobra.Command{
		Use:     "delete NAMESPACE/NAME",
		Aliases: []string{"del", "rm"},
		Short:   "Delete an endpoint and its network namespace",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := splitKey(args[0])
			if err != nil {
				return err
			}
			if err := a.client.DeleteEndpoint(contextOf(cmd), ns, name); err != nil {
				return err
			}
			a.printf("endpoint %s/%s deleted\n", ns, name)
			return nil
		},
	}
}

func (a *app) endpointLabel() *cobra.Command {
	return &cobra.Command{
		Use:   "label NAMESPACE/NAME k=v... [k-...]",
		Short: "Set (k=v) or remove (k-) endpoint labels; its identity and policy follow",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := splitKey(args[0])
			if err != nil {
				return err
			}
			c, err := parseLabelArgs(args[1:])
			if err != nil {
				return err
			}
			ep, err := a.client.LabelEndpoint(contextOf(cmd), ns, name, c)
			if err != nil {
				return err
			}
			a.printf("endpoint %s labelled: %s (identity %d)\n", ep.Key(), labelString(ep.Labels), ep.Identity)
			return nil
		},
	}
}

func (a *app) endpointAudit() *cobra.Command {
	return &cobra.Command{
		Use:   "audit NAMESPACE/NAME on|off",
		Short: "Put an endpoint in audit mode (its policies reported, not enforced: would-be drops forwarded as AUDIT) or take it out",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := splitKey(args[0])
			if err != nil {
				return err
			}
			var mode api.AuditMode
			switch args[1] {
			case "on":
				mode.Audit = true
			case "off":
			default:
				return fmt.Errorf("audit mode %q: want on or off", args[1])
			}
			ep, err := a.client.AuditEndpoint(contextOf(cmd), ns, name, mode)
			if err != nil {
				return err
			}
			state := "enforces its policies"
			if ep.Audit {
				state = "in audit mode: its policies are reported, not enforced"
			}
			a.printf("endpoint %s %s\n", ep.Key(), state)
			return nil
		},
	}
}

func (a *app) endpointExec() *cobra.Command {
	return &cobra.Command{
		Use:   "exec NAMESPACE/NAME -- CMD [ARGS...]",
		Short: "Run a command in the endpoint's network namespace (only the network namespace)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return fmt.Errorf("usage: rampart endpoint exec NAMESPACE/NAME -- CMD [ARGS...]")
			}
			ns, name, err := splitKey(args[0])
			if err != nil {
				return err
			}
			ep, err := a.client.GetEndpoint(contextOf(cmd), ns, name)
			if err != nil {
				return err
			}
			// nsenter --net switches only the network namespace, so the command keeps the
			// host's mounts (including /sys/fs/bpf), unlike `ip netns exec`.
			argv := append([]string{"--net=" + ep.Netns, "--"}, args[1:]...)
			c := exec.CommandContext(contextOf(cmd), "nsenter", argv...)
			c.Stdin, c.Stdout, c.Stderr = a.io.In, a.io.Out, a.io.Err
			// nsenter execs the command in place, so signalling it reaches the command.
			// Forward the interrupt as SIGTERM so the command can clean up, and only kill
			// it if it has not exited a few seconds later.
			c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
			c.WaitDelay = 5 * time.Second
			if err := c.Run(); err != nil {
				if ctxErr := contextOf(cmd).Err(); ctxErr != nil {
					return &ExitError{Code: 128 + int(syscall.SIGTERM)}
				}
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					code := ee.ExitCode()
					if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
						code = 128 + int(ws.Signal()) // as shells report it
					}
					return &ExitError{Code: code}
				}
				return fmt.Errorf("running %s: %w", args[1], err)
			}
			return nil
		},
	}
}
