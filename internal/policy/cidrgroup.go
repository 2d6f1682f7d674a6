package policy

import (
	"net/netip"

	"gopkg.in/yaml.v3"
)

// ValidCIDRGroupName reports whether s can name a CIDR group: a Kubernetes object name
// (RFC 1123 subdomain, at most 253 characters), as Cilium requires of cidrGroupRef. Such a
// name is also a safe file name (no '/', never "." or "..").
func ValidCIDRGroupName(s string) bool { return validName(s) }

// cidrGroup parses the spec of a CiliumCIDRGroup (metadata already checked):
//
//	spec:
//	  externalCIDRs: [CIDR, ...]
//
// externalCIDRs is required and may be empty (Cilium: MinItems 0). Every entry must be a
// prefix (Cilium's format: cidr); host bits are cleared.
func (d *docParser) cidrGroup(doc *yaml.Node, top []entry) (*CIDRGroup, error) {
	g := &CIDRGroup{Name: d.name, Source: d.sourceName()}
	var specE *entry
	for i, e := range top {
		switch e.name {
		case "apiVersion", "kind", "metadata":
		case "spec":
			specE = &top[i]
		default:
			return nil, d.unknown(e)
		}
	}
	if specE == nil {
		return nil, d.fail(doc, "spec", ReasonRequired)
	}
	entries, err := d.mapping(specE.val, specE.path)
	if err != nil {
		return nil, err
	}
	found := false
	for _, e := range entries {
		switch e.name {
		case "externalCIDRs":
			found = true
			if isNull(e.val) {
				return nil, d.fail(e.val, e.path, "must be a list of CIDRs (write [] for none)")
			}
			items, err := d.sequence(e.val, e.path)
			if err != nil {
				return nil, err
			}
			g.CIDRs = make([]netip.Prefix, 0, len(items))
			for i, it := range items {
				p, err := d.prefix(it, indexPath(e.path, i), false)
				if err != nil {
					return nil, err
				}
				g.CIDRs = append(g.CIDRs, p)
			}
		default:
			return nil, d.unknown(e)
		}
	}
	if !found {
		return nil, d.fail(specE.val, fieldPath(specE.path, "externalCIDRs"), ReasonRequired)
	}
	if g.Raw, err = d.toJSON(doc); err != nil {
		return nil, err
	}
	return g, nil
}
