package policy

import (
	"errors"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/tap"
)

// Tap contract kinds (docs/taps.md): Rampart's own and Antrea's TrafficControl. Both are
// cluster-scoped, as TrafficControl is, and share one space of names.
const (
	KindTapContract    Kind = tap.KindTapContract    // rampart.io/v1alpha1
	KindTrafficControl Kind = tap.KindTrafficControl // crd.antrea.io/v1alpha2
)

// tapParse is what a tap document's parse remembers besides the contract: the node of
// each field path, so that an error found by tap.Contract.Validate names its line, and how
// the model's field names read in this kind.
type tapParse struct {
	nodes  map[string]*yaml.Node
	rename map[string]string // model field path -> this kind's field path
}

func (t *tapParse) at(e entry) { t.nodes[e.path] = e.key }

// tapContract parses the spec of a TapContract (metadata already checked):
//
//	spec:
//	  source:                   # exactly one of endpoint and selector/namespaceSelector
//	    endpoint: NAMESPACE/NAME (or NAME: namespace default)
//	    selector: {matchLabels, matchExpressions}           # endpoint labels
//	    namespaceSelector: {matchLabels, matchExpressions}  # namespace labels
//	  monitor: NAMESPACE/NAME
//	  match:                    # optional: everything, both directions
//	    direction: Ingress | Egress | Both (default)
//	    protocol: TCP | UDP | ICMP | Any (default)
//	    peerCIDRs: [CIDR, ...]
//	    ports: [80, "8000-8080", {port: 8000, endPort: 8080}, ...]   # the endpoint's side
//	    peerPorts: [...]                                             # the peer's side
//	    icmpType: 0-255
//	    icmpCode: 0-255
//	  action: Mirror | Redirect
//	  failMode: Closed (default) | Open      # Redirect only
func (d *docParser) tapContract(doc *yaml.Node, top []entry) (*tap.Contract, error) {
	c := &tap.Contract{Kind: tap.KindTapContract, Name: d.name, Origin: d.sourceName(), Match: tap.Match{Direction: tap.Both}}
	tp := &tapParse{nodes: map[string]*yaml.Node{}}
	spec, err := d.tapSpec(doc, top)
	if err != nil {
		return nil, err
	}
	entries, err := d.mapping(spec.val, spec.path)
	if err != nil {
		return nil, err
	}
	var sourceE, monitorE, actionE *entry
	for i, e := range entries {
		tp.at(e)
		switch e.name {
		case "source":
			sourceE = &entries[i]
		case "monitor":
			monitorE = &entries[i]
			if c.Monitor, err = d.endpointKey(e.val, e.path); err != nil {
				return nil, err
			}
		case "match":
			if err := d.tapMatch(e, &c.Match, tp); err != nil {
				return nil, err
			}
		case "action":
			actionE = &entries[i]
			s, err := d.str(e.val, e.path)
			if err != nil {
				return nil, err
			}
			if c.Action, err = tap.ParseAction(s); err != nil {
				return nil, d.fail(e.val, e.path, "%v", err)
			}
		case "failMode":
			s, err := d.str(e.val, e.path)
			if err != nil {
				return nil, err
			}
			if c.FailMode, err = tap.ParseFailMode(s); err != nil {
				return nil, d.fail(e.val, e.path, "%v", err)
			}
		default:
			return nil, d.unknown(e)
		}
	}
	for _, req := range []struct {
		e    *entry
		name string
	}{{sourceE, "source"}, {monitorE, "monitor"}, {actionE, "action"}} {
		if req.e == nil {
			return nil, d.fail(spec.val, fieldPath(spec.path, req.name), ReasonRequired)
		}
	}
	if c.Source, err = d.tapSource(*sourceE, tp); err != nil {
		return nil, err
	}
	return c, d.finishTap(doc, c, tp)
}

// tapSpec finds the spec among the top-level entries, refusing any other field.
func (d *docParser) tapSpec(doc *yaml.Node, top []entry) (entry, error) {
	var spec *entry
	for i, e := range top {
		switch e.name {
		case "apiVersion", "kind", "metadata":
		case "spec":
			spec = &top[i]
		case "status":
			// A TrafficControl has no status (Antrea serves it without one); neither does
			// a TapContract: what the agent reports is in `rampart tap get`.
			return entry{}, d.fail(e.key, e.path, "%s: a %s has no status", ReasonUnknownField, d.kind)
		default:
			return entry{}, d.unknown(e)
		}
	}
	if spec == nil {
		return entry{}, d.fail(doc, "spec", ReasonRequired)
	}
	return *spec, nil
}

// finishTap validates the contract, naming the line of the field at fault, and records
// the document as JSON.
func (d *docParser) finishTap(doc *yaml.Node, c *tap.Contract, tp *tapParse) error {
	c.Match.Normalize()
	if err := c.Validate(); err != nil {
		var fe *tap.FieldError
		if !errors.As(err, &fe) {
			return d.fail(doc, "", "%v", err)
		}
		field := fe.Field
		for model, here := range tp.rename {
			if field == model || strings.HasPrefix(field, model+".") || strings.HasPrefix(field, model+"[") {
				field = here + field[len(model):]
			}
		}
		n := doc
		for p := field; p != ""; p = parentPath(p) {
			if at, ok := tp.nodes[p]; ok {
				n = at
				break
			}
		}
		return d.fail(n, field, "%s", fe.Reason)
	}
	raw, err := d.toJSON(doc)
	if err != nil {
		return err
	}
	c.Raw = raw
	return nil
}

// parentPath drops the last element of a field path ("" at the top).
func parentPath(p string) string {
	if i := strings.LastIndexAny(p, ".["); i > 0 {
		return p[:i]
	}
	return ""
}

// endpointKey reads NAMESPACE/NAME or NAME (namespace default) and returns it as
// NAMESPACE/NAME.
func (d *docParser) endpointKey(n *yaml.Node, path string) (string, error) {
	s, err := d.str(n, path)
	if err != nil {
		return "", err
	}
	k, err := tap.NormalizeKey(s)
	if err != nil {
		return "", d.fail(n, path, "%v", err)
	}
	return k, nil
}

// tapSource parses a TapContract's source.
func (d *docParser) tapSource(e entry, tp *tapParse) (tap.Source, error) {
	var src tap.Source
	entries, err := d.mapping(e.val, e.path)
	if err != nil {
		return src, err
	}
	var endpointE, selE *entry
	for i, se := range entries {
		tp.at(se)
		switch se.name {
		case "endpoint":
			endpointE = &entries[i]
			if src.Endpoint, err = d.endpointKey(se.val, se.path); err != nil {
				return src, err
			}
		case "selector", "namespaceSelector":
			selE = &entries[i]
			if err := d.andSelector(&src, se, se.name == "namespaceSelector"); err != nil {
				return src, err
			}
		default:
			return src, d.unknown(se)
		}
	}
	switch {
	case endpointE != nil && selE != nil:
		return src, d.fail(selE.key, selE.path, "give endpoint or selectors, not both")
	case endpointE == nil && selE == nil:
		return src, d.fail(e.val, e.path, "%s: give endpoint, or selector and/or namespaceSelector", ReasonRequired)
	}
	return src, nil
}

// andSelector parses a selector of endpoint labels, or of namespace labels (which
// endpoints carry under labels.KeyNamespaceLabelPrefix, as for a NetworkPolicy's
// namespaceSelector), and adds it to src's.
func (d *docParser) andSelector(src *tap.Source, e entry, namespace bool) error {
	var syn selectorSyntax
	if namespace {
		syn.keyPrefix = labels.KeyNamespaceLabelPrefix
	}
	s, err := d.selector(e.val, e.path, syn)
	if err != nil {
		return err
	}
	src.Selector = src.Selector.And(s)
	return nil
}

// tapMatch parses a TapContract's match into m (which holds the defaults).
func (d *docParser) tapMatch(e entry, m *tap.Match, tp *tapParse) error {
	entries, err := d.mapping(e.val, e.path)
	if err != nil {
		return err
	}
	for _, me := range entries {
		tp.at(me)
		switch me.name {
		case "direction":
			s, err := d.str(me.val, me.path)
			if err != nil {
				return err
			}
			if m.Direction, err = tap.ParseDirection(s); err != nil {
				return d.fail(me.val, me.path, "%v", err)
			}
		case "protocol":
			s, err := d.str(me.val, me.path)
			if err != nil {
				return err
			}
			if m.Protocol, err = tap.ParseProtocol(s); err != nil || s == "" {
				return d.fail(me.val, me.path, "unknown protocol %q (want TCP, UDP, ICMP or Any)", s)
			}
		case "peerCIDRs":
			items, err := d.sequence(me.val, me.path)
			if err != nil {
				return err
			}
			for i, it := range items {
				p, err := d.prefix(it, indexPath(me.path, i), false)
				if err != nil {
					return err
				}
				tp.nodes[indexPath(me.path, i)] = it
				m.PeerCIDRs = append(m.PeerCIDRs, p)
			}
		case "ports", "peerPorts":
			items, err := d.sequence(me.val, me.path)
			if err != nil {
				return err
			}
			var rs []tap.PortRange
			for i, it := range items {
				r, err := d.tapPortRange(it, indexPath(me.path, i))
				if err != nil {
					return err
				}
				tp.nodes[indexPath(me.path, i)] = it
				rs = append(rs, r)
			}
			if me.name == "ports" {
				m.Ports = rs
			} else {
				m.PeerPorts = rs
			}
		case "icmpType", "icmpCode":
			v, err := d.integer(me.val, me.path)
			if err != nil {
				return err
			}
			if v < 0 || v > 255 {
				return d.fail(me.val, me.path, "%d out of range 0-255", v)
			}
			b := uint8(v)
			if me.name == "icmpType" {
				m.ICMPType = &b
			} else {
				m.ICMPCode = &b
			}
		default:
			return d.unknown(me)
		}
	}
	return nil
}

// tapPortRange reads a port (80), a range as a string ("8000-8080") or as Kubernetes
// writes one ({port: 8000, endPort: 8080}).
func (d *docParser) tapPortRange(n *yaml.Node, path string) (tap.PortRange, error) {
	switch {
	case n.Kind == yaml.ScalarNode && n.Tag == "!!int":
		v, err := d.integer(n, path)
		if err != nil {
			return tap.PortRange{}, err
		}
		p, err := d.portNumber(n, path, v, false)
		return tap.PortRange{First: p, Last: p}, err
	case n.Kind == yaml.ScalarNode && n.Tag == "!!str":
		r, err := tap.ParsePortRange(n.Value)
		if err != nil {
			return r, d.fail(n, path, "%v", err)
		}
		return r, nil
	case n.Kind == yaml.MappingNode:
		entries, err := d.mapping(n, path)
		if err != nil {
			return tap.PortRange{}, err
		}
		var r tap.PortRange
		var endE *entry
		for i, e := range entries {
			v, err := d.integer(e.val, e.path)
			if err != nil {
				return r, err
			}
			p, err := d.portNumber(e.val, e.path, v, false)
			if err != nil {
				return r, err
			}
			switch e.name {
			case "port":
				r.First = p
			case "endPort":
				r.Last, endE = p, &entries[i]
			default:
				return r, d.unknown(e)
			}
		}
		if r.First == 0 {
			return r, d.fail(n, fieldPath(path, "port"), ReasonRequired)
		}
		if endE == nil {
			r.Last = r.First
		} else if r.Last < r.First {
			return r, d.fail(endE.val, endE.path, "endPort %d is below port %d", r.Last, r.First)
		}
		return r, nil
	}
	return tap.PortRange{}, d.fail(n, path, "must be a port number, a range \"FIRST-LAST\" or {port, endPort}, not %s", describe(n))
}

// trafficControl parses the spec of an Antrea TrafficControl (crd.antrea.io/v1alpha2)
// into a contract that taps all of the selected pods' traffic in its direction:
//
//	spec:
//	  appliedTo: {podSelector, namespaceSelector}   # groups: not supported
//	  direction: Ingress | Egress | Both
//	  action: Mirror | Redirect
//	  targetPort: {ovsInternal: {name}} or {device: {name}}: the name is the monitor
//	              endpoint's, NAMESPACE/NAME or NAME (namespace default); tunnels
//	              (geneve, vxlan, gre, erspan) are not supported
//	  returnPort: the same monitor (Redirect only): a monitor returns traffic on its own
//	              return interface
//
// A TrafficControl has no failure mode: a Redirect fails closed.
func (d *docParser) trafficControl(doc *yaml.Node, top []entry) (*tap.Contract, error) {
	c := &tap.Contract{Kind: tap.KindTrafficControl, Name: d.name, Origin: d.sourceName(), Match: tap.Match{Direction: tap.Both}}
	tp := &tapParse{nodes: map[string]*yaml.Node{}, rename: map[string]string{
		"spec.source":          "spec.appliedTo",
		"spec.monitor":         "spec.targetPort",
		"spec.match.direction": "spec.direction",
	}}
	spec, err := d.tapSpec(doc, top)
	if err != nil {
		return nil, err
	}
	entries, err := d.mapping(spec.val, spec.path)
	if err != nil {
		return nil, err
	}
	var appliedE, dirE, actionE, targetE, returnE *entry
	for i, e := range entries {
		tp.at(e)
		switch e.name {
		case "appliedTo":
			appliedE = &entries[i]
		case "direction":
			dirE = &entries[i]
			s, err := d.enum(e, "direction", "Ingress", "Egress", "Both")
			if err != nil {
				return nil, err
			}
			c.Match.Direction, _ = tap.ParseDirection(s)
		case "action":
			actionE = &entries[i]
			s, err := d.enum(e, "action", "Mirror", "Redirect")
			if err != nil {
				return nil, err
			}
			c.Action, _ = tap.ParseAction(s)
		case "targetPort":
			targetE = &entries[i]
		case "returnPort":
			returnE = &entries[i]
		default:
			return nil, d.unknown(e)
		}
	}
	for _, req := range []struct {
		e    *entry
		name string
	}{{appliedE, "appliedTo"}, {dirE, "direction"}, {actionE, "action"}, {targetE, "targetPort"}} {
		if req.e == nil {
			return nil, d.fail(spec.val, fieldPath(spec.path, req.name), ReasonRequired)
		}
	}
	if c.Source, err = d.appliedTo(*appliedE, tp); err != nil {
		return nil, err
	}
	if c.Monitor, err = d.trafficControlPort(*targetE); err != nil {
		return nil, err
	}
	if returnE != nil {
		if c.Action != tap.Redirect {
			return nil, d.fail(returnE.key, returnE.path, "a return port is for action Redirect only")
		}
		back, err := d.trafficControlPort(*returnE)
		if err != nil {
			return nil, err
		}
		if back != c.Monitor {
			return nil, d.fail(returnE.val, returnE.path, "the return port must be the target's monitor endpoint %s (a monitor returns traffic on its own return interface), not %s", c.Monitor, back)
		}
	}
	return c, d.finishTap(doc, c, tp)
}

// enum reads a string that must be one of values exactly, as Antrea's schema enums are.
func (d *docParser) enum(e entry, what string, values ...string) (string, error) {
	s, err := d.str(e.val, e.path)
	if err != nil {
		return "", err
	}
	if !slices.Contains(values, s) {
		return "", d.fail(e.val, e.path, "unknown %s %q (want %s)", what, s, strings.Join(values, ", "))
	}
	return s, nil
}

// appliedTo parses a TrafficControl's appliedTo: podSelector selects pods of every
// namespace, or of the namespaces namespaceSelector selects when both are given.
func (d *docParser) appliedTo(e entry, tp *tapParse) (tap.Source, error) {
	var src tap.Source
	entries, err := d.mapping(e.val, e.path)
	if err != nil {
		return src, err
	}
	found := false
	for _, ae := range entries {
		tp.at(ae)
		switch ae.name {
		case "podSelector", "namespaceSelector":
		case "groups":
			return src, d.fail(ae.key, ae.path, "%s: ClusterGroups have no Rampart equivalent (select the pods with podSelector and namespaceSelector)", ReasonNotSupported)
		default:
			return src, d.unknown(ae)
		}
		if isNull(ae.val) {
			continue
		}
		if err := d.andSelector(&src, ae, ae.name == "namespaceSelector"); err != nil {
			return src, err
		}
		found = true
	}
	if !found {
		return src, d.fail(e.val, e.path, "%s: give podSelector and/or namespaceSelector", ReasonRequired)
	}
	return src, nil
}

// trafficControlPort reads a TrafficControl port as the monitor endpoint it names.
func (d *docParser) trafficControlPort(e entry) (string, error) {
	entries, err := d.mapping(e.val, e.path)
	if err != nil {
		return "", err
	}
	var key string
	var kindE *entry
	for i, pe := range entries {
		switch pe.name {
		case "ovsInternal", "device":
			if kindE != nil {
				return "", d.fail(pe.key, pe.path, "give one port, not both %s and %s", kindE.name, pe.name)
			}
			kindE = &entries[i]
			fields, err := d.mapping(pe.val, pe.path)
			if err != nil {
				return "", err
			}
			var nameE *entry
			for j, f := range fields {
				if f.name != "name" {
					return "", d.unknown(f)
				}
				nameE = &fields[j]
			}
			if nameE == nil {
				return "", d.fail(pe.val, fieldPath(pe.path, "name"), ReasonRequired)
			}
			if key, err = d.endpointKey(nameE.val, nameE.path); err != nil {
				return "", err
			}
		case "geneve", "vxlan", "gre", "erspan":
			return "", d.fail(pe.key, pe.path, "%s: a tunnel to an analyzer outside the cluster has no Rampart equivalent; name a monitor endpoint with ovsInternal or device (one on another node gets its traffic through Rampart's overlay)", ReasonNotSupported)
		default:
			return "", d.unknown(pe)
		}
	}
	if kindE == nil {
		return "", d.fail(e.val, e.path, "%s: name the monitor endpoint with ovsInternal.name or device.name", ReasonRequired)
	}
	return key, nil
}
