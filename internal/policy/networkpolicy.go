package policy

import (
	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/labels"
)

var k8sSelector = selectorSyntax{}

// npRule is one parsed ingress or egress rule of a NetworkPolicy.
type npRule struct {
	path     string
	allPeers bool
	peers    []Peer
	ports    []PortRule
}

// networkPolicy turns a networking.k8s.io/v1 NetworkPolicy into rules.
//
// Semantics, as Kubernetes defines them:
//   - the subject is spec.podSelector within the policy's namespace;
//   - policyTypes, when not given, is Ingress plus Egress if spec.egress has a rule;
//   - each listed type isolates the subject in that direction (default deny), even with no
//     rules; rules of a direction that is not listed have no effect;
//   - within a rule, peers are ORed, ports are ORed, and peers AND ports must both match;
//     absent or empty from/to means every peer, absent or empty ports every port.
func (d *docParser) networkPolicy(doc *yaml.Node, top []entry) ([]Rule, error) {
	var spec *entry
	for i, e := range top {
		switch e.name {
		case "apiVersion", "kind", "metadata":
		case "spec":
			spec = &top[i]
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
		subject     labels.Selector
		hasSubject  bool
		types       = map[Direction]string{} // direction -> path of its policyTypes entry
		rules       = map[Direction][]npRule{}
		explicitDir bool
	)
	for _, e := range entries {
		switch e.name {
		case "podSelector":
			if subject, err = d.selector(e.val, e.path, k8sSelector); err != nil {
				return nil, err
			}
			hasSubject = true
		case "policyTypes":
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return nil, err
			}
			for i, it := range items {
				p := indexPath(e.path, i)
				s, err := d.str(it, p)
				if err != nil {
					return nil, err
				}
				switch s {
				case "Ingress":
					types[Ingress] = p
				case "Egress":
					types[Egress] = p
				default:
					return nil, d.fail(it, p, "unknown policy type %q (want Ingress or Egress)", s)
				}
			}
			explicitDir = len(items) > 0
		case "description":
			// Not a Kubernetes field, but informational like the top-level one that Cilium
			// examples use; accepted for both kinds alike.
			if _, err := d.str(e.val, e.path); err != nil {
				return nil, err
			}
		case "ingress", "egress":
			dir := Ingress
			if e.name == "egress" {
				dir = Egress
			}
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return nil, err
			}
			rs, err := parseEach(len(items), func(i int) (npRule, error) {
				return d.npRule(items[i], indexPath(e.path, i), dir)
			})
			if err != nil {
				return nil, err
			}
			rules[dir] = rs // mapping refused a second ingress or egress field
		default:
			return nil, d.unknown(e)
		}
	}
	if !hasSubject {
		return nil, d.fail(spec.val, fieldPath(spec.path, "podSelector"), ReasonRequired)
	}
	if !explicitDir {
		// Kubernetes' defaulting of policyTypes.
		types[Ingress] = "spec"
		if len(rules[Egress]) > 0 {
			types[Egress] = "spec"
		}
	}
	subject = inNamespace(subject, d.namespace)

	out := make([]Rule, 0, max(1, len(rules[Ingress]))+max(1, len(rules[Egress])))
	for _, dir := range []Direction{Ingress, Egress} {
		typePath, enforced := types[dir]
		if !enforced {
			continue
		}
		if len(rules[dir]) == 0 {
			out = append(out, Rule{Description: typePath, Subject: subject, Direction: dir, EnableDefaultDeny: true})
			continue
		}
		for _, r := range rules[dir] {
			out = append(out, Rule{
				Description:       r.path,
				Subject:           subject,
				Direction:         dir,
				EnableDefaultDeny: true,
				AllPeers:          r.allPeers,
				Peers:             r.peers,
				Ports:             r.ports,
			})
		}
	}
	return out, nil
}

func (d *docParser) npRule(n *yaml.Node, path string, dir Direction) (npRule, error) {
	r := npRule{path: path, allPeers: true}
	peersField := "from"
	if dir == Egress {
		peersField = "to"
	}
	entries, err := d.mapping(n, path)
	if err != nil {
		return r, err
	}
	for _, e := range entries {
		switch e.name {
		case peersField:
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return r, err
			}
			for i, it := range items {
				p, err := d.npPeer(it, indexPath(e.path, i))
				if err != nil {
					return r, err
				}
				r.peers = append(r.peers, p)
			}
			r.allPeers = len(r.peers) == 0
		case "ports":
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return r, err
			}
			for i, it := range items {
				pr, err := d.portEntry(it, indexPath(e.path, i), portSyntax{})
				if err != nil {
					return r, err
				}
				r.ports = append(r.ports, pr)
			}
		default:
			return r, d.unknown(e)
		}
	}
	return r, nil
}

// npPeer parses one from/to entry. A null podSelector or namespaceSelector counts as
// absent, as it does in Kubernetes.
func (d *docParser) npPeer(n *yaml.Node, path string) (Peer, error) {
	entries, err := d.mapping(n, path)
	if err != nil {
		return Peer{}, err
	}
	var podSel, nsSel *labels.Selector
	var ipBlock *entry
	for i, e := range entries {
		switch e.name {
		case "podSelector":
			if isNull(e.val) {
				continue
			}
			s, err := d.selector(e.val, e.path, k8sSelector)
			if err != nil {
				return Peer{}, err
			}
			podSel = &s
		case "namespaceSelector":
			if isNull(e.val) {
				continue
			}
			s, err := d.selector(e.val, e.path, selectorSyntax{keyPrefix: labels.KeyNamespaceLabelPrefix})
			if err != nil {
				return Peer{}, err
			}
			nsSel = &s
		case "ipBlock":
			if isNull(e.val) {
				continue
			}
			ipBlock = &entries[i]
		default:
			return Peer{}, d.unknown(e)
		}
	}
	if ipBlock != nil {
		if podSel != nil || nsSel != nil {
			return Peer{}, d.fail(ipBlock.key, ipBlock.path, "ipBlock cannot be combined with podSelector or namespaceSelector in one peer")
		}
		return d.ipBlock(ipBlock.val, ipBlock.path)
	}
	switch {
	case podSel != nil && nsSel != nil:
		// Pods matching podSelector in namespaces matching namespaceSelector.
		return Peer{Kind: PeerEndpoints, Selector: inAnyNamespace(podSel.And(*nsSel))}, nil
	case nsSel != nil:
		// Every pod in the selected namespaces. The namespace requirement keeps a selector
		// such as NotIn from matching reserved identities, which have no namespace labels.
		return Peer{Kind: PeerEndpoints, Selector: inAnyNamespace(*nsSel)}, nil
	case podSel != nil:
		return Peer{Kind: PeerEndpoints, Selector: inNamespace(*podSel, d.namespace)}, nil
	}
	return Peer{}, d.fail(n, path, "a peer needs podSelector, namespaceSelector or ipBlock")
}

func (d *docParser) ipBlock(n *yaml.Node, path string) (Peer, error) {
	entries, err := d.mapping(n, path)
	if err != nil {
		return Peer{}, err
	}
	var cidr, except *entry
	for i, e := range entries {
		switch e.name {
		case "cidr":
			cidr = &entries[i]
		case "except":
			except = &entries[i]
		default:
			return Peer{}, d.unknown(e)
		}
	}
	if cidr == nil {
		return Peer{}, d.fail(n, fieldPath(path, "cidr"), ReasonRequired)
	}
	var exceptNode *yaml.Node
	exceptPath := fieldPath(path, "except")
	if except != nil {
		exceptNode = except.val
	}
	return d.cidrPeer(cidr.val, cidr.path, exceptNode, exceptPath, true)
}
