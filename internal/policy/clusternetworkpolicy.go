package policy

import (
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/labels"
)

// This file reads SIG Network's ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1,
// sigs.k8s.io/network-policy-api v0.3.0): the schema is the module's
// apis/v1beta1/clusternetworkpolicy_types.go and the validation of its CRD
// (config/crd/experimental), which the tests hold the parser to.

// The API's spellings of tiers and actions. They are the module's constants
// (v1beta1.AdminTier, v1beta1.ClusterNetworkPolicyRuleActionAccept, ...), which the tests
// compare them with; they are not imported here because the API package brings
// k8s.io/apimachinery with it, 80 packages and 2.7 MB more in the CLI and the CNI plugin,
// which link this package but nothing of Kubernetes.
const (
	cnpTierAdmin    = "Admin"
	cnpTierBaseline = "Baseline"
	cnpActionAccept = "Accept"
	cnpActionDeny   = "Deny"
	cnpActionPass   = "Pass"
)

// The CRD's bounds (MaxItems, MaxLength).
const (
	cnpMaxRules       = 25  // spec.ingress, spec.egress
	cnpMaxPeers       = 25  // from, to
	cnpMaxProtocols   = 25  // protocols
	cnpMaxNetworks    = 25  // networks
	cnpMaxDomainNames = 25  // domainNames
	cnpMaxRuleName    = 100 // name, in characters
)

// cnpDomainNameRE is the CRD's pattern for a domain name: two labels at least, an optional
// final dot, and '*' only as a leading "*." that stands for one or more labels.
var cnpDomainNameRE = regexp.MustCompile(`^(\*\.)?([a-zA-Z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.)+[a-zA-Z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.?$`)

// clusterNetworkPolicy turns a ClusterNetworkPolicy into rules: one per entry of
// spec.ingress and spec.egress, in that order, each with the policy's tier, priority and
// subject, its action (Accept: neither Deny nor Pass), and its index within its direction,
// which is its precedence among the policy's rules. Such rules never switch on default
// deny: a tier decides only for the traffic its rules match.
func (d *docParser) clusterNetworkPolicy(doc *yaml.Node, top []entry) ([]Rule, error) {
	var spec *entry
	for i, e := range top {
		switch e.name {
		case "apiVersion", "kind", "metadata":
		case "spec":
			spec = &top[i]
		case "status":
			// The implementation's to write (conditions): it says nothing about the rules.
			if !isNull(e.val) && e.val.Kind != yaml.MappingNode {
				return nil, d.fail(e.val, e.path, "must be a mapping, not %s", describe(e.val))
			}
		case "description":
			if _, err := d.str(e.val, e.path); err != nil {
				return nil, err
			}
		default:
			return nil, d.unknown(e)
		}
	}
	if spec == nil {
		return nil, d.fail(doc, "spec", ReasonRequired)
	}
	entries, err := d.mapping(spec.val, spec.path)
	if err != nil {
		return nil, err
	}
	var (
		tier                       Tier
		priority                   int64
		subject                    labels.Selector
		tierE, priorityE, subjectE *entry
		rules                      = map[Direction][]Rule{}
	)
	for i, e := range entries {
		switch e.name {
		case "tier":
			s, err := d.str(e.val, e.path)
			if err != nil {
				return nil, err
			}
			switch s {
			case cnpTierAdmin:
				tier = TierAdmin
			case cnpTierBaseline:
				tier = TierBaseline
			default:
				return nil, d.fail(e.val, e.path, "unknown tier %q (want %s or %s)", s, cnpTierAdmin, cnpTierBaseline)
			}
			tierE = &entries[i]
		case "priority":
			if priority, err = d.integer(e.val, e.path); err != nil {
				return nil, err
			}
			if priority < 0 || priority > MaxTierPriority {
				return nil, d.fail(e.val, e.path, "priority %d out of range 0-%d", priority, MaxTierPriority)
			}
			priorityE = &entries[i]
		case "subject":
			if subject, err = d.cnpSubject(e.val, e.path); err != nil {
				return nil, err
			}
			subjectE = &entries[i]
		case "ingress", "egress":
			dir := Ingress
			if e.name == "egress" {
				dir = Egress
			}
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return nil, err
			}
			if len(items) > cnpMaxRules {
				return nil, d.fail(items[cnpMaxRules], indexPath(e.path, cnpMaxRules), "more than %d rules (%d): the API allows at most %d in %s", cnpMaxRules, len(items), cnpMaxRules, e.name)
			}
			rs, err := parseEach(len(items), func(j int) (Rule, error) {
				return d.cnpRule(items[j], indexPath(e.path, j), dir)
			})
			if err != nil {
				return nil, err
			}
			for j := range rs {
				rs[j].Index = j
			}
			rules[dir] = rs // mapping refused a second ingress or egress field
		case "description":
			// Not a field of the API: informational, as for the other kinds.
			if _, err := d.str(e.val, e.path); err != nil {
				return nil, err
			}
		default:
			return nil, d.unknown(e)
		}
	}
	for _, req := range []struct {
		e    *entry
		name string
	}{{tierE, "tier"}, {priorityE, "priority"}, {subjectE, "subject"}} {
		if req.e == nil {
			return nil, d.fail(spec.val, fieldPath(spec.path, req.name), ReasonRequired)
		}
	}
	out := make([]Rule, 0, len(rules[Ingress])+len(rules[Egress]))
	for _, dir := range []Direction{Ingress, Egress} {
		for _, r := range rules[dir] {
			r.Subject, r.Tier, r.Priority = subject, tier, int32(priority)
			out = append(out, r)
		}
	}
	return out, nil
}

// cnpSubject parses spec.subject: exactly one of namespaces (every pod of the namespaces
// it selects) and pods (the pods podSelector selects in the namespaces namespaceSelector
// selects). A subject selects pods only, never a reserved identity such as the host: the
// selector requires a namespace, as a clusterwide Cilium policy's does.
func (d *docParser) cnpSubject(n *yaml.Node, path string) (labels.Selector, error) {
	entries, err := d.mapping(n, path)
	if err != nil {
		return labels.Selector{}, err
	}
	var sel labels.Selector
	var set *entry
	for i, e := range entries {
		switch e.name {
		case "namespaces", "pods":
			if isNull(e.val) {
				continue // a null field is an absent one, as the API server prunes it
			}
			if set != nil {
				return labels.Selector{}, d.fail(e.key, e.path, "a subject takes exactly one of namespaces and pods (%s is set too)", set.name)
			}
			set = &entries[i]
			if e.name == "namespaces" {
				sel, err = d.cnpNamespaces(e)
			} else {
				sel, err = d.cnpPods(e.val, e.path)
			}
			if err != nil {
				return labels.Selector{}, err
			}
		default:
			return labels.Selector{}, d.unknown(e)
		}
	}
	if set == nil {
		return labels.Selector{}, d.fail(n, path, ReasonRequired+" (a subject takes exactly one of namespaces and pods)")
	}
	return sel, nil
}

// cnpNamespaces parses a namespaces selector (of a subject or a peer): every pod of the
// namespaces it selects, written over the namespace labels endpoints carry, as a
// NetworkPolicy namespaceSelector is.
func (d *docParser) cnpNamespaces(e entry) (labels.Selector, error) {
	sel, err := d.selector(e.val, e.path, selectorSyntax{keyPrefix: labels.KeyNamespaceLabelPrefix})
	if err != nil {
		return labels.Selector{}, err
	}
	return inAnyNamespace(sel), nil
}

// cnpPods parses a pods selector (of a subject or a peer): podSelector (required) AND
// namespaceSelector (absent or empty: every namespace).
func (d *docParser) cnpPods(n *yaml.Node, path string) (labels.Selector, error) {
	entries, err := d.mapping(n, path)
	if err != nil {
		return labels.Selector{}, err
	}
	var pods, namespaces *labels.Selector
	for _, e := range entries {
		switch e.name {
		case "podSelector":
			if isNull(e.val) {
				continue
			}
			s, err := d.selector(e.val, e.path, k8sSelector)
			if err != nil {
				return labels.Selector{}, err
			}
			pods = &s
		case "namespaceSelector":
			if isNull(e.val) {
				continue
			}
			s, err := d.selector(e.val, e.path, selectorSyntax{keyPrefix: labels.KeyNamespaceLabelPrefix})
			if err != nil {
				return labels.Selector{}, err
			}
			namespaces = &s
		default:
			return labels.Selector{}, d.unknown(e)
		}
	}
	if pods == nil {
		return labels.Selector{}, d.fail(n, fieldPath(path, "podSelector"), ReasonRequired+" (use {} for every pod)")
	}
	sel := *pods
	if namespaces != nil {
		sel = sel.And(*namespaces)
	}
	return inAnyNamespace(sel), nil
}

// cnpPeerInfo is what the rule checks need to know of one peer.
type cnpPeerInfo struct {
	field string // namespaces, pods, nodes, networks or domainNames
	e     entry
}

// cnpRule parses one entry of spec.ingress or spec.egress.
func (d *docParser) cnpRule(n *yaml.Node, path string, dir Direction) (Rule, error) {
	r := Rule{Description: path, Direction: dir}
	peersField := "from"
	if dir == Egress {
		peersField = "to"
	}
	entries, err := d.mapping(n, path)
	if err != nil {
		return r, err
	}
	if isNull(n) {
		return r, d.fail(n, path, "must be a rule, not null")
	}
	var actionE, peersE *entry
	var action, name string
	var infos []cnpPeerInfo
	var named *entry // the first destinationNamedPort
	for i, e := range entries {
		switch e.name {
		case "name":
			if name, err = d.str(e.val, e.path); err != nil {
				return r, err
			}
			if c := utf8.RuneCountInString(name); c > cnpMaxRuleName {
				return r, d.fail(e.val, e.path, "a rule name has at most %d characters, not %d", cnpMaxRuleName, c)
			}
		case "action":
			if action, err = d.str(e.val, e.path); err != nil {
				return r, err
			}
			switch action {
			case cnpActionAccept:
			case cnpActionDeny:
				r.Deny = true
			case cnpActionPass:
				r.Pass = true
			default:
				return r, d.fail(e.val, e.path, "unknown action %q (want %s, %s or %s)", action, cnpActionAccept, cnpActionDeny, cnpActionPass)
			}
			actionE = &entries[i]
		case peersField:
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return r, err
			}
			if len(items) == 0 {
				return r, d.fail(e.val, e.path, "at least one peer is required")
			}
			if len(items) > cnpMaxPeers {
				return r, d.fail(items[cnpMaxPeers], indexPath(e.path, cnpMaxPeers), "more than %d peers (%d): the API allows at most %d", cnpMaxPeers, len(items), cnpMaxPeers)
			}
			for j, it := range items {
				ps, info, err := d.cnpPeer(it, indexPath(e.path, j), dir)
				if err != nil {
					return r, err
				}
				r.Peers = append(r.Peers, ps...)
				infos = append(infos, info)
			}
			peersE = &entries[i]
		case "protocols":
			if isNull(e.val) {
				continue // every protocol and port
			}
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return r, err
			}
			if len(items) == 0 {
				return r, d.fail(e.val, e.path, "at least one protocol is required (leave protocols out to match every protocol and port)")
			}
			if len(items) > cnpMaxProtocols {
				return r, d.fail(items[cnpMaxProtocols], indexPath(e.path, cnpMaxProtocols), "more than %d protocols (%d): the API allows at most %d", cnpMaxProtocols, len(items), cnpMaxProtocols)
			}
			for j, it := range items {
				pr, namedE, err := d.cnpProtocol(it, indexPath(e.path, j))
				if err != nil {
					return r, err
				}
				if namedE != nil && named == nil {
					named = namedE
				}
				r.Ports = append(r.Ports, pr)
			}
		default:
			return r, d.unknown(e)
		}
	}
	if actionE == nil {
		return r, d.fail(n, fieldPath(path, "action"), ReasonRequired+" (Accept, Deny or Pass)")
	}
	if peersE == nil {
		return r, d.fail(n, fieldPath(path, peersField), ReasonRequired)
	}
	for _, info := range infos {
		if info.field == "domainNames" && action != cnpActionAccept {
			return r, d.fail(info.e.key, info.e.path, "domainNames is only allowed in Accept rules, and this rule's action is %s", action)
		}
	}
	if named != nil {
		for _, info := range infos {
			switch info.field {
			case "networks", "nodes", "domainNames":
				return r, d.fail(named.val, named.path, "destinationNamedPort cannot be used in a rule with a %s peer (%s): only pods have named ports", info.field, info.e.path)
			}
		}
	}
	if name != "" {
		r.Description += " (" + cnpRuleName(name) + ")"
	}
	return r, nil
}

// cnpRuleName is a rule's name as descriptions show it: as written, or quoted when it
// holds characters that would not print plainly.
func cnpRuleName(s string) string {
	for _, c := range s {
		if !unicode.IsPrint(c) || c == '(' || c == ')' {
			return strconv.Quote(s)
		}
	}
	return s
}

// cnpPeer parses one entry of from or to: exactly one of namespaces and pods, and on
// egress also nodes, networks and domainNames.
func (d *docParser) cnpPeer(n *yaml.Node, path string, dir Direction) ([]Peer, cnpPeerInfo, error) {
	var info cnpPeerInfo
	entries, err := d.mapping(n, path)
	if err != nil {
		return nil, info, err
	}
	fields := "namespaces and pods"
	if dir == Egress {
		fields = "namespaces, pods, nodes, networks and domainNames"
	}
	var out []Peer
	for _, e := range entries {
		switch e.name {
		case "namespaces", "pods":
		case "nodes", "networks", "domainNames":
			if dir != Egress {
				return nil, info, d.unknown(e)
			}
		default:
			return nil, info, d.unknown(e)
		}
		if isNull(e.val) {
			continue // a null field is an absent one, as the API server prunes it
		}
		if info.field != "" {
			return nil, info, d.fail(e.key, e.path, "a peer takes exactly one of %s (%s is set too)", fields, info.field)
		}
		info = cnpPeerInfo{field: e.name, e: e}
		switch e.name {
		case "namespaces":
			sel, err := d.cnpNamespaces(e)
			if err != nil {
				return nil, info, err
			}
			out = []Peer{{Kind: PeerEndpoints, Selector: sel}}
		case "pods":
			sel, err := d.cnpPods(e.val, e.path)
			if err != nil {
				return nil, info, err
			}
			out = []Peer{{Kind: PeerEndpoints, Selector: sel}}
		case "nodes":
			sel, err := d.selector(e.val, e.path, k8sSelector)
			if err != nil {
				return nil, info, err
			}
			if len(sel.Requirements) > 0 {
				return nil, info, d.fail(e.key, e.path, "a node label selector is %s (Rampart does not know nodes' labels; nodes: {} selects every node)", ReasonNotSupported)
			}
			// Every node: the API selects the addresses of the nodes' status, which are
			// the host identity on this node and remote-node for every other.
			out = []Peer{{Kind: PeerEntity, Entity: EntityHost}, {Kind: PeerEntity, Entity: EntityRemoteNode}}
		case "networks":
			if out, err = d.cnpNetworks(e); err != nil {
				return nil, info, err
			}
		case "domainNames":
			if out, err = d.cnpDomainNames(e); err != nil {
				return nil, info, err
			}
		}
	}
	if info.field == "" {
		// A field of a newer API version that this parser does not know would land here
		// if it were dropped on the way (as typed clients do): refusing it fails closed.
		return nil, info, d.fail(n, path, "a peer needs exactly one of %s, and this one sets none", fields)
	}
	return out, info, nil
}

// cnpStringSet parses a list of 1 to max strings, no two alike (the CRD declares such
// lists as sets), each turned into a peer by peer; what names the items in messages
// ("CIDR", "domain name") and field the list ("networks", "domainNames").
func (d *docParser) cnpStringSet(e entry, max int, what, field string, peer func(s string, n *yaml.Node, path string) (Peer, error)) ([]Peer, error) {
	items, err := d.sequence(e.val, e.path)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, d.fail(e.val, e.path, "at least one %s is required", what)
	}
	if len(items) > max {
		return nil, d.fail(items[max], indexPath(e.path, max), "more than %d %ss (%d): the API allows at most %d", max, what, len(items), max)
	}
	out := make([]Peer, 0, len(items))
	seen := make(map[string]bool, len(items))
	for i, it := range items {
		p := indexPath(e.path, i)
		s, err := d.str(it, p)
		if err != nil {
			return nil, err
		}
		pe, err := peer(s, it, p)
		if err != nil {
			return nil, err
		}
		if seen[s] {
			return nil, d.fail(it, p, "duplicate %s %q (%s is a set)", what, s, field)
		}
		seen[s] = true
		out = append(out, pe)
	}
	return out, nil
}

// cnpNetworks parses a networks list: 1 to 25 CIDRs, IPv4 or IPv6, each with a prefix
// length and no host bits (the CRD's cidr(self) == cidr(self).masked()), no two alike.
func (d *docParser) cnpNetworks(e entry) ([]Peer, error) {
	return d.cnpStringSet(e, cnpMaxNetworks, "CIDR", "networks", func(s string, n *yaml.Node, p string) (Peer, error) {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return Peer{}, d.fail(n, p, "invalid CIDR %q (want an address and a prefix length, e.g. 10.0.0.0/8 or fd00::/8)", s)
		}
		if pfx != pfx.Masked() {
			return Peer{}, d.fail(n, p, "CIDR %q has bits set past its prefix length (write %s)", s, pfx.Masked())
		}
		return Peer{Kind: PeerCIDR, CIDR: pfx}, nil
	})
}

// cnpDomainNames parses a domainNames list: 1 to 25 names, no two alike. "example.com"
// matches that name only; "*.example.com" matches every name under it, however many
// labels deep (Rampart's pattern "**.example.com"). '*' means nothing else.
func (d *docParser) cnpDomainNames(e entry) ([]Peer, error) {
	return d.cnpStringSet(e, cnpMaxDomainNames, "domain name", "domainNames", func(s string, n *yaml.Node, p string) (Peer, error) {
		if !cnpDomainNameRE.MatchString(s) {
			if strings.Contains(s, "*") {
				return Peer{}, d.fail(n, p, "invalid domain name %q: '*' may only be the first label, as in \"*.example.com\" (one or more labels), never part of a label or the whole name", s)
			}
			return Peer{}, d.fail(n, p, "invalid domain name %q: at least two labels of letters, digits, '-' and '_', not starting or ending with '-' or '_'", s)
		}
		var sel fqdn.Selector
		var err error
		if rest, ok := strings.CutPrefix(s, "*."); ok {
			sel, err = fqdn.NewSelector("", "**."+rest)
		} else {
			sel, err = fqdn.NewSelector(s, "")
		}
		if err != nil {
			return Peer{}, d.fail(n, p, "invalid domain name %q: %v", s, err)
		}
		return Peer{Kind: PeerFQDN, FQDN: sel}, nil
	})
}

// cnpProtocol parses one entry of protocols: exactly one of tcp, udp, sctp (each with an
// optional destinationPort; without it every port of the protocol) and
// destinationNamedPort (a container port's name, of any protocol). named is the
// destinationNamedPort entry, if that is the one.
func (d *docParser) cnpProtocol(n *yaml.Node, path string) (pr PortRule, named *entry, err error) {
	entries, err := d.mapping(n, path)
	if err != nil {
		return pr, nil, err
	}
	var set *entry
	for i, e := range entries {
		switch e.name {
		case "tcp", "udp", "sctp", "destinationNamedPort":
		default:
			return pr, nil, d.unknown(e)
		}
		if isNull(e.val) {
			continue
		}
		if set != nil {
			return pr, nil, d.fail(e.key, e.path, "a protocol entry takes exactly one of tcp, udp, sctp and destinationNamedPort (%s is set too)", set.name)
		}
		set = &entries[i]
		switch e.name {
		case "destinationNamedPort":
			s, err := d.str(e.val, e.path)
			if err != nil {
				return pr, nil, err
			}
			if pr.Name, err = d.portName(e.val, e.path, s, portSyntax{}); err != nil {
				return pr, nil, err
			}
			// The API names no protocol: the name selects the declared port whatever
			// its protocol, as Cilium's ANY does.
			pr.Protocol = ProtoAny
			named = set
		default:
			switch e.name {
			case "tcp":
				pr.Protocol = ProtoTCP
			case "udp":
				pr.Protocol = ProtoUDP
			default:
				pr.Protocol = ProtoSCTP
			}
			if pr.Port, pr.EndPort, err = d.cnpProtocolPorts(e); err != nil {
				return pr, nil, err
			}
		}
	}
	if set == nil {
		return pr, nil, d.fail(n, path, "a protocol entry needs exactly one of tcp, udp, sctp and destinationNamedPort")
	}
	return pr, named, nil
}

// cnpProtocolPorts parses tcp, udp or sctp: {destinationPort: {number} or {range: {start,
// end}}}. Without destinationPort (or with null) every port of the protocol.
func (d *docParser) cnpProtocolPorts(e entry) (port, end uint16, err error) {
	entries, err := d.mapping(e.val, e.path)
	if err != nil {
		return 0, 0, err
	}
	for _, pe := range entries {
		if pe.name != "destinationPort" {
			return 0, 0, d.unknown(pe)
		}
		if isNull(pe.val) {
			continue
		}
		return d.cnpPort(pe.val, pe.path)
	}
	return 0, 0, nil
}

// cnpPort parses a destinationPort: exactly one of number (1-65535) and range (start <
// end, both 1-65535).
func (d *docParser) cnpPort(n *yaml.Node, path string) (port, end uint16, err error) {
	entries, err := d.mapping(n, path)
	if err != nil {
		return 0, 0, err
	}
	var set *entry
	for i, e := range entries {
		switch e.name {
		case "number", "range":
		default:
			return 0, 0, d.unknown(e)
		}
		if isNull(e.val) {
			continue
		}
		if set != nil {
			return 0, 0, d.fail(e.key, e.path, "a destinationPort takes exactly one of number and range (%s is set too)", set.name)
		}
		set = &entries[i]
		if e.name == "number" {
			v, err := d.integer(e.val, e.path)
			if err != nil {
				return 0, 0, err
			}
			if port, err = d.portNumber(e.val, e.path, v, false); err != nil {
				return 0, 0, err
			}
			continue
		}
		if port, end, err = d.cnpPortRange(e.val, e.path); err != nil {
			return 0, 0, err
		}
	}
	if set == nil {
		return 0, 0, d.fail(n, path, "a destinationPort needs exactly one of number and range (leave destinationPort out for every port)")
	}
	return port, end, nil
}

// cnpPortRange parses {start, end}: both required, 1-65535, start < end.
func (d *docParser) cnpPortRange(n *yaml.Node, path string) (start, end uint16, err error) {
	entries, err := d.mapping(n, path)
	if err != nil {
		return 0, 0, err
	}
	var startE, endE *entry
	for i, e := range entries {
		var v int64
		switch e.name {
		case "start", "end":
			if v, err = d.integer(e.val, e.path); err != nil {
				return 0, 0, err
			}
		default:
			return 0, 0, d.unknown(e)
		}
		p, err := d.portNumber(e.val, e.path, v, false)
		if err != nil {
			return 0, 0, err
		}
		if e.name == "start" {
			start, startE = p, &entries[i]
		} else {
			end, endE = p, &entries[i]
		}
	}
	switch {
	case startE == nil:
		return 0, 0, d.fail(n, fieldPath(path, "start"), ReasonRequired)
	case endE == nil:
		return 0, 0, d.fail(n, fieldPath(path, "end"), ReasonRequired)
	case start >= end:
		return 0, 0, d.fail(endE.val, endE.path, "range end %d must be greater than start %d (a single port is written number: %d)", end, start, start)
	}
	return start, end, nil
}
