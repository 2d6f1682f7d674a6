package policy

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/labels"
)

var ciliumSelector = selectorSyntax{cilium: true}

// ciliumPolicy turns a CiliumNetworkPolicy or CiliumClusterwideNetworkPolicy (spec and/or
// specs) into rules.
func (d *docParser) ciliumPolicy(doc *yaml.Node, top []entry) ([]Rule, error) {
	var out []Rule
	found := false
	for _, e := range top {
		switch e.name {
		case "apiVersion", "kind", "metadata":
		case "description":
			if _, err := d.str(e.val, e.path); err != nil {
				return nil, err
			}
		case "spec":
			rs, _, err := d.ciliumRule(e.val, e.path)
			if err != nil {
				return nil, err
			}
			out = append(out, rs...)
			found = true
		case "specs":
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return nil, err
			}
			if len(items) == 0 {
				return nil, d.fail(e.val, e.path, "at least one rule is required")
			}
			for i, it := range items {
				rs, _, err := d.ciliumRule(it, indexPath(e.path, i))
				if err != nil {
					return nil, err
				}
				out = append(out, rs...)
			}
			found = true
		default:
			return nil, d.unknown(e)
		}
	}
	if !found {
		return nil, d.fail(doc, "spec", ReasonRequired+" (spec or specs)")
	}
	return out, nil
}

// ruleArray turns a Cilium JSON rule array (the `cilium policy import` format: a list of
// rules without apiVersion, kind or metadata) into one CiliumNetworkPolicy in namespace
// "default". Its name comes from a "name" (or io.cilium.k8s.policy.name) rule label, else
// from the file name without extension.
func (d *docParser) ruleArray(n *yaml.Node) (*Policy, error) {
	d.kind = KindCiliumNetworkPolicy
	d.namespace = defaultNamespace
	items, err := d.sequence(n, "")
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, d.fail(n, "", "an empty list of Cilium rules")
	}
	fallback := filepath.Base(d.source)
	fallback = strings.TrimSuffix(fallback, filepath.Ext(fallback))
	if d.doc > 1 {
		fallback = fmt.Sprintf("%s-%d", fallback, d.doc)
	}
	if d.name = d.arrayNameHint(items); d.name == "" {
		d.name = fallback
	}
	var rules []Rule
	var name string
	var nameAt *yaml.Node
	var namePath string
	for i, it := range items {
		path := indexPath("", i)
		rs, lbl, err := d.ciliumRule(it, path)
		if err != nil {
			return nil, err
		}
		if lbl.name != "" {
			if name != "" && lbl.name != name {
				return nil, d.fail(lbl.at, lbl.path, "rules of one array name different policies (%q at %s, %q here)", name, namePath, lbl.name)
			}
			name, nameAt, namePath = lbl.name, lbl.at, lbl.path
		}
		rules = append(rules, rs...)
	}
	if name == "" {
		if !validName(fallback) {
			return nil, d.fail(n, "", "a Cilium rule array needs a \"name\" label: %q (from the file name) is not a valid policy name", fallback)
		}
		name = fallback
	} else if !validName(name) {
		return nil, d.fail(nameAt, namePath, "invalid policy name %q: must be lowercase alphanumerics, '-' and '.', at most 253 characters", name)
	}
	d.name = name
	for i := range rules {
		rules[i].Index = i
	}
	p := &Policy{Kind: d.kind, Namespace: d.namespace, Name: d.name, Source: d.sourceName(), Rules: rules}
	specs, err := d.toJSON(n)
	if err != nil {
		return nil, err
	}
	// Raw is a CiliumNetworkPolicy equivalent to the array, so that it parses to the same
	// policy whatever name it is later read under.
	var raw bytes.Buffer
	raw.WriteString(`{"apiVersion":"` + apiCilium + `","kind":"` + string(KindCiliumNetworkPolicy) + `","metadata":{"name":`)
	writeJSONString(&raw, d.name)
	raw.WriteString(`,"namespace":`)
	writeJSONString(&raw, d.namespace)
	raw.WriteString(`},"specs":`)
	raw.Write(specs)
	raw.WriteString("}")
	p.Raw = raw.Bytes()
	return p, nil
}

// arrayNameHint finds a name label without checking anything, so that errors in the rules
// can already name the policy.
func (d *docParser) arrayNameHint(items []*yaml.Node) string {
	for _, it := range items {
		if it.Kind != yaml.MappingNode {
			continue
		}
		for i := 0; i+1 < len(it.Content); i += 2 {
			if it.Content[i].Value != "labels" || it.Content[i+1].Kind != yaml.SequenceNode {
				continue
			}
			for _, l := range it.Content[i+1].Content {
				if name, ok := nameLabel(l); ok {
					return name
				}
			}
		}
	}
	return ""
}

// nameLabel reports whether a rule label {key, value, source} names the policy.
func nameLabel(l *yaml.Node) (string, bool) {
	if l.Kind != yaml.MappingNode {
		return "", false
	}
	var key, value string
	for i := 0; i+1 < len(l.Content); i += 2 {
		switch l.Content[i].Value {
		case "key":
			key = l.Content[i+1].Value
		case "value":
			value = l.Content[i+1].Value
		}
	}
	switch labels.NormalizeKey(key) {
	case "name", "io.cilium.k8s.policy.name":
		return value, value != ""
	}
	return "", false
}

// ruleLabelInfo is what a rule's labels tell about the policy name.
type ruleLabelInfo struct {
	name string
	at   *yaml.Node
	path string
}

// ciliumRule parses one Cilium rule (a spec, an entry of specs, or an element of a rule
// array) into rules.
//
// Default deny: a direction is enforced when the rule has that direction's allow or deny
// key at all (even with a null or empty value), unless enableDefaultDeny says otherwise
// for the direction. An enforced direction with no rules still yields one rule, with no
// peers, that only switches enforcement on.
func (d *docParser) ciliumRule(n *yaml.Node, path string) ([]Rule, ruleLabelInfo, error) {
	var lbl ruleLabelInfo
	entries, err := d.mapping(n, path)
	if err != nil {
		return nil, lbl, err
	}
	if isNull(n) {
		return nil, lbl, d.fail(n, path, "must be a rule, not null")
	}
	dirs := map[Direction]*ciliumDirection{Ingress: {}, Egress: {}}
	var subject labels.Selector
	var subjectE *entry
	// Known before the directions are parsed: a host policy refuses some of their fields.
	d.host = slices.ContainsFunc(entries, func(e entry) bool { return e.name == "nodeSelector" })
	defer func() { d.host = false }()
	for i, e := range entries {
		switch e.name {
		case "endpointSelector", "nodeSelector":
			if subjectE != nil {
				return nil, lbl, d.fail(e.key, e.path, "a rule selects endpoints (endpointSelector) or nodes (nodeSelector), not both")
			}
			if subject, err = d.ruleSubject(e); err != nil {
				return nil, lbl, err
			}
			subjectE = &entries[i]
		case "ingress", "ingressDeny", "egress", "egressDeny":
			dir := Ingress
			if strings.HasPrefix(e.name, "egress") {
				dir = Egress
			}
			deny := strings.HasSuffix(e.name, "Deny")
			st := dirs[dir]
			if !st.present {
				st.present, st.keyPath = true, e.path
			}
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return nil, lbl, err
			}
			rs, err := parseEach(len(items), func(j int) (Rule, error) {
				return d.ciliumPeerRule(items[j], indexPath(e.path, j), dir, deny)
			})
			if err != nil {
				return nil, lbl, err
			}
			st.rules = append(st.rules, rs...)
		case "enableDefaultDeny":
			if err := d.defaultDenyOverrides(e, dirs); err != nil {
				return nil, lbl, err
			}
		case "labels":
			if lbl, err = d.ruleLabels(e.val, e.path); err != nil {
				return nil, lbl, err
			}
		case "description":
			if _, err := d.str(e.val, e.path); err != nil {
				return nil, lbl, err
			}
		case "log":
			return nil, lbl, d.unsupported(e)
		default:
			return nil, lbl, d.unknown(e)
		}
	}
	if subjectE == nil {
		return nil, lbl, d.fail(n, fieldPath(path, "endpointSelector"), ReasonRequired)
	}
	if d.kind == KindCiliumNetworkPolicy {
		// A namespaced policy always applies in its own namespace; Cilium forbids selecting
		// another one in endpointSelector.
		for _, r := range subject.Requirements {
			own := r.Operator == labels.OpExists || (r.Operator == labels.OpIn && len(r.Values) == 1 && r.Values[0] == d.namespace)
			if r.Key == labels.KeyNamespace && !own {
				return nil, lbl, d.fail(subjectE.val, subjectE.path, "endpointSelector cannot select a namespace other than the policy's own (%s)", d.namespace)
			}
		}
		subject = inNamespace(subject, d.namespace)
	}

	var out []Rule
	for _, dir := range []Direction{Ingress, Egress} {
		out = append(out, dirs[dir].finish(dir, subject, d.host)...)
	}
	return out, lbl, nil
}

// ciliumDirection is what a Cilium rule says of one direction.
type ciliumDirection struct {
	keyPath  string // path of the first key seen for the direction
	present  bool
	override *bool // enableDefaultDeny's word for the direction
	overPath string
	rules    []Rule
}

// finish gives the direction's rules their subject and enforcement; an enforced direction
// with no rules yields one rule, with no peers, that only switches enforcement on.
func (st *ciliumDirection) finish(dir Direction, subject labels.Selector, host bool) []Rule {
	enforced := st.present
	if st.override != nil {
		enforced = *st.override
	}
	if len(st.rules) == 0 {
		if !enforced {
			return nil
		}
		desc := st.keyPath
		if st.override != nil {
			desc = st.overPath
		}
		return []Rule{{Description: desc, Subject: subject, Host: host, Direction: dir, EnableDefaultDeny: true}}
	}
	out := make([]Rule, 0, len(st.rules))
	for _, r := range st.rules {
		r.Subject, r.Host, r.EnableDefaultDeny = subject, host, enforced
		out = append(out, r)
	}
	return out
}

// ruleSubject parses endpointSelector, or nodeSelector: a host policy, which selects
// nodes by their labels and applies to each selected node's own traffic (its host
// endpoint), never to pods.
func (d *docParser) ruleSubject(e entry) (labels.Selector, error) {
	what := "endpoint"
	if e.name == "nodeSelector" {
		if d.kind != KindCiliumClusterwidePolicy {
			return labels.Selector{}, d.fail(e.key, e.path, "only a CiliumClusterwideNetworkPolicy may select nodes")
		}
		what = "node"
	}
	if isNull(e.val) {
		return labels.Selector{}, d.fail(e.val, e.path, "must be a selector (use {} to select every %s)", what)
	}
	return d.selector(e.val, e.path, ciliumSelector)
}

// defaultDenyOverrides reads enableDefaultDeny into dirs.
func (d *docParser) defaultDenyOverrides(e entry, dirs map[Direction]*ciliumDirection) error {
	dd, err := d.mapping(e.val, e.path)
	if err != nil {
		return err
	}
	for _, de := range dd {
		var st *ciliumDirection
		switch de.name {
		case "ingress":
			st = dirs[Ingress]
		case "egress":
			st = dirs[Egress]
		default:
			return d.unknown(de)
		}
		if isNull(de.val) {
			continue
		}
		v, err := d.boolean(de.val, de.path)
		if err != nil {
			return err
		}
		st.override, st.overPath = &v, de.path
	}
	return nil
}

// ruleLabels checks a rule's labels ([{key, value, source}]) and finds a name label.
func (d *docParser) ruleLabels(n *yaml.Node, path string) (ruleLabelInfo, error) {
	var info ruleLabelInfo
	items, err := d.sequence(n, path)
	if err != nil {
		return info, err
	}
	for i, it := range items {
		p := indexPath(path, i)
		entries, err := d.mapping(it, p)
		if err != nil {
			return info, err
		}
		hasKey := false
		for _, e := range entries {
			switch e.name {
			case "key", "value", "source":
				if _, err := d.str(e.val, e.path); err != nil {
					return info, err
				}
				hasKey = hasKey || e.name == "key"
			default:
				return info, d.unknown(e)
			}
		}
		if !hasKey {
			return info, d.fail(it, fieldPath(p, "key"), ReasonRequired)
		}
		if name, ok := nameLabel(it); ok && info.name == "" {
			info = ruleLabelInfo{name: name, at: it, path: p}
		}
	}
	return info, nil
}

// ciliumPeerRule parses one entry of ingress, ingressDeny, egress or egressDeny.
//
// Peer fields (endpoints, CIDRs, CIDR sets, entities) are ORed; ports (toPorts and icmps)
// AND the peers. Without any peer field the ports apply to every peer; with neither peers
// nor ports the rule allows nothing. A peer field with an empty list selects no peer, as
// in Cilium.
func (d *docParser) ciliumPeerRule(n *yaml.Node, path string, dir Direction, deny bool) (Rule, error) {
	r := Rule{Description: path, Direction: dir, Deny: deny}
	entries, err := d.mapping(n, path)
	if err != nil {
		return r, err
	}
	prefix := "from"
	if dir == Egress {
		prefix = "to"
	}
	hasL3 := false
	var icmps *entry
	var ports, icmpPorts []PortRule
	var groupAt *yaml.Node // the first cidrGroupRef entry, for the L7 check
	var groupPath string
	var fqdnAt *entry // the toFQDNs entry: no other peer field may go with it
	peerList := func(e entry) ([]*yaml.Node, error) {
		if isNull(e.val) {
			return nil, d.fail(e.val, e.path, "must be a list (write [] to select no peer)")
		}
		hasL3 = true
		return d.sequence(e.val, e.path)
	}
	// Each peer field is a list of peers, each parsed by its own function.
	peerFields := map[string]func(*yaml.Node, string) (Peer, error){
		prefix + "Endpoints": d.endpointsPeer,
		prefix + "CIDR":      d.bareCIDRPeer,
		prefix + "CIDRSet":   d.cidrRule,
		prefix + "Entities":  d.entity,
	}
	for i, e := range entries {
		if parse := peerFields[e.name]; parse != nil {
			items, err := peerList(e)
			if err != nil {
				return r, err
			}
			for j, it := range items {
				p := indexPath(e.path, j)
				peer, err := parse(it, p)
				if err != nil {
					return r, err
				}
				if peer.Kind == PeerCIDRGroup && groupAt == nil {
					groupAt, groupPath = it, fieldPath(p, "cidrGroupRef")
				}
				r.Peers = append(r.Peers, peer)
			}
			continue
		}
		switch e.name {
		case prefix + "Requires", prefix + "Groups", prefix + "Nodes":
			return r, d.unsupported(e)
		case "toServices":
			if dir != Egress {
				return r, d.unknown(e)
			}
			return r, d.unsupported(e)
		case "toFQDNs":
			if dir != Egress || deny {
				return r, d.unknown(e)
			}
			if d.host {
				return r, d.fail(e.key, e.path, "not supported in a host policy (nodeSelector): the host's DNS queries pass no DNS proxy")
			}
			hasL3 = true
			sels, err := d.fqdnSelectors(e)
			if err != nil {
				return r, err
			}
			for _, s := range sels {
				r.Peers = append(r.Peers, Peer{Kind: PeerFQDN, FQDN: s})
			}
			fqdnAt = &entries[i]
		case "authentication", "auth":
			if deny {
				return r, d.unknown(e)
			}
			return r, d.unsupported(e)
		case "toPorts":
			prs, err := d.portRules(e, func(it *yaml.Node, p string) ([]PortRule, error) { return d.ciliumPortRule(it, p, dir, deny) })
			if err != nil {
				return r, err
			}
			ports = append(ports, prs...)
		case "icmps":
			prs, err := d.portRules(e, d.icmpRule)
			if err != nil {
				return r, err
			}
			icmpPorts = append(icmpPorts, prs...)
			icmps = &entries[i]
		default:
			return r, d.unknown(e)
		}
	}
	if fqdnAt != nil && slices.ContainsFunc(r.Peers, func(p Peer) bool { return p.Kind != PeerFQDN }) {
		return r, d.fail(fqdnAt.key, fqdnAt.path, "toFQDNs cannot be combined with other peer fields in one rule (Cilium refuses it too; write two rules)")
	}
	if fqdnAt != nil && slices.ContainsFunc(ports, func(pr PortRule) bool { return pr.HTTP != nil || pr.DNS != nil }) {
		return r, d.fail(fqdnAt.key, fqdnAt.path, "L7 rules towards toFQDNs peers "+ReasonNotSupported)
	}
	if len(ports) > 0 && len(icmpPorts) > 0 {
		return r, d.fail(icmps.key, icmps.path, "icmps cannot be combined with toPorts in one rule (Cilium refuses it too; write two rules)")
	}
	r.Ports = append(ports, icmpPorts...)
	if groupAt != nil && slices.ContainsFunc(r.Ports, func(pr PortRule) bool { return pr.HTTP != nil || pr.DNS != nil }) {
		// The L7 proxy matches peers by address ranges from the ipcache; the members of a
		// CIDR group are only known to the dataplane's set tables.
		return r, d.fail(groupAt, groupPath, "L7 rules towards a cidrGroupRef peer "+ReasonNotSupported)
	}
	// Without a peer field, a rule with ports applies to every peer, and a rule without
	// ports allows nothing (it only switches on default deny).
	r.AllPeers = !hasL3 && len(r.Ports) > 0
	return r, nil
}

// endpointsPeer parses one selector of fromEndpoints or toEndpoints.
func (d *docParser) endpointsPeer(n *yaml.Node, path string) (Peer, error) {
	if isNull(n) {
		return Peer{}, d.fail(n, path, "must be a selector (use {} for every endpoint)")
	}
	sel, err := d.selector(n, path, ciliumSelector)
	if err != nil {
		return Peer{}, err
	}
	return Peer{Kind: PeerEndpoints, Selector: d.scopePeer(sel)}, nil
}

// bareCIDRPeer parses one prefix of fromCIDR or toCIDR (a bare address is its /32 or /128).
func (d *docParser) bareCIDRPeer(n *yaml.Node, path string) (Peer, error) {
	pfx, err := d.prefix(n, path, true)
	if err != nil {
		return Peer{}, err
	}
	return Peer{Kind: PeerCIDR, CIDR: pfx}, nil
}

// portRules parses the list e (toPorts or icmps), each item by parse.
func (d *docParser) portRules(e entry, parse func(*yaml.Node, string) ([]PortRule, error)) ([]PortRule, error) {
	items, err := d.sequence(e.val, e.path)
	if err != nil {
		return nil, err
	}
	var all []PortRule
	for j, it := range items {
		prs, err := parse(it, indexPath(e.path, j))
		if err != nil {
			return nil, err
		}
		all = append(all, prs...)
	}
	return all, nil
}

// scopePeer applies Cilium's namespace scoping to a fromEndpoints/toEndpoints selector:
// unless the selector itself constrains the namespace, a CiliumNetworkPolicy only selects
// endpoints of its own namespace, and a clusterwide policy only endpoints that have a
// namespace (pods, not reserved identities).
func (d *docParser) scopePeer(sel labels.Selector) labels.Selector {
	if hasKey(sel, labels.KeyNamespace) {
		return sel
	}
	if d.kind == KindCiliumNetworkPolicy {
		return inNamespace(sel, d.namespace)
	}
	return inAnyNamespace(sel)
}

// cidrRule parses one toCIDRSet/fromCIDRSet entry: a cidr with optional except, or a
// cidrGroupRef naming a CIDR group. As in Cilium the three ways to name addresses (cidr,
// cidrGroupRef, cidrGroupSelector) exclude each other, and except goes with cidr only
// (Cilium documents except next to cidrGroupRef as not supported).
func (d *docParser) cidrRule(n *yaml.Node, path string) (Peer, error) {
	entries, err := d.mapping(n, path)
	if err != nil {
		return Peer{}, err
	}
	var cidr, except, group *entry
	for i, e := range entries {
		switch e.name {
		case "cidr":
			cidr = &entries[i]
		case "except":
			except = &entries[i]
		case "cidrGroupRef":
			group = &entries[i]
		case "cidrGroupSelector":
			return Peer{}, d.unsupported(e)
		default:
			return Peer{}, d.unknown(e)
		}
	}
	if group != nil {
		if cidr != nil {
			later := cidr
			if cidr.key.Line < group.key.Line || cidr.key.Line == group.key.Line && cidr.key.Column < group.key.Column {
				later = group
			}
			return Peer{}, d.fail(later.key, later.path, "cidr and cidrGroupRef cannot be combined in one entry (write two entries)")
		}
		if except != nil {
			return Peer{}, d.fail(except.key, except.path, "except with cidrGroupRef "+ReasonNotSupported+" (Cilium does not support it either)")
		}
		name, err := d.str(group.val, group.path)
		if err != nil {
			return Peer{}, err
		}
		if !ValidCIDRGroupName(name) {
			return Peer{}, d.fail(group.val, group.path, "invalid CIDR group name %q: must be lowercase alphanumerics, '-' and '.', at most 253 characters", name)
		}
		return Peer{Kind: PeerCIDRGroup, Group: name}, nil
	}
	if cidr == nil {
		return Peer{}, d.fail(n, fieldPath(path, "cidr"), ReasonRequired+" (cidr or cidrGroupRef)")
	}
	var exceptNode *yaml.Node
	if except != nil {
		exceptNode = except.val
	}
	return d.cidrPeer(cidr.val, cidr.path, exceptNode, fieldPath(path, "except"), false)
}

// ciliumPortRule parses one toPorts entry. Deny rules only have ports. HTTP rules
// (rules.http) are put on every port of the entry.
func (d *docParser) ciliumPortRule(n *yaml.Node, path string, dir Direction, deny bool) ([]PortRule, error) {
	entries, err := d.mapping(n, path)
	if err != nil {
		return nil, err
	}
	var out []PortRule
	var portNodes []*yaml.Node
	var portPaths []string
	var l7 l7Parsed
	for _, e := range entries {
		switch e.name {
		case "ports":
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return nil, err
			}
			for i, it := range items {
				p := indexPath(e.path, i)
				pr, err := d.portEntry(it, p, portSyntax{cilium: true})
				if err != nil {
					return nil, err
				}
				out = append(out, pr)
				portNodes, portPaths = append(portNodes, it), append(portPaths, p)
			}
		case "rules":
			if deny {
				// Cilium's deny rules have no L7 part: a request cannot be dropped after
				// the connection it travels on was allowed.
				return nil, d.unknown(e)
			}
			if d.host {
				return nil, d.fail(e.key, e.path, "not supported in a host policy (nodeSelector): the host's connections pass no L7 proxy")
			}
			if l7, err = d.l7Rules(e); err != nil {
				return nil, err
			}
		case "serverNames", "listener", "originatingTLS", "terminatingTLS":
			if deny {
				return nil, d.unknown(e)
			}
			return nil, d.unsupported(e)
		default:
			return nil, d.unknown(e)
		}
	}
	if len(out) == 0 {
		return nil, d.fail(n, fieldPath(path, "ports"), "at least one port is required")
	}
	if l7.httpE != nil {
		if err := d.checkL7Ports(out, portNodes, portPaths); err != nil {
			return nil, err
		}
		for i := range out {
			out[i].HTTP = slices.Clone(l7.http)
		}
	}
	if l7.dnsE != nil {
		if dir != Egress {
			return nil, d.fail(l7.dnsE.key, l7.dnsE.path, "DNS rules apply to egress only (Cilium refuses them on ingress too)")
		}
		if err := d.checkDNSPorts(out, portNodes, portPaths); err != nil {
			return nil, err
		}
		for i := range out {
			out[i].DNS = slices.Clone(l7.dns)
		}
	}
	return out, nil
}
