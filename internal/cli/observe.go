package cli

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/flow"
)

func (a *app) observeCommand() *cobra.Command {
	var (
		req      api.ObserveRequest
		lbls     []string
		output   string
		protocol string
		verdict  string
		typ      string
	)
	cmd := &cobra.Command{
		Use:   "observe [--follow] [--since-start] [--last N] [filters] [-o json|text]",
		Short: "Show flows: new connections, drops and L7 (HTTP) requests, with identities, verdicts, rules and reasons",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.Filter.Endpoint != "" {
				if _, _, err := splitKey(req.Filter.Endpoint); err != nil {
					return err
				}
			}
			l, err := parseLabelSet(lbls)
			if err != nil {
				return err
			}
			if len(l) > 0 {
				req.Filter.Labels = l
			}
			if verdict != "" {
				v, err := flow.ParseVerdict(verdict)
				if err != nil {
					return fmt.Errorf("--verdict: %w", err)
				}
				req.Filter.Verdict = v.String()
			}
			switch t := strings.ToLower(typ); t {
			case "", "all":
			case "l7", "l3l4":
				req.Filter.Type = t
			default:
				return fmt.Errorf("--type %q: want l7, l3l4 or all", typ)
			}
			switch p := strings.ToLower(protocol); p {
			case "", "tcp", "udp", "icmp", "sctp":
				req.Filter.Protocol = p
			default:
				return fmt.Errorf("--protocol %q: want tcp, udp, icmp or sctp", protocol)
			}
			if output != "text" && output != "json" {
				return fmt.Errorf("-o %q: want text or json", output)
			}
			if !cmd.Flags().Changed("last") && !req.Follow {
				req.Last = 20
			}
			enc := json.NewEncoder(a.io.Out)
			return a.client.Observe(contextOf(cmd), req, func(f api.Flow) error {
				if output == "json" {
					return enc.Encode(f)
				}
				_, err := fmt.Fprintln(a.io.Out, FormatFlow(f))
				return err
			})
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&req.Follow, "follow", "f", false, "keep printing new flows")
	f.BoolVar(&req.SinceStart, "since-start", false, "print every buffered flow since the agent started")
	f.IntVar(&req.Last, "last", 0, "print the last N buffered flows first (default 20 without --follow)")
	f.StringVar(&req.Filter.Endpoint, "endpoint", "", "only flows from or to endpoint NS/NAME")
	f.StringVar(&req.Filter.Namespace, "namespace", "", "only flows from or to endpoints of namespace NS")
	f.StringArrayVar(&lbls, "label", nil, "only flows where a side's identity has label k=v (repeatable)")
	f.StringVar(&verdict, "verdict", "", "only flows with this verdict: "+strings.ToLower(strings.Join(flow.VerdictNames(), ", ")))
	f.StringVar(&typ, "type", "all", "l7 (HTTP requests through the L7 proxy), l3l4 (dataplane connections and drops) or all")
	f.Uint16Var(&req.Filter.Port, "port", 0, "only flows with this source or destination port")
	f.StringVar(&protocol, "protocol", "", "tcp, udp, icmp or sctp")
	f.StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

// FormatFlow renders a flow on one line, e.g.
//
//	12:00:01.123 x/a (id 260) -> y/b (id 261) TCP 198.18.0.5:40000 -> 198.18.0.7:80 egress FORWARDED rule=NetworkPolicy/y/allow-x ingress[0]
//	12:00:01.234 x/a (id 260) -> y/b (id 261) TCP 198.18.0.5:40002 -> 198.18.0.7:80 egress FORWARDED (L7 send-side verdict) rule=CiliumNetworkPolicy/y/l7 ingress[0]
//	12:00:01.300 shop/client (id 263) -> shop/web (id 264) TCP 198.18.0.5:40004 -> 198.18.0.6:8080 ingress FORWARDED tapped
//	12:00:01.456 sw/xwing (id 262) -> sw/deathstar (id 261) HTTP/1.1 198.18.0.9:40002 -> 198.18.0.7:80 ingress DROPPED PUT deathstar /v1/exhaust-port 403 0.8ms reason=l7-denied
func FormatFlow(f api.Flow) string {
	var b strings.Builder
	b.WriteString(f.Time.Local().Format("15:04:05.000"))
	proto := f.Protocol
	if f.L7 != nil && f.L7.Protocol != "" {
		proto = f.L7.Protocol
	}
	fmt.Fprintf(&b, " %s (id %d) -> %s (id %d) %s ", peerName(f.Source), f.Source.Identity, peerName(f.Dest), f.Dest.Identity, proto)
	switch {
	case f.ICMPType != nil:
		fmt.Fprintf(&b, "%s -> %s type %d", f.Source.IP, f.Dest.IP, *f.ICMPType)
	case f.Protocol == "TCP" || f.Protocol == "UDP" || f.Protocol == "SCTP":
		fmt.Fprintf(&b, "%s -> %s", net.JoinHostPort(f.Source.IP, strconv.Itoa(int(f.Source.Port))),
			net.JoinHostPort(f.Dest.IP, strconv.Itoa(int(f.Dest.Port))))
	default:
		fmt.Fprintf(&b, "%s -> %s", f.Source.IP, f.Dest.IP)
	}
	fmt.Fprintf(&b, " %s %s", f.Direction, f.Verdict)
	if l := f.L7; l != nil {
		host := l.Host
		if host == "" {
			host = "-"
		}
		fmt.Fprintf(&b, " %s %s %s %d %.1fms", orDash(l.Method), host, orDash(l.Path), l.Status, l.LatencyMs)
	}
	if f.Verdict == flow.VerdictRedirected.String() {
		b.WriteString(" to L7 proxy")
	}
	if f.FromProxy {
		b.WriteString(" (from L7 proxy)")
	}
	if slices.Contains(f.Flags, flow.FlagSendSide.String()) {
		b.WriteString(" (L7 send-side verdict)")
	}
	if slices.Contains(f.Flags, flow.FlagTapped.String()) {
		// A tap rule matched the flow's first packet: mirrored to or diverted through a
		// monitor (or, its monitor unavailable, dropped or passed as its contract says).
		b.WriteString(" tapped")
	}
	if f.Verdict != flow.VerdictForwarded.String() && f.Verdict != flow.VerdictRedirected.String() && f.Reason != "" {
		fmt.Fprintf(&b, " reason=%s", f.Reason)
	}
	if f.Rule != nil {
		fmt.Fprintf(&b, " rule=%s", ruleString(f.Rule))
	}
	if f.CIDRGroup != "" {
		fmt.Fprintf(&b, " cidrGroupRef=%s", f.CIDRGroup)
	}
	if len(f.DefaultDenyBy) > 0 {
		fmt.Fprintf(&b, " defaultDenyBy=%s", strings.Join(f.DefaultDenyBy, ","))
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// peerName is ns/name for endpoints (ns/name@node for pods on other nodes), the reserved
// or CIDR label for other identities, else the address.
func peerName(p api.FlowPeer) string {
	if p.Name != "" && p.Node != "" {
		return p.Namespace + "/" + p.Name + "@" + p.Node
	}
	if p.Name != "" {
		return p.Namespace + "/" + p.Name
	}
	for _, l := range p.Labels {
		if strings.HasPrefix(l, "reserved:") {
			return strings.TrimPrefix(l, "reserved:")
		}
		if strings.HasPrefix(l, "cidr:") {
			return strings.Fields(l)[0]
		}
	}
	if p.IP == "" {
		return "?"
	}
	return p.IP
}
