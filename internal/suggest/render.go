package suggest

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Kinds of the policies written.
const (
	KindNetworkPolicy       = "NetworkPolicy"
	KindCiliumNetworkPolicy = "CiliumNetworkPolicy"
)

// Label keys of namespace scoping in peers: Kubernetes puts the first on every
// namespace; Cilium's selectors name an endpoint's namespace with the second.
const (
	keyNamespaceName   = "kubernetes.io/metadata.name"
	keyCiliumNamespace = "k8s:io.kubernetes.pod.namespace"
)

type manifest struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   metadata `yaml:"metadata"`
	Spec       any      `yaml:"spec"`
}

type metadata struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels,omitempty"`
}

type npSpec struct {
	PodSelector labelSelector `yaml:"podSelector"`
	PolicyTypes []string      `yaml:"policyTypes"`
	Ingress     []npRule      `yaml:"ingress,omitempty"`
	Egress      []npRule      `yaml:"egress,omitempty"`
}

type npRule struct {
	From  []npPeer `yaml:"from,omitempty"`
	To    []npPeer `yaml:"to,omitempty"`
	Ports []npPort `yaml:"ports"`
}

type npPeer struct {
	NamespaceSelector *labelSelector `yaml:"namespaceSelector,omitempty"`
	PodSelector       *labelSelector `yaml:"podSelector,omitempty"`
	IPBlock           *ipBlock       `yaml:"ipBlock,omitempty"`
}

type ipBlock struct {
	CIDR string `yaml:"cidr"`
}

type npPort struct {
	Protocol string `yaml:"protocol"`
	Port     uint16 `yaml:"port"`
}

type cnpSpec struct {
	EndpointSelector labelSelector `yaml:"endpointSelector"`
	Ingress          []cnpRule     `yaml:"ingress,omitempty"`
	Egress           []cnpRule     `yaml:"egress,omitempty"`
}

type cnpRule struct {
	FromEndpoints []labelSelector `yaml:"fromEndpoints,omitempty"`
	FromCIDR      []string        `yaml:"fromCIDR,omitempty"`
	FromEntities  []string        `yaml:"fromEntities,omitempty"`
	ToEndpoints   []labelSelector `yaml:"toEndpoints,omitempty"`
	ToCIDR        []string        `yaml:"toCIDR,omitempty"`
	ToEntities    []string        `yaml:"toEntities,omitempty"`
	ToPorts       []cnpPortRule   `yaml:"toPorts,omitempty"`
	ICMPs         []cnpICMP       `yaml:"icmps,omitempty"`
}

type cnpPortRule struct {
	Ports []cnpPort `yaml:"ports"`
	Rules *cnpL7    `yaml:"rules,omitempty"`
}

type cnpPort struct {
	Port     string `yaml:"port"`
	Protocol string `yaml:"protocol"`
}

type cnpL7 struct {
	HTTP []cnpHTTP `yaml:"http"`
}

type cnpHTTP struct {
	Method string `yaml:"method,omitempty"`
	Path   string `yaml:"path,omitempty"`
}

type cnpICMP struct {
	Fields []icmpField `yaml:"fields"`
}

type icmpField struct {
	Type   uint16 `yaml:"type"`
	Family string `yaml:"family"`
}

// group is the peers of a policy that were seen on the same ports (and, with L7, with the
// same requests): one rule.
type group struct {
	sig   string
	peers []peerKey
	ports map[port][]HTTP // nil slice: L3/L4 only
}

// policies builds the policy documents, sorted by namespace, name.
func (s *state) policies() ([]Policy, []string) {
	var out []Policy
	var notes []string
	names := map[string]bool{}
	for _, id := range sortedKeys(s.workloads) {
		w := s.workloads[id]
		if !s.wanted(w) {
			continue
		}
		for _, dir := range []string{"ingress", "egress"} {
			seen := s.ingress[id]
			if dir == "egress" {
				seen = s.egress[id]
			}
			if len(seen) == 0 {
				continue
			}
			groups, n := s.groups(w, dir, seen)
			notes = append(notes, n...)
			if len(groups) == 0 {
				continue
			}
			sel, note := s.subjectSelector(w)
			if note != "" {
				notes = append(notes, note)
			}
			name := uniqueName(names, w.ns, "suggested-"+baseName(w)+"-"+dir)
			p, n, err := s.render(w, dir, name, sel, groups)
			if err != nil {
				notes = append(notes, fmt.Sprintf("%s/%s: %v", w.ns, name, err))
				continue
			}
			notes = append(notes, n...)
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Policy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out, notes
}

// groups merges the peers seen with the same ports (and requests) into one rule each.
func (s *state) groups(w *workload, dir string, seen map[peerKey]map[port]map[HTTP]bool) ([]*group, []string) {
	var notes []string
	bySig := map[string]*group{}
	for peer, ports := range seen {
		g := &group{ports: map[port][]HTTP{}}
		var sig []string
		for p, reqs := range ports {
			var hs []HTTP
			if dir == "ingress" && s.opts.L7 && s.l7Ports[w.id][p] {
				if len(reqs) == 0 {
					// The proxy saw requests on this port, none of this peer's allowed:
					// admitting it at L3/L4 would admit every request.
					notes = append(notes, fmt.Sprintf("%s -> %s %s is left out: the L7 proxy saw no allowed request of it", s.peerName(peer), w.name(), portString(p)))
					continue
				}
				for h := range reqs {
					hs = append(hs, h)
				}
				slices.SortFunc(hs, func(a, b HTTP) int { return strings.Compare(a.Method+" "+a.Path, b.Method+" "+b.Path) })
			}
			g.ports[p] = hs
			sig = append(sig, fmt.Sprintf("%s %v", portString(p), hs))
		}
		if len(sig) == 0 {
			continue
		}
		slices.Sort(sig)
		key := strings.Join(sig, "|")
		if bySig[key] == nil {
			g.sig = key
			bySig[key] = g
		}
		bySig[key].peers = append(bySig[key].peers, peer)
	}
	var out []*group
	for _, k := range sortedKeys(bySig) {
		out = append(out, bySig[k])
	}
	return out, notes
}

func (s *state) peerName(p peerKey) string {
	switch {
	case p.workload != "":
		return s.workloads[p.workload].name()
	case p.entity != "":
		return p.entity
	}
	return p.cidr
}

// name is ns/ep1,ep2 for messages.
func (w *workload) name() string { return w.ns + "/" + strings.Join(w.endpoints, ",") }

// peers splits a group's peers into selectors (by namespace), prefixes and entities,
// sorted.
type peerSet struct {
	selectors []nsSelector
	cidrs     []string
	entities  []string
}

type nsSelector struct {
	ns     string
	labels map[string]string
}

func (s *state) peerSet(g *group) (peerSet, []string) {
	var ps peerSet
	var notes []string
	byNS := map[string][]*workload{}
	for _, p := range g.peers {
		switch {
		case p.workload != "":
			w := s.workloads[p.workload]
			byNS[w.ns] = append(byNS[w.ns], w)
		case p.entity != "":
			ps.entities = append(ps.entities, p.entity)
		default:
			ps.cidrs = append(ps.cidrs, p.cidr)
		}
	}
	for _, ns := range sortedKeys(byNS) {
		ws := byNS[ns]
		slices.SortFunc(ws, func(a, b *workload) int { return strings.Compare(a.id, b.id) })
		sels, n := s.peerSelectors(ns, ws)
		notes = append(notes, n...)
		for _, sel := range sels {
			ps.selectors = append(ps.selectors, nsSelector{ns, sel})
		}
	}
	slices.SortFunc(ps.selectors, func(a, b nsSelector) int {
		return strings.Compare(a.ns+"/"+labelString(a.labels), b.ns+"/"+labelString(b.labels))
	})
	ps.selectors = slices.CompactFunc(ps.selectors, func(a, b nsSelector) bool {
		return a.ns == b.ns && labelString(a.labels) == labelString(b.labels)
	})
	slices.Sort(ps.cidrs)
	slices.Sort(ps.entities)
	return ps, notes
}

// render writes one policy: a NetworkPolicy when it can say everything, else a
// CiliumNetworkPolicy (entities, ICMP, HTTP rules).
func (s *state) render(w *workload, dir, name string, sel map[string]string, groups []*group) (Policy, []string, error) {
	var notes []string
	sets := make([]peerSet, len(groups))
	cilium := false
	for i, g := range groups {
		ps, n := s.peerSet(g)
		notes = append(notes, n...)
		sets[i] = ps
		if len(ps.entities) > 0 {
			cilium = true
		}
		for p, hs := range g.ports {
			if p.icmp() || hs != nil {
				cilium = true
			}
		}
	}
	m := manifest{Metadata: metadata{Name: name, Namespace: w.ns}}
	if s.opts.Audit {
		m.Metadata.Annotations = map[string]string{AuditAnnotation: "true"}
	}
	if cilium {
		m.APIVersion, m.Kind = "cilium.io/v2", KindCiliumNetworkPolicy
		spec := cnpSpec{EndpointSelector: labelSelector{MatchLabels: sel}}
		for i, g := range groups {
			rules := cnpRules(w.ns, dir, sets[i], g)
			if dir == "ingress" {
				spec.Ingress = append(spec.Ingress, rules...)
			} else {
				spec.Egress = append(spec.Egress, rules...)
			}
		}
		m.Spec = spec
	} else {
		m.APIVersion, m.Kind = "networking.k8s.io/v1", KindNetworkPolicy
		spec := npSpec{PodSelector: labelSelector{MatchLabels: sel}}
		for i, g := range groups {
			r := npRule{Ports: npPorts(g)}
			peers := npPeers(w.ns, sets[i])
			if dir == "ingress" {
				r.From = peers
				spec.Ingress = append(spec.Ingress, r)
			} else {
				r.To = peers
				spec.Egress = append(spec.Egress, r)
			}
		}
		spec.PolicyTypes = []string{"Ingress"}
		if dir == "egress" {
			spec.PolicyTypes = []string{"Egress"}
		}
		m.Spec = spec
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(m); err != nil {
		return Policy{}, notes, fmt.Errorf("encoding %s: %w", name, err)
	}
	if err := enc.Close(); err != nil {
		return Policy{}, notes, fmt.Errorf("encoding %s: %w", name, err)
	}
	return Policy{Kind: m.Kind, Namespace: w.ns, Name: name, YAML: b.Bytes()}, notes, nil
}

func sortedPorts(g *group) []port {
	var ps []port
	for p := range g.ports {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, comparePorts)
	return ps
}

func npPorts(g *group) []npPort {
	var out []npPort
	for _, p := range sortedPorts(g) {
		out = append(out, npPort{Protocol: p.Proto, Port: p.Port})
	}
	return out
}

func npPeers(policyNS string, ps peerSet) []npPeer {
	var out []npPeer
	for _, sel := range ps.selectors {
		p := npPeer{PodSelector: &labelSelector{MatchLabels: sel.labels}}
		if sel.ns != policyNS {
			p.NamespaceSelector = &labelSelector{MatchLabels: map[string]string{keyNamespaceName: sel.ns}}
			if len(sel.labels) == 0 {
				p.PodSelector = nil // every pod of the namespace
			}
		}
		out = append(out, p)
	}
	for _, c := range ps.cidrs {
		out = append(out, npPeer{IPBlock: &ipBlock{CIDR: c}})
	}
	return out
}

// cnpRules are the rules of one group: one with toPorts (L3/L4 ports together, a port
// with HTTP rules on its own) and, if ICMP was seen, one with icmps (Cilium refuses both
// in one rule).
func cnpRules(policyNS, dir string, ps peerSet, g *group) []cnpRule {
	var eps []labelSelector
	for _, sel := range ps.selectors {
		l := map[string]string{}
		for k, v := range sel.labels {
			l[k] = v
		}
		if sel.ns != policyNS {
			l[keyCiliumNamespace] = sel.ns
		}
		eps = append(eps, labelSelector{MatchLabels: l})
	}
	base := cnpRule{}
	if dir == "ingress" {
		base.FromEndpoints, base.FromCIDR, base.FromEntities = eps, ps.cidrs, ps.entities
	} else {
		base.ToEndpoints, base.ToCIDR, base.ToEntities = eps, ps.cidrs, ps.entities
	}
	var l4 []cnpPort
	var withL7 []cnpPortRule
	var icmps []cnpICMP
	for _, p := range sortedPorts(g) {
		switch hs := g.ports[p]; {
		case p.icmp():
			family := "IPv4"
			if p.Proto == "ICMPv6" {
				family = "IPv6"
			}
			icmps = append(icmps, cnpICMP{Fields: []icmpField{{Type: p.Port, Family: family}}})
		case hs != nil:
			r := cnpPortRule{Ports: []cnpPort{{Port: strconv.Itoa(int(p.Port)), Protocol: p.Proto}}, Rules: &cnpL7{}}
			for _, h := range hs {
				// Cilium reads method and path as regular expressions matched whole.
				r.Rules.HTTP = append(r.Rules.HTTP, cnpHTTP{Method: regexp.QuoteMeta(h.Method), Path: regexp.QuoteMeta(h.Path)})
			}
			withL7 = append(withL7, r)
		default:
			l4 = append(l4, cnpPort{Port: strconv.Itoa(int(p.Port)), Protocol: p.Proto})
		}
	}
	var out []cnpRule
	if len(l4) > 0 || len(withL7) > 0 {
		r := base
		if len(l4) > 0 {
			r.ToPorts = append(r.ToPorts, cnpPortRule{Ports: l4})
		}
		r.ToPorts = append(r.ToPorts, withL7...)
		out = append(out, r)
	}
	if len(icmps) > 0 {
		r := base
		r.ICMPs = icmps
		out = append(out, r)
	}
	return out
}

var nameInvalid = regexp.MustCompile(`[^a-z0-9.-]+`)

// baseName names a workload in its policies' names: the value of its first preferred
// label, else its stable labels' values, else its first endpoint's name.
func baseName(w *workload) string {
	var name string
	for _, k := range preferredKeys {
		if v, ok := w.stable[k]; ok && v != "" {
			name = v
			break
		}
	}
	if name == "" {
		var vals []string
		for _, k := range sortedKeys(w.stable) {
			vals = append(vals, w.stable[k])
		}
		name = strings.Join(vals, "-")
	}
	name = strings.Trim(nameInvalid.ReplaceAllString(strings.ToLower(name), "-"), "-.")
	if name == "" {
		name = strings.Trim(nameInvalid.ReplaceAllString(strings.ToLower(w.endpoints[0]), "-"), "-.")
	}
	if len(name) > 200 {
		name = strings.Trim(name[:200], "-.")
	}
	return name
}

// uniqueName returns name, or name-2, name-3... if namespace ns has it already.
func uniqueName(used map[string]bool, ns, name string) string {
	n := name
	for i := 2; used[ns+"/"+n]; i++ {
		n = fmt.Sprintf("%s-%d", name, i)
	}
	used[ns+"/"+n] = true
	return n
}

// Header is the comment block the manifests start with: the window, and the drops and
// flows the policies do not admit.
func (r Result) Header() string {
	var b strings.Builder
	if r.Flows == 0 {
		b.WriteString("# rampart policy suggest: no flows seen.\n")
	} else {
		fmt.Fprintf(&b, "# rampart policy suggest: %d policies from %d flows seen from %s to %s.\n", len(r.Policies), r.Flows,
			r.From.UTC().Format("2006-01-02T15:04:05Z"), r.To.UTC().Format("2006-01-02T15:04:05Z"))
		b.WriteString("# They admit the allowed traffic seen, and no other, in each direction they cover.\n")
	}
	if len(r.Dropped) > 0 {
		b.WriteString("# Dropped in that window and NOT admitted by these policies:\n")
		for _, d := range r.Dropped {
			b.WriteString("#   " + d + "\n")
		}
	}
	if len(r.Notes) > 0 {
		b.WriteString("# Notes:\n")
		for _, n := range r.Notes {
			b.WriteString("#   " + n + "\n")
		}
	}
	return b.String()
}

// YAML is the header followed by every policy, as one multi-document stream.
func (r Result) YAML() []byte {
	var b bytes.Buffer
	b.WriteString(r.Header())
	for _, p := range r.Policies {
		b.WriteString("---\n")
		b.Write(p.YAML)
	}
	return b.Bytes()
}
