package hubble

import (
	"math"
	"net/netip"
	"strings"

	"github.com/rampartnet/rampart/internal/hubble/flowpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/version"
)

// Cilium's monitor message types (github.com/cilium/cilium/pkg/monitor/api), the
// CiliumEventType.type of a flow and what `hubble observe --type` names; that package
// is not imported, it pulls in much of the agent.
const (
	MessageTypeDrop          = 1   // "drop"
	MessageTypePolicyVerdict = 5   // "policy-verdict"
	MessageTypeAccessLog     = 129 // "l7"
)

// EmitterName is the Emitter.name of Rampart's flows.
const EmitterName = "Rampart"

// dropReasons maps Rampart's drop reasons to Hubble's where one means the same; the others
// are DROP_REASON_UNKNOWN, their name in Summary.
var dropReasons = map[string]flowpb.DropReason{
	flow.ReasonPolicyDeny.String():        flowpb.DropReason_POLICY_DENY,   // a deny rule matched
	flow.ReasonPolicyDefaultDeny.String(): flowpb.DropReason_POLICY_DENIED, // isolated, no rule allowed it
	flow.ReasonMalformed.String():         flowpb.DropReason_INVALID_PACKET_DROPPED,
	flow.ReasonFragmentUnknown.String():   flowpb.DropReason_FIRST_LOGICAL_DATAGRAM_FRAGMENT_NOT_FOUND,
	flow.ReasonUnsupportedL3.String():     flowpb.DropReason_UNSUPPORTED_L3_PROTOCOL,
	flow.ReasonSpoofedSource.String():     flowpb.DropReason_INVALID_SOURCE_IP,
	flow.ReasonIpv6Extension.String():     flowpb.DropReason_INVALID_IPV6_EXTENSION_HEADER,
}

// DropReason is Hubble's drop reason for Rampart's reason r, and whether one matches.
func DropReason(r string) (flowpb.DropReason, bool) {
	d, ok := dropReasons[r]
	return d, ok
}

var verdicts = map[string]flowpb.Verdict{
	flow.VerdictForwarded.String():  flowpb.Verdict_FORWARDED,
	flow.VerdictDropped.String():    flowpb.Verdict_DROPPED,
	flow.VerdictRedirected.String(): flowpb.Verdict_REDIRECTED,
	"AUDIT":                         flowpb.Verdict_AUDIT, // audit mode's would-be drops
}

// Flow maps a Rampart flow seen on node to Hubble's flow.
func Flow(f api.Flow, node string) *flowpb.Flow {
	out := &flowpb.Flow{
		Time:        timestamppb.New(f.Time),
		Emitter:     &flowpb.Emitter{Name: EmitterName, Version: version.Get().Version},
		Verdict:     verdicts[f.Verdict],
		NodeName:    node,
		Source:      endpoint(f.Source),
		Destination: endpoint(f.Dest),
		Type:        flowpb.FlowType_L3_L4,
	}
	switch f.Direction {
	case "ingress":
		out.TrafficDirection = flowpb.TrafficDirection_INGRESS
	case "egress":
		out.TrafficDirection = flowpb.TrafficDirection_EGRESS
	}
	if f.Protocol != "ARP" { // an ARP frame's addresses are not an IP header's
		out.IP = ipOf(f.Source.IP, f.Dest.IP)
	}
	out.L4 = l4Of(f)
	switch {
	case f.Type == api.FlowTypeL7:
		out.Type = flowpb.FlowType_L7
		out.EventType = &flowpb.CiliumEventType{Type: MessageTypeAccessLog}
		// One record per request with its response: the client to the server, so not a
		// reply; Cilium's separate response records have no counterpart here.
		out.IsReply = wrapperspb.Bool(false)
		out.L7 = l7Of(f)
	case f.Verdict == flow.VerdictDropped.String():
		out.EventType = &flowpb.CiliumEventType{Type: MessageTypeDrop}
	default:
		// A new connection's policy decision (one event per connection, not per packet):
		// what Cilium reports as a policy verdict. Its first packet, so not a reply.
		out.EventType = &flowpb.CiliumEventType{Type: MessageTypePolicyVerdict}
		out.IsReply = wrapperspb.Bool(false)
	}
	var summary []string
	if f.Reason != "" && f.Verdict != flow.VerdictForwarded.String() {
		if d, ok := dropReasons[f.Reason]; ok {
			out.DropReasonDesc = d
			out.DropReason = uint32(d) //nolint:staticcheck // deprecated, but older clients read it
			if f.Type != api.FlowTypeL7 {
				out.EventType.SubType = int32(d) // Cilium's drop events carry the reason as sub-type
			}
		} else {
			// Hubble has no code for it: the name says what happened.
			summary = append(summary, "reason="+f.Reason)
		}
	}
	if f.Protocol == "ARP" {
		summary = append(summary, "ARP "+f.Source.IP+" -> "+f.Dest.IP)
	}
	if f.Rule != nil {
		p := policyOf(f.Rule)
		deny := f.Verdict == flow.VerdictDropped.String()
		switch {
		case f.Direction == "ingress" && deny:
			out.IngressDeniedBy = []*flowpb.Policy{p}
		case f.Direction == "ingress":
			out.IngressAllowedBy = []*flowpb.Policy{p}
		case f.Direction == "egress" && deny:
			out.EgressDeniedBy = []*flowpb.Policy{p}
		case f.Direction == "egress":
			out.EgressAllowedBy = []*flowpb.Policy{p}
		}
	}
	if len(summary) > 0 {
		out.Summary = strings.Join(summary, " ") //nolint:staticcheck // deprecated, the one free-text field
	}
	return out
}

func endpoint(p api.FlowPeer) *flowpb.Endpoint {
	return &flowpb.Endpoint{
		Identity:  p.Identity,
		Namespace: p.Namespace,
		PodName:   p.Name,
		Labels:    p.Labels,
	}
}

func ipOf(src, dst string) *flowpb.IP {
	s, errS := netip.ParseAddr(src)
	d, errD := netip.ParseAddr(dst)
	if errS != nil && errD != nil {
		return nil
	}
	ip := &flowpb.IP{Source: src, Destination: dst, IpVersion: flowpb.IPVersion_IPv4}
	if s.Is6() || d.Is6() {
		ip.IpVersion = flowpb.IPVersion_IPv6
	}
	return ip
}

func l4Of(f api.Flow) *flowpb.Layer4 {
	sp, dp := uint32(f.Source.Port), uint32(f.Dest.Port)
	switch f.Protocol {
	case "TCP":
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: &flowpb.TCP{SourcePort: sp, DestinationPort: dp}}}
	case "UDP":
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: sp, DestinationPort: dp}}}
	case "SCTP":
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_SCTP{SCTP: &flowpb.SCTP{SourcePort: sp, DestinationPort: dp}}}
	case "ICMP":
		// The dataplane keeps the type, not the code: code stays 0.
		if f.ICMPType != nil {
			return &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv4{ICMPv4: &flowpb.ICMPv4{Type: uint32(*f.ICMPType)}}}
		}
	case "ICMPv6":
		if f.ICMPType != nil {
			return &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv6{ICMPv6: &flowpb.ICMPv6{Type: uint32(*f.ICMPType)}}}
		}
	}
	return nil
}

func l7Of(f api.Flow) *flowpb.Layer7 {
	if f.L7 == nil {
		return nil
	}
	l := f.L7
	url := l.Path
	if l.Host != "" {
		// The proxy sees plain HTTP only (it cannot read TLS), hence the scheme.
		url = "http://" + l.Host + l.Path
	}
	return &flowpb.Layer7{
		Type:      flowpb.L7FlowType_REQUEST,
		LatencyNs: uint64(math.Round(l.LatencyMs * 1e6)),
		Record: &flowpb.Layer7_Http{Http: &flowpb.HTTP{
			Code:     l.Status,
			Method:   l.Method,
			Url:      url,
			Protocol: l.Protocol,
		}},
	}
}

// policyOf is the policy a rule belongs to: Rampart names it KIND/NAMESPACE/NAME (no
// namespace for a cluster-wide one), or names the agent ("rampartd") for its own entries.
func policyOf(r *api.RuleRef) *flowpb.Policy {
	parts := strings.SplitN(r.Policy, "/", 3)
	if len(parts) != 3 {
		return &flowpb.Policy{Name: r.Policy}
	}
	return &flowpb.Policy{Kind: parts[0], Namespace: parts[1], Name: parts[2]}
}
