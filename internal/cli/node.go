package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/rampartnet/rampart/internal/api"
)

// nodeCommand declares the other nodes of the cluster and the pods on them, until the
// Kubernetes informers feed the agent.
func (a *app) nodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "node",
		Aliases: []string{"nodes"},
		Short:   "Declare, list and delete the other nodes of the cluster",
	}
	var addr, addr6, podCIDR, podCIDR6, output string
	add := &cobra.Command{
		Use:   "add NAME --address ADDR [--pod-cidr PREFIX] [--address6 ADDR6] [--pod-cidr6 PREFIX6]",
		Short: "Declare another node (or change it): its fabric addresses and pod CIDRs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := a.client.PutNode(contextOf(cmd), args[0], api.NodeSpec{Address: addr, PodCIDR: podCIDR, PodCIDR6: podCIDR6, Address6: addr6})
			if err != nil {
				return err
			}
			a.printf("node %s: address %s, pod CIDR %s", n.Name, n.Address, orNone(n.PodCIDR))
			if n.Address6 != "" {
				a.printf(", IPv6 address %s", n.Address6)
			}
			if n.PodCIDR6 != "" {
				a.printf(", IPv6 pod CIDR %s", n.PodCIDR6)
			}
			a.printf("\n")
			return nil
		},
	}
	add.Flags().StringVar(&addr, "address", "", "the node's IPv4 address on the fabric (required)")
	add.Flags().StringVar(&podCIDR, "pod-cidr", "", "the node's pod CIDR")
	add.Flags().StringVar(&addr6, "address6", "", "the node's IPv6 address on the fabric (native routing's gateway to its IPv6 pod CIDR)")
	add.Flags().StringVar(&podCIDR6, "pod-cidr6", "", "the node's IPv6 pod CIDR (dual stack; needs --pod-cidr, and --address6 with native routing or the VXLAN overlay)")
	_ = add.MarkFlagRequired("address")
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the other nodes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			nodes, err := a.client.ListNodes(contextOf(cmd))
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(nodes)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NODE\tADDRESS\tPOD CIDR\tIPV6 ADDRESS\tIPV6 POD CIDR\tREMOTE ENDPOINTS")
			for _, n := range nodes {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\n", n.Name, n.Address, orNone(n.PodCIDR), orNone(n.Address6), orNone(n.PodCIDR6), n.RemoteEndpoints)
			}
			return w.Flush()
		},
	}
	list.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete another node and the remote endpoints on it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.client.DeleteNode(contextOf(cmd), args[0]); err != nil {
				return err
			}
			a.printf("node %s deleted\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(add, list, del)
	return cmd
}

// remoteCommand declares pods on other nodes: policy selects them by their labels.
func (a *app) remoteCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "remote",
		Aliases: []string{"remotes"},
		Short:   "Declare, list and delete pods on other nodes (remote endpoints)",
	}
	var lbls, ports []string
	var node, ip, sa, output string
	var id uint32
	var monitor bool
	add := &cobra.Command{
		Use:   "add NAMESPACE/NAME --node NODE --ip ADDR [--labels k=v,...] [--port NAME=PORT/PROTO] [--identity ID] [--service-account SA] [--monitor]",
		Short: "Declare a pod on another node (or change it); its identity follows its labels",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parsePodDecl(args[0], lbls, ports)
			if err != nil {
				return err
			}
			spec := api.RemoteEndpointSpec{Node: node, IP: ip, Labels: d.labels, Ports: d.ports, ServiceAccount: sa, Identity: id, Monitor: monitor}
			r, err := a.client.PutRemoteEndpoint(contextOf(cmd), d.ns, d.name, spec)
			if err != nil {
				return err
			}
			a.printf("remote endpoint %s/%s: node %s, ip %s, identity %d\n", r.Namespace, r.Name, r.Node, r.IP, r.Identity)
			return nil
		},
	}
	add.Flags().StringVar(&node, "node", "", "the node that hosts the pod (required)")
	add.Flags().StringVar(&ip, "ip", "", "the pod's IPv4 address (required)")
	add.Flags().StringSliceVar(&lbls, "labels", nil, "labels k=v,k2=v2")
	add.Flags().StringArrayVar(&ports, "port", nil, "the pod's named port NAME=PORT/PROTO (repeatable), for egress rules that name a port")
	add.Flags().StringVar(&sa, "service-account", "", "the pod's service account")
	add.Flags().Uint32Var(&id, "identity", 0, "the identity its own node gave the pod's labels (0: allocate here)")
	add.Flags().BoolVar(&monitor, "monitor", false, "the pod is a monitor endpoint of its node (tap contracts here may name it)")
	_ = add.MarkFlagRequired("node")
	_ = add.MarkFlagRequired("ip")
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the pods on other nodes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			rs, err := a.client.ListRemoteEndpoints(contextOf(cmd))
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(rs)
			}
			w := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ENDPOINT\tNODE\tIP\tIDENTITY\tLABELS")
			for _, r := range rs {
				fmt.Fprintf(w, "%s/%s\t%s\t%s\t%d\t%s\n", r.Namespace, r.Name, r.Node, addrPair(r.IP, r.IP6), r.Identity, labelString(r.Labels))
			}
			return w.Flush()
		},
	}
	list.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	del := &cobra.Command{
		Use:   "delete NAMESPACE/NAME",
		Short: "Delete a pod on another node",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := splitKey(args[0])
			if err != nil {
				return err
			}
			if err := a.client.DeleteRemoteEndpoint(contextOf(cmd), ns, name); err != nil {
				return err
			}
			a.printf("remote endpoint %s/%s deleted\n", ns, name)
			return nil
		},
	}
	cmd.AddCommand(add, list, del)
	return cmd
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
