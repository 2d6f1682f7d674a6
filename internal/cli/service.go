package cli

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/rampartnet/rampart/internal/api"
)

// serviceCommand declares Services (docs/services.md): a cluster address whose
// connections the kernel sends to a backend endpoint, and which policy judges there.
func (a *app) serviceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "service",
		Aliases: []string{"services", "svc"},
		Short:   "Declare, list and delete Services (a cluster address translated to backend endpoints)",
	}
	var ports, selector, addresses, clusterIPs []string
	var output string
	add := &cobra.Command{
		Use:   "add NAMESPACE/NAME --cluster-ip ADDR --port [NAME=]PORT[:TARGET][/PROTO] [--selector k=v,...] [--address ADDR]",
		Short: "Declare a Service (or change it); its backends are the endpoints of its namespace the selector picks, and the addresses listed",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := splitKey(args[0])
			if err != nil {
				return err
			}
			spec := api.ServiceSpec{ClusterIP: clusterIPs[0], Addresses: addresses}
			if len(clusterIPs) > 1 {
				spec.ClusterIPs = clusterIPs
			}
			if len(selector) > 0 {
				if spec.Selector, err = parseLabelSet(selector); err != nil {
					return err
				}
			}
			for _, p := range ports {
				sp, err := parseServicePort(p)
				if err != nil {
					return err
				}
				spec.Ports = append(spec.Ports, sp)
			}
			s, err := a.client.PutService(contextOf(cmd), ns, name, spec)
			if err != nil {
				return err
			}
			a.printf("service %s/%s: %s, backends %s\n", s.Namespace, s.Name, clusterIPsOf(s), orNone(strings.Join(s.Backends, ",")))
			return nil
		},
	}
	add.Flags().StringSliceVar(&clusterIPs, "cluster-ip", nil, "the Service's address, or an IPv4 and an IPv6 one for dual stack (required)")
	add.Flags().StringArrayVar(&ports, "port", nil, "a port [NAME=]PORT[:TARGET][/TCP|UDP] (repeatable; at least one)")
	add.Flags().StringSliceVar(&selector, "selector", nil, "backends: the endpoints of the namespace with these labels k=v,k2=v2")
	add.Flags().StringSliceVar(&addresses, "address", nil, "backends: these addresses")
	_ = add.MarkFlagRequired("cluster-ip")
	_ = add.MarkFlagRequired("port")
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the Services and their backends",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ss, err := a.client.ListServices(contextOf(cmd))
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(ss)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "SERVICE\tCLUSTER-IP\tPORTS\tBACKENDS")
			for _, s := range ss {
				var ps []string
				for _, p := range s.Ports {
					ps = append(ps, formatServicePort(p))
				}
				fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\n", s.Namespace, s.Name, clusterIPsOf(s), strings.Join(ps, ","), orNone(strings.Join(s.Backends, ",")))
			}
			return w.Flush()
		},
	}
	list.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	del := &cobra.Command{
		Use:   "delete NAMESPACE/NAME",
		Short: "Delete a Service: its address is translated no more",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := splitKey(args[0])
			if err != nil {
				return err
			}
			if err := a.client.DeleteService(contextOf(cmd), ns, name); err != nil {
				return err
			}
			a.printf("service %s/%s deleted\n", ns, name)
			return nil
		},
	}
	cmd.AddCommand(add, list, del)
	return cmd
}

// parseServicePort reads [NAME=]PORT[:TARGET][/PROTO] (protocol TCP unless given).
func parseServicePort(s string) (api.ServicePort, error) {
	var p api.ServicePort
	rest := s
	if name, after, ok := strings.Cut(rest, "="); ok {
		p.Name, rest = name, after
	}
	rest, p.Protocol, _ = strings.Cut(rest, "/")
	if p.Protocol == "" {
		p.Protocol = "TCP"
	}
	port, target, hasTarget := strings.Cut(rest, ":")
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return p, fmt.Errorf("--port %q: port %q: want 1-65535 ([NAME=]PORT[:TARGET][/PROTO])", s, port)
	}
	p.Port = uint16(n)
	if hasTarget {
		n, err := strconv.ParseUint(target, 10, 16)
		if err != nil || n == 0 {
			return p, fmt.Errorf("--port %q: target port %q: want 1-65535", s, target)
		}
		p.TargetPort = uint16(n)
	}
	return p, nil
}

func formatServicePort(p api.ServicePort) string {
	s := strconv.Itoa(int(p.Port))
	if p.TargetPort != 0 && p.TargetPort != p.Port {
		s += ":" + strconv.Itoa(int(p.TargetPort))
	}
	s += "/" + p.Protocol
	if p.Name != "" {
		s = p.Name + "=" + s
	}
	return s
}

// clusterIPsOf is a Service's cluster addresses, comma-separated.
func clusterIPsOf(s api.ServiceEntry) string {
	if len(s.ClusterIPs) > 0 {
		return strings.Join(s.ClusterIPs, ",")
	}
	return s.ClusterIP
}
