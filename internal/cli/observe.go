package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/hubble"
	"github.com/rampartnet/rampart/internal/hubble/observerpb"
)

// observeFlags are observe's flags; request turns them into what the agent is asked.
type observeFlags struct {
	req                                          api.ObserveRequest
	lbls                                         []string
	output, protocol, verdict, typ, since, until string
	cluster                                      clusterFlags
}

func (a *app) observeCommand() *cobra.Command {
	var o observeFlags
	cmd := &cobra.Command{
		Use:   "observe [--follow] [--since-start] [--last N] [--since T] [filters] [-o text|json|jsonpb]",
		Short: "Show flows: new connections, drops and L7 (HTTP) requests, with identities, verdicts, rules and reasons",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := o.request(cmd.Flags().Changed("last"), time.Now())
			if err != nil {
				return err
			}
			if o.cluster.on {
				return a.observeCluster(cmd, o.cluster, req, o.output)
			}
			var node string
			if o.output == "jsonpb" {
				// Flows name the node they were seen on, as Hubble's do: the Node's name in
				// Kubernetes mode, else unknown (empty).
				st, err := a.client.Status(contextOf(cmd))
				if err != nil {
					return err
				}
				if st.Kubernetes != nil {
					node = st.Kubernetes.NodeName
				}
			}
			enc := json.NewEncoder(a.io.Out)
			return a.client.Observe(contextOf(cmd), req, func(f api.Flow) error {
				switch o.output {
				case "json":
					return enc.Encode(f)
				case "jsonpb":
					return writeHubbleJSON(a.io.Out, f, node)
				}
				_, err := fmt.Fprintln(a.io.Out, FormatFlow(f))
				return err
			})
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&o.req.Follow, "follow", "f", false, "keep printing new flows")
	f.BoolVar(&o.req.SinceStart, "since-start", false, "print every buffered flow since the agent started")
	f.IntVar(&o.req.Last, "last", 0, "print the last N buffered flows first (default 20 without --follow)")
	f.StringVar(&o.req.Filter.Endpoint, "endpoint", "", "only flows from or to endpoint NS/NAME")
	f.StringVar(&o.req.Filter.From, "from-pod", "", "only flows from endpoints [NS/]PREFIX (as hubble: NS/ for all of NS, no NS/ for namespace default)")
	f.StringVar(&o.req.Filter.To, "to-pod", "", "only flows to endpoints [NS/]PREFIX (as --from-pod)")
	f.StringVar(&o.since, "since", "", "only flows since a time: a duration ago (5m, 1h30m) or RFC 3339 (2026-01-02T15:04:05Z); every buffered one unless --last says how many")
	f.StringVar(&o.until, "until", "", "only flows until a time (as --since)")
	f.StringVar(&o.req.Filter.Namespace, "namespace", "", "only flows from or to endpoints of namespace NS")
	f.StringArrayVar(&o.lbls, "label", nil, "only flows where a side's identity has label k=v (repeatable)")
	f.StringVar(&o.verdict, "verdict", "", "only flows with this verdict: "+strings.ToLower(strings.Join(flow.VerdictNames(), ", ")))
	f.StringVar(&o.typ, "type", "all", "l7 (HTTP requests through the L7 proxy), l3l4 (dataplane connections and drops), drop, policy-verdict (new connections; also: new) or all")
	f.Uint16Var(&o.req.Filter.Port, "port", 0, "only flows with this source or destination port")
	f.StringVar(&o.protocol, "protocol", "", "tcp, udp, icmp or sctp")
	f.StringVarP(&o.output, "output", "o", "text", "output format: text, json (Rampart's fields) or jsonpb (Hubble's flow.Flow, one GetFlowsResponse a line, as hubble observe -o json prints)")
	o.cluster.register(f, "show the flows, merged in time order,")
	return cmd
}

// request checks the flags and makes the request: times made absolute against now, and
// the last 20 flows without --follow unless --last (lastGiven) says otherwise.
func (o *observeFlags) request(lastGiven bool, now time.Time) (api.ObserveRequest, error) {
	req := o.req
	if req.Filter.Endpoint != "" {
		if _, _, err := splitKey(req.Filter.Endpoint); err != nil {
			return req, err
		}
	}
	l, err := parseLabelSet(o.lbls)
	if err != nil {
		return req, err
	}
	if len(l) > 0 {
		req.Filter.Labels = l
	}
	if o.verdict != "" {
		v, err := flow.ParseVerdict(o.verdict)
		if err != nil {
			return req, fmt.Errorf("--verdict: %w", err)
		}
		req.Filter.Verdict = v.String()
	}
	switch t := strings.ToLower(o.typ); t {
	case "", "all":
	case "l7", "l3l4", "drop":
		req.Filter.Type = t
	case "new", "policy-verdict": // hubble's name for a new connection's verdict
		req.Filter.Type = flow.EventNew.String()
	default:
		return req, fmt.Errorf("--type %q: want l7, l3l4, drop, policy-verdict (new) or all", o.typ)
	}
	for _, p := range []struct{ flag, v string }{{"--from-pod", req.Filter.From}, {"--to-pod", req.Filter.To}} {
		if strings.Count(p.v, "/") > 1 || p.v == "/" {
			return req, fmt.Errorf("%s %q: want [NAMESPACE/]POD-PREFIX", p.flag, p.v)
		}
	}
	if o.since != "" {
		if req.Filter.Since, err = parseTime(o.since, now); err != nil {
			return req, fmt.Errorf("--since: %w", err)
		}
		// hubble's --since: every flow since then, unless --last says how many.
		if !lastGiven {
			req.SinceStart = true
		}
	}
	if o.until != "" {
		if req.Filter.Until, err = parseTime(o.until, now); err != nil {
			return req, fmt.Errorf("--until: %w", err)
		}
	}
	switch p := strings.ToLower(o.protocol); p {
	case "", "tcp", "udp", "icmp", "sctp":
		req.Filter.Protocol = p
	default:
		return req, fmt.Errorf("--protocol %q: want tcp, udp, icmp or sctp", o.protocol)
	}
	if o.output != "text" && o.output != "json" && o.output != "jsonpb" {
		return req, fmt.Errorf("-o %q: want text, json or jsonpb", o.output)
	}
	if !lastGiven && !req.Follow {
		req.Last = 20
	}
	return req, nil
}

// parseTime reads hubble's time forms: a duration before now, or an RFC 3339 time.
func parseTime(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q: want a duration (5m) or an RFC 3339 time", s)
	}
	return t, nil
}

// writeHubbleJSON prints f as hubble observe -o json does: a GetFlowsResponse in
// protojson with the proto field names, on one line.
func writeHubbleJSON(w io.Writer, f api.Flow, node string) error {
	fl := hubble.Flow(f, node)
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(&observerpb.GetFlowsResponse{
		ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: fl},
		NodeName:      node,
		Time:          fl.GetTime(),
	})
	if err != nil {
		return fmt.Errorf("encoding a flow: %w", err)
	}
	var line bytes.Buffer
	if err := json.Compact(&line, b); err != nil { // protojson's spacing varies on purpose
		return fmt.Errorf("encoding a flow: %w", err)
	}
	line.WriteByte('\n')
	_, err = w.Write(line.Bytes())
	return err
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
