package policy

import (
	"fmt"
	"strconv"
	"strings"
)

// Format renders a policy's normalised rules as text, one block per rule, for people
// (explanations, `rampart get policies`) and for golden tests. It shows everything a rule
// means: subject, direction, tier and priority (ClusterNetworkPolicy), allow, deny or the
// tier's accept, deny, pass, default deny, peers, ports and HTTP rules.
func Format(p *Policy) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s (%s)\n", p.Kind, policyID(p.Namespace, p.Name), p.Source)
	for _, r := range p.Rules {
		b.WriteString(FormatRule(r))
	}
	return b.String()
}

// FormatRule renders one rule as an indented block. A ClusterNetworkPolicy rule shows its
// tier and priority after the direction, and its action as the API names it:
// "egress Admin/10 deny", "ingress Baseline/0 accept", "egress Admin/5 pass".
func FormatRule(r Rule) string {
	var b strings.Builder
	where := r.Direction.String()
	verdict := "allow"
	if r.Deny {
		verdict = "deny"
	}
	if r.Tier != TierNetworkPolicy {
		where = fmt.Sprintf("%s %s/%d", r.Direction, r.Tier, r.Priority)
		switch {
		case r.Pass:
			verdict = "pass"
		case !r.Deny:
			verdict = "accept"
		}
	}
	enforce := "default-deny"
	if !r.EnableDefaultDeny {
		enforce = "no-default-deny"
	}
	fmt.Fprintf(&b, "  rule %d %s: %s %s %s\n", r.Index, r.Description, where, verdict, enforce)
	if r.Host {
		fmt.Fprintf(&b, "    subject: nodes %s\n", r.Subject)
	} else {
		fmt.Fprintf(&b, "    subject: %s\n", r.Subject)
	}
	b.WriteString("    peers:")
	switch {
	case r.AllPeers:
		b.WriteString(" all\n")
	case len(r.Peers) == 0:
		b.WriteString(" none\n")
	default:
		b.WriteString("\n")
		for _, p := range r.Peers {
			fmt.Fprintf(&b, "      %s\n", FormatPeer(p))
		}
	}
	b.WriteString("    ports: ")
	if len(r.Ports) == 0 {
		b.WriteString("all")
	}
	for i, pr := range r.Ports {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(FormatPort(pr))
	}
	b.WriteString("\n")
	for _, pr := range r.Ports {
		if pr.HTTP != nil {
			fmt.Fprintf(&b, "    http on %s:\n", FormatPort(pr))
			for _, h := range pr.HTTP {
				fmt.Fprintf(&b, "      %s\n", FormatHTTPRule(h))
			}
		}
		if pr.DNS != nil {
			fmt.Fprintf(&b, "    dns on %s:\n", FormatPort(pr))
			for _, s := range pr.DNS {
				fmt.Fprintf(&b, "      %s\n", s)
			}
		}
	}
	return b.String()
}

// FormatHTTPRule renders an HTTP rule, e.g. `method "GET" path "/v1/.*" header x-k="v"`
// (regular expressions quoted as Go strings), or "any request" for the empty rule.
func FormatHTTPRule(h HTTPRule) string {
	var parts []string
	for _, f := range []struct{ name, re string }{{"method", h.Method}, {"path", h.Path}, {"host", h.Host}} {
		if f.re != "" {
			parts = append(parts, f.name+" "+strconv.Quote(f.re))
		}
	}
	for _, hm := range h.Headers {
		if hm.Value == "" {
			parts = append(parts, "header "+hm.Name)
		} else {
			parts = append(parts, "header "+hm.Name+"="+strconv.Quote(hm.Value))
		}
	}
	if len(parts) == 0 {
		return "any request"
	}
	return strings.Join(parts, " ")
}

// FormatPeer renders a peer, e.g. "endpoints app=web,io.kubernetes.pod.namespace=x",
// "cidr 10.0.0.0/8 except 10.96.0.0/12", "entity world", "cidrGroupRef threats" or
// "fqdn matchPattern:*.example.com".
func FormatPeer(p Peer) string {
	switch p.Kind {
	case PeerEndpoints:
		return "endpoints " + p.Selector.String()
	case PeerCIDR:
		s := "cidr " + p.CIDR.String()
		if len(p.Except) > 0 {
			ex := make([]string, len(p.Except))
			for i, e := range p.Except {
				ex[i] = e.String()
			}
			s += " except " + strings.Join(ex, ",")
		}
		return s
	case PeerEntity:
		return "entity " + p.Entity
	case PeerCIDRGroup:
		return "cidrGroupRef " + p.Group
	case PeerFQDN:
		return "fqdn " + p.FQDN.String()
	}
	return fmt.Sprintf("peer kind %d", p.Kind)
}

// FormatPort renders a port rule, e.g. "TCP/80", "UDP/5000-5010", "TCP/http", "ANY/all",
// "ICMPv6 type 128".
func FormatPort(pr PortRule) string {
	proto := ProtocolName(pr.Protocol)
	switch {
	case pr.ICMPType:
		return fmt.Sprintf("%s type %d", proto, pr.Port)
	case pr.Name != "":
		return proto + "/" + pr.Name
	case pr.Port == 0:
		return proto + "/all"
	case pr.EndPort != 0:
		return fmt.Sprintf("%s/%d-%d", proto, pr.Port, pr.EndPort)
	}
	return proto + "/" + strconv.Itoa(int(pr.Port))
}

// ProtocolName returns the manifest spelling of a protocol ("ANY" for ProtoAny).
func ProtocolName(p Protocol) string {
	switch p {
	case ProtoAny:
		return "ANY"
	case ProtoICMP:
		return "ICMP"
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	case ProtoICMPv6:
		return "ICMPv6"
	case ProtoSCTP:
		return "SCTP"
	}
	return "proto-" + strconv.Itoa(int(p))
}
