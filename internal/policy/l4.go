package policy

import (
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// This file holds the pieces both manifest kinds share: ports, CIDRs, entities and ICMP.

// portSyntax tells how a port entry is written.
type portSyntax struct {
	cilium bool
}

var (
	// k8sPortNameRE is Kubernetes' IANA_SVC_NAME: lowercase alphanumerics and '-', no "--",
	// not starting or ending with '-'.
	k8sPortNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
	// ciliumPortNameRE is the same name in either case; Cilium lowercases it.
	ciliumPortNameRE = regexp.MustCompile(`^[a-zA-Z0-9]+(-[a-zA-Z0-9]+)*$`)
	hasLetterRE      = regexp.MustCompile(`[a-zA-Z]`)
	digitsRE         = regexp.MustCompile(`^[0-9]+$`)
)

// portName checks a named port and returns it as it is matched (lowercase).
func (d *docParser) portName(n *yaml.Node, path, s string, syn portSyntax) (string, error) {
	re := k8sPortNameRE
	if syn.cilium {
		re = ciliumPortNameRE
	}
	if len(s) > 15 || !re.MatchString(s) || strings.Contains(s, "--") || !hasLetterRE.MatchString(s) {
		if digitsRE.MatchString(s) {
			return "", d.fail(n, path, "invalid port %q: a quoted number is a port name, and names need a letter (write the number unquoted)", s)
		}
		return "", d.fail(n, path, "invalid port name %q: at most 15 lowercase letters, digits and '-', with at least one letter", s)
	}
	return strings.ToLower(s), nil
}

// portNumber checks a port number. zeroOK allows 0, which Cilium reads as "all ports".
func (d *docParser) portNumber(n *yaml.Node, path string, v int64, zeroOK bool) (uint16, error) {
	min := int64(1)
	if zeroOK {
		min = 0
	}
	if v < min || v > 65535 {
		return 0, d.fail(n, path, "port %d out of range %d-65535", v, min)
	}
	return uint16(v), nil
}

// portEntry parses one entry of NetworkPolicy ports or of Cilium toPorts.ports:
// protocol, port (number or name) and endPort.
//
// Kubernetes: protocol TCP (default), UDP or SCTP; port 1-65535 or a name; absent = all
// ports of the protocol. Cilium: protocol ANY (default: TCP, UDP and SCTP), TCP, UDP, SCTP,
// ICMP or ICMPv6, any case; port "0" or absent = all ports.
func (d *docParser) portEntry(n *yaml.Node, path string, syn portSyntax) (PortRule, error) {
	pr := PortRule{Protocol: ProtoTCP}
	if syn.cilium {
		pr.Protocol = ProtoAny
	}
	entries, err := d.mapping(n, path)
	if err != nil {
		return pr, err
	}
	var portE, endE, protoE *entry
	var end int64
	for i, e := range entries {
		switch e.name {
		case "protocol":
			if isNull(e.val) {
				continue
			}
			s, err := d.str(e.val, e.path)
			if err != nil {
				return pr, err
			}
			if pr.Protocol, err = d.protocol(e.val, e.path, s, syn); err != nil {
				return pr, err
			}
			protoE = &entries[i]
		case "port":
			if isNull(e.val) {
				continue
			}
			portE = &entries[i]
			switch {
			case e.val.Kind == yaml.ScalarNode && e.val.Tag == "!!int":
				v, err := d.integer(e.val, e.path)
				if err != nil {
					return pr, err
				}
				if pr.Port, err = d.portNumber(e.val, e.path, v, syn.cilium); err != nil {
					return pr, err
				}
			case e.val.Kind == yaml.ScalarNode && e.val.Tag == "!!str":
				s := e.val.Value
				if syn.cilium && digitsRE.MatchString(s) {
					// Cilium writes port numbers as strings ("80"). A leading zero is
					// refused: Cilium would read "080" as octal.
					v, err := strconv.ParseInt(s, 10, 64)
					if err != nil || (len(s) > 1 && s[0] == '0') {
						return pr, d.fail(e.val, e.path, "invalid port %q", s)
					}
					if pr.Port, err = d.portNumber(e.val, e.path, v, true); err != nil {
						return pr, err
					}
					continue
				}
				if pr.Name, err = d.portName(e.val, e.path, s, syn); err != nil {
					return pr, err
				}
			default:
				return pr, d.fail(e.val, e.path, "must be a port number or name, not %s", describe(e.val))
			}
		case "endPort":
			if isNull(e.val) {
				continue
			}
			if end, err = d.integer(e.val, e.path); err != nil {
				return pr, err
			}
			endE = &entries[i]
		default:
			return pr, d.unknown(e)
		}
	}
	if endE != nil && !(syn.cilium && end == 0) { // Cilium: endPort 0 means no range
		switch {
		case pr.Name != "":
			return pr, d.fail(endE.val, endE.path, "endPort cannot be used with a named port")
		case pr.Port == 0:
			return pr, d.fail(endE.val, endE.path, "endPort needs a port")
		case end < int64(pr.Port) || end > 65535:
			return pr, d.fail(endE.val, endE.path, "endPort %d must be between port %d and 65535", end, pr.Port)
		}
		if end > int64(pr.Port) {
			pr.EndPort = uint16(end)
		}
	}
	if (pr.Protocol == ProtoICMP || pr.Protocol == ProtoICMPv6) && portE != nil && (pr.Port != 0 || pr.Name != "") {
		return pr, d.fail(portE.val, portE.path, "a port cannot be used with protocol %s (use icmps to match ICMP types)", protoE.val.Value)
	}
	return pr, nil
}

// protocol parses a protocol name.
func (d *docParser) protocol(n *yaml.Node, path, s string, syn portSyntax) (Protocol, error) {
	if !syn.cilium {
		switch s {
		case "TCP":
			return ProtoTCP, nil
		case "UDP":
			return ProtoUDP, nil
		case "SCTP":
			return ProtoSCTP, nil
		}
		return 0, d.fail(n, path, "unsupported protocol %q (want TCP, UDP or SCTP)", s)
	}
	switch strings.ToUpper(s) {
	case "ANY":
		return ProtoAny, nil
	case "TCP":
		return ProtoTCP, nil
	case "UDP":
		return ProtoUDP, nil
	case "SCTP":
		return ProtoSCTP, nil
	case "ICMP":
		return ProtoICMP, nil
	case "ICMPV6":
		return ProtoICMPv6, nil
	case "VRRP", "IGMP", "GRE", "IPIP", "IPV6", "ESP", "AH":
		// Cilium's "extended IP protocols".
		return 0, d.fail(n, path, "protocol %q %s", s, ReasonNotSupported)
	}
	return 0, d.fail(n, path, "unknown protocol %q (want TCP, UDP, SCTP, ICMP, ICMPv6 or ANY)", s)
}

// prefix parses a CIDR. allowAddr accepts a bare address as a host prefix (Cilium's
// toCIDR does). Host bits are cleared.
func (d *docParser) prefix(n *yaml.Node, path string, allowAddr bool) (netip.Prefix, error) {
	s, err := d.str(n, path)
	if err != nil {
		return netip.Prefix{}, err
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		if a, aerr := netip.ParseAddr(s); aerr == nil && allowAddr && a.Zone() == "" {
			return netip.PrefixFrom(a, a.BitLen()), nil
		}
		return netip.Prefix{}, d.fail(n, path, "invalid CIDR %q", s)
	}
	return p.Masked(), nil
}

// cidrPeer builds a CIDR peer with its except list; strict reports an except equal to the
// CIDR as an error (Kubernetes requires a strict subset, Cilium allows equality).
func (d *docParser) cidrPeer(cidrNode *yaml.Node, cidrPath string, exceptNode *yaml.Node, exceptPath string, strict bool) (Peer, error) {
	peer := Peer{Kind: PeerCIDR}
	var err error
	if peer.CIDR, err = d.prefix(cidrNode, cidrPath, false); err != nil {
		return peer, err
	}
	if exceptNode == nil {
		return peer, nil
	}
	items, err := d.sequence(exceptNode, exceptPath)
	if err != nil {
		return peer, err
	}
	for i, it := range items {
		p := indexPath(exceptPath, i)
		ex, err := d.prefix(it, p, false)
		if err != nil {
			return peer, err
		}
		inside := ex.Addr().Is4() == peer.CIDR.Addr().Is4() && peer.CIDR.Contains(ex.Addr()) && ex.Bits() >= peer.CIDR.Bits()
		if !inside || (strict && ex.Bits() == peer.CIDR.Bits()) {
			return peer, d.fail(it, p, "except %s is not inside CIDR %s", ex, peer.CIDR)
		}
		peer.Except = append(peer.Except, ex)
	}
	return peer, nil
}

var knownEntities = map[string]bool{
	EntityWorld: true, EntityHost: true, EntityCluster: true, EntityAll: true,
	EntityRemoteNode: true, EntityHealth: true, EntityInit: true, EntityUnmanaged: true,
	EntityKubeAPIServer: true, EntityIngress: true,
}

// entity checks an entity name.
func (d *docParser) entity(n *yaml.Node, path string) (Peer, error) {
	s, err := d.str(n, path)
	if err != nil {
		return Peer{}, err
	}
	switch {
	case knownEntities[s]:
		return Peer{Kind: PeerEntity, Entity: s}, nil
	case s == "world-ipv4" || s == "world-ipv6":
		return Peer{}, d.fail(n, path, "entity %q %s", s, ReasonNotSupported)
	}
	return Peer{}, d.fail(n, path, "unknown entity %q", s)
}

// ICMP type names, as Cilium spells them (pkg/policy/api/icmp.go).
var (
	icmpV4Types = map[string]uint16{
		"EchoReply": 0, "DestinationUnreachable": 3, "Redirect": 5, "Echo": 8, "EchoRequest": 8,
		"RouterAdvertisement": 9, "RouterSelection": 10, "TimeExceeded": 11, "ParameterProblem": 12,
		"Timestamp": 13, "TimestampReply": 14, "Photuris": 40, "ExtendedEchoRequest": 42,
		"ExtendedEchoReply": 43,
	}
	icmpV6Types = map[string]uint16{
		"DestinationUnreachable": 1, "PacketTooBig": 2, "TimeExceeded": 3, "ParameterProblem": 4,
		"EchoRequest": 128, "EchoReply": 129, "MulticastListenerQuery": 130,
		"MulticastListenerReport": 131, "MulticastListenerDone": 132, "RouterSolicitation": 133,
		"RouterAdvertisement": 134, "NeighborSolicitation": 135, "NeighborAdvertisement": 136,
		"RedirectMessage": 137, "RouterRenumbering": 138, "ICMPNodeInformationQuery": 139,
		"ICMPNodeInformationResponse": 140, "InverseNeighborDiscoverySolicitation": 141,
		"InverseNeighborDiscoveryAdvertisement": 142, "HomeAgentAddressDiscoveryRequest": 144,
		"HomeAgentAddressDiscoveryReply": 145, "MobilePrefixSolicitation": 146,
		"MobilePrefixAdvertisement": 147, "DuplicateAddressRequestCodeSuffix": 157,
		"DuplicateAddressConfirmationCodeSuffix": 158, "ExtendedEchoRequest": 160,
		"ExtendedEchoReply": 161,
	}
)

// icmpRule parses one entry of Cilium icmps: {fields: [{type, family}]}.
func (d *docParser) icmpRule(n *yaml.Node, path string) ([]PortRule, error) {
	entries, err := d.mapping(n, path)
	if err != nil {
		return nil, err
	}
	var out []PortRule
	seenFields := false
	for _, e := range entries {
		if e.name != "fields" {
			return nil, d.unknown(e)
		}
		items, err := d.sequence(e.val, e.path)
		if err != nil {
			return nil, err
		}
		for i, it := range items {
			pr, err := d.icmpField(it, indexPath(e.path, i))
			if err != nil {
				return nil, err
			}
			out = append(out, pr)
		}
		seenFields = true
	}
	if !seenFields || len(out) == 0 {
		return nil, d.fail(n, fieldPath(path, "fields"), "at least one ICMP field is required")
	}
	return out, nil
}

func (d *docParser) icmpField(n *yaml.Node, path string) (PortRule, error) {
	pr := PortRule{Protocol: ProtoICMP, ICMPType: true}
	entries, err := d.mapping(n, path)
	if err != nil {
		return pr, err
	}
	var typeE *entry
	for i, e := range entries {
		switch e.name {
		case "family":
			if isNull(e.val) {
				continue
			}
			s, err := d.str(e.val, e.path)
			if err != nil {
				return pr, err
			}
			switch s {
			case "IPv4":
				pr.Protocol = ProtoICMP
			case "IPv6":
				pr.Protocol = ProtoICMPv6
			default:
				return pr, d.fail(e.val, e.path, "unknown family %q (want IPv4 or IPv6)", s)
			}
		case "type":
			typeE = &entries[i]
		default:
			return pr, d.unknown(e)
		}
	}
	if typeE == nil || isNull(typeE.val) {
		return pr, d.fail(n, fieldPath(path, "type"), ReasonRequired)
	}
	v := typeE.val
	names, family := icmpV4Types, "IPv4"
	if pr.Protocol == ProtoICMPv6 {
		names, family = icmpV6Types, "IPv6"
	}
	switch {
	case v.Kind == yaml.ScalarNode && v.Tag == "!!int":
		t, err := d.integer(v, typeE.path)
		if err != nil {
			return pr, err
		}
		if t < 0 || t > 255 {
			return pr, d.fail(v, typeE.path, "ICMP type %d out of range 0-255", t)
		}
		pr.Port = uint16(t)
	case v.Kind == yaml.ScalarNode && v.Tag == "!!str":
		if t, err := strconv.ParseUint(v.Value, 10, 8); err == nil && digitsRE.MatchString(v.Value) {
			pr.Port = uint16(t)
			break
		}
		t, ok := names[v.Value]
		if !ok {
			return pr, d.fail(v, typeE.path, "unknown %s ICMP type %q", family, v.Value)
		}
		pr.Port = t
	default:
		return pr, d.fail(v, typeE.path, "must be an ICMP type number or name, not %s", describe(v))
	}
	return pr, nil
}
