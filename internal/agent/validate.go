package agent

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
)

var (
	dnsLabelRE     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	labelValueRE   = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	portNameRE     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// validateNamespace checks a namespace name (a DNS label, as in Kubernetes).
func validateNamespace(ns string) error {
	if len(ns) > 63 || !dnsLabelRE.MatchString(ns) {
		return api.BadRequest("namespace %q: want a DNS label (lowercase letters, digits, '-', at most 63)", ns)
	}
	return nil
}

// validateName checks an endpoint name (a DNS subdomain, kept short enough for the
// namespace file name).
func validateName(name string) error {
	if len(name) > 128 || !dnsSubdomainRE.MatchString(name) {
		return api.BadRequest("endpoint name %q: want a DNS subdomain (lowercase letters, digits, '-', '.', at most 128)", name)
	}
	return nil
}

// reservedKey reports label keys the agent sets itself: a user label with one of them could
// make an endpoint look like it is in another namespace.
func reservedKey(k string) bool {
	return k == labels.KeyNamespace || k == labels.KeyServiceAccount || k == labels.KeyCluster ||
		strings.HasPrefix(k, labels.KeyNamespaceLabelPrefix) || strings.HasPrefix(k, "reserved:") ||
		strings.HasPrefix(k, "io.cilium.k8s.policy.")
}

// validateLabels normalises and checks user labels (of an endpoint or a namespace).
func validateLabels(in map[string]string) (labels.Labels, error) {
	out := make(labels.Labels, len(in))
	for k, v := range in {
		nk := labels.NormalizeKey(k)
		if err := labels.ValidateKey(nk); err != nil {
			return nil, api.BadRequest("label %q: %v", k, err)
		}
		if reservedKey(nk) {
			return nil, api.BadRequest("label %q: key is reserved (set by the agent)", k)
		}
		if len(v) > 63 || !labelValueRE.MatchString(v) {
			return nil, api.BadRequest("label %s=%q: invalid value (at most 63 letters, digits, '-', '_', '.', starting and ending alphanumeric)", k, v)
		}
		out[nk] = v
	}
	return out, nil
}

func parseProtocol(s string) (policy.Protocol, error) {
	switch strings.ToUpper(s) {
	case "TCP":
		return policy.ProtoTCP, nil
	case "UDP":
		return policy.ProtoUDP, nil
	case "SCTP":
		return policy.ProtoSCTP, nil
	case "ICMP":
		return policy.ProtoICMP, nil
	case "ICMPV6":
		return policy.ProtoICMPv6, nil
	}
	return 0, fmt.Errorf("unknown protocol %q (want TCP, UDP, SCTP, ICMP or ICMPv6)", s)
}

func protocolName(p uint8) string {
	switch policy.Protocol(p) {
	case policy.ProtoTCP:
		return "TCP"
	case policy.ProtoUDP:
		return "UDP"
	case policy.ProtoSCTP:
		return "SCTP"
	case policy.ProtoICMP:
		return "ICMP"
	case policy.ProtoICMPv6:
		return "ICMPv6"
	case policy.ProtoAny:
		return "ANY"
	}
	return fmt.Sprintf("proto-%d", p)
}

// validatePorts checks named ports: IANA service names, unique, ports 1-65535, TCP/UDP/SCTP.
func validatePorts(in []api.NamedPort) ([]PortRecord, error) {
	seen := map[string]bool{}
	out := make([]PortRecord, 0, len(in))
	for _, p := range in {
		if len(p.Name) > 15 || !portNameRE.MatchString(p.Name) || !strings.ContainsAny(p.Name, "abcdefghijklmnopqrstuvwxyz") {
			return nil, api.BadRequest("port name %q: want an IANA service name (at most 15 lowercase letters, digits, '-', with a letter)", p.Name)
		}
		if seen[p.Name] {
			return nil, api.BadRequest("port name %q declared twice", p.Name)
		}
		seen[p.Name] = true
		if p.Port == 0 {
			return nil, api.BadRequest("port %s: number must be 1-65535", p.Name)
		}
		proto := p.Protocol
		if proto == "" {
			proto = "TCP"
		}
		pr, err := parseProtocol(proto)
		if err != nil || pr == policy.ProtoICMP {
			return nil, api.BadRequest("port %s: protocol %q: want TCP, UDP or SCTP", p.Name, p.Protocol)
		}
		out = append(out, PortRecord{Name: p.Name, Port: p.Port, Protocol: protocolName(uint8(pr))})
	}
	return out, nil
}

// validPortRecords checks named ports that did not come through the API (a pod's
// container ports, from the Kubernetes view) as validatePorts does; nil for none.
func validPortRecords(in []PortRecord) ([]PortRecord, error) {
	if len(in) == 0 {
		return nil, nil
	}
	return validatePorts(apiPorts(in))
}

// apiPorts is the API's form of named ports; nil for none.
func apiPorts(in []PortRecord) []api.NamedPort {
	var out []api.NamedPort
	for _, p := range in {
		out = append(out, api.NamedPort{Name: p.Name, Port: p.Port, Protocol: p.Protocol})
	}
	return out
}
