package policy

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/fqdn"
)

// This file holds the DNS-aware parts of Cilium's egress rules: toFQDNs peers and
// toPorts[].rules.dns.

// fqdnSelectors parses a list of {matchName} / {matchPattern} selectors (toFQDNs, or
// rules.dns). An empty list selects nothing; null is refused, as for other peer lists.
func (d *docParser) fqdnSelectors(e entry) ([]fqdn.Selector, error) {
	if isNull(e.val) {
		return nil, d.fail(e.val, e.path, "must be a list of selectors ({matchName: ...} or {matchPattern: ...})")
	}
	items, err := d.sequence(e.val, e.path)
	if err != nil {
		return nil, err
	}
	out := make([]fqdn.Selector, 0, len(items))
	for i, it := range items {
		s, err := d.fqdnSelector(it, indexPath(e.path, i))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// fqdnSelector parses one selector: exactly one of matchName and matchPattern.
func (d *docParser) fqdnSelector(n *yaml.Node, path string) (fqdn.Selector, error) {
	entries, err := d.mapping(n, path)
	if err != nil {
		return fqdn.Selector{}, err
	}
	var name, pattern string
	var at *yaml.Node
	atPath := path
	for _, e := range entries {
		switch e.name {
		case "matchName", "matchPattern":
			v, err := d.str(e.val, e.path)
			if err != nil {
				return fqdn.Selector{}, err
			}
			if e.name == "matchName" {
				name = v
			} else {
				pattern = v
			}
			at, atPath = e.val, e.path
		default:
			return fqdn.Selector{}, d.unknown(e)
		}
	}
	if at == nil {
		return fqdn.Selector{}, d.fail(n, path, ReasonRequired+" (matchName or matchPattern)")
	}
	s, err := fqdn.NewSelector(name, pattern)
	if err != nil {
		return fqdn.Selector{}, d.fail(at, atPath, "%v", err)
	}
	return s, nil
}

// checkDNSPorts checks the ports a rules.dns list is put on: one port each (a number or
// a name), protocol UDP, TCP or ANY (both), egress only.
func (d *docParser) checkDNSPorts(ports []PortRule, nodes []*yaml.Node, paths []string) error {
	for i, pr := range ports {
		n, p := nodes[i], paths[i]
		switch {
		case pr.Protocol != ProtoUDP && pr.Protocol != ProtoTCP && pr.Protocol != ProtoAny:
			at, ap := childField(n, p, "protocol")
			return d.fail(at, ap, "DNS rules apply only to UDP and TCP (or ANY), and the protocol is %s", ProtocolName(pr.Protocol))
		case pr.Port == 0 && pr.Name == "":
			at, ap := childField(n, p, "port")
			return d.fail(at, ap, "DNS rules need a port (usually 53): no port or port 0 means every port")
		case pr.EndPort != 0:
			at, ap := childField(n, p, "endPort")
			return d.fail(at, ap, "DNS rules on a port range are %s", ReasonNotSupported)
		}
	}
	return nil
}

// childField finds the value of key in the mapping n (at path p), or n itself.
func childField(n *yaml.Node, p, key string) (*yaml.Node, string) {
	for j := 0; j+1 < len(n.Content); j += 2 {
		if n.Content[j].Value == key && !isNull(n.Content[j+1]) {
			return n.Content[j+1], fieldPath(p, key)
		}
	}
	return n, p
}

// checkDNS is CheckL7 for a DNS port: one port, UDP, TCP or ANY, at least one selector,
// and no HTTP rules beside.
func (pr PortRule) checkDNS() error {
	switch {
	case pr.HTTP != nil:
		return fmt.Errorf("DNS rules on %s: HTTP rules cannot go with them", FormatPort(pr))
	case pr.ICMPType || pr.Protocol != ProtoUDP && pr.Protocol != ProtoTCP && pr.Protocol != ProtoAny:
		return fmt.Errorf("DNS rules on %s: only UDP and TCP can carry them", FormatPort(pr))
	case pr.Name == "" && pr.Port == 0:
		return fmt.Errorf("DNS rules on %s: they need one port", FormatPort(pr))
	case pr.Name == "" && pr.EndPort > pr.Port:
		return fmt.Errorf("DNS rules on the port range %s: not supported", FormatPort(pr))
	case len(pr.DNS) == 0:
		return fmt.Errorf("DNS port %s has no selector (matchPattern \"*\" allows every name)", FormatPort(pr))
	}
	return nil
}
