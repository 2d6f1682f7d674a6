package agent

import (
	"context"
	"fmt"
	"maps"
	"net/netip"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/podaddr"
)

// Other nodes and the pods on them. In Kubernetes mode the watcher feeds them with the
// rest of the cluster view (cluster.go); standalone, they are declared through the API
// (rampart node, rampart remote). A remote pod's identity is
// derived from its labels and namespace labels exactly as a local endpoint's, so policy
// selects it by labels; the ipcache maps its address to that identity and to its node's
// address, the tunnel endpoint the overlay sends its packets to.

// Overlay is the network between nodes in the node namespace: the VXLAN device and its
// programs, and the routes to the other nodes' pod CIDRs.
type Overlay interface {
	// SetupOverlay prepares mode (VXLAN: the device and its programs; otherwise none, and
	// the programs of another mode go).
	SetupOverlay(netnsPath string, mode overlay.Mode) error
	// SyncNodeRoutes makes the routes to the other nodes' pod CIDRs those of nodes (and
	// with IP-in-IP puts its programs on the interfaces those routes leave through).
	SyncNodeRoutes(netnsPath string, mode overlay.Mode, src netip.Addr, nodes []overlay.Node) error
}

// syncRoutes makes the node's routes to the other nodes' pod CIDRs follow m's nodes.
func (a *Agent) syncRoutes(m *model) error {
	nodes := make([]overlay.Node, 0, len(m.nodes))
	for _, name := range sortedKeys(m.nodes) {
		n := m.nodes[name]
		nodes = append(nodes, overlay.Node{Address: n.Address, PodCIDR: n.PodCIDR, PodCIDR6: n.PodCIDR6, Address6: n.Address6})
	}
	if a.host && !a.own.OverlayRoutes {
		a.own.OverlayRoutes = true
		if err := a.own.save(); err != nil {
			return err
		}
	}
	return a.dp.SyncNodeRoutes(a.net.NetnsPath(), a.cfg.Tunnel, a.net.Router(), nodes)
}

// NodeRecord is another node as persisted.
type NodeRecord struct {
	Name    string       `json:"name"`
	Address netip.Addr   `json:"address"`
	PodCIDR netip.Prefix `json:"podCIDR,omitzero"`
	// PodCIDR6 is its IPv6 pod CIDR on a dual-stack cluster (zero: none; only with
	// PodCIDR): its pods' IPv6 addresses are derived from their IPv4 ones as this node's
	// endpoints' are (remoteIP6).
	PodCIDR6 netip.Prefix `json:"podCIDR6,omitzero"`
	// Address6 is its IPv6 address on the fabric (zero: none): native routing's gateway to
	// PodCIDR6, and like Address a remote-node address in the ipcache.
	Address6 netip.Addr `json:"address6,omitzero"`
}

// checkNodeCIDR6 says why n's IPv6 pod CIDR cannot be taken on a node whose overlay is mode
// and whose own IPv6 pod CIDR is own6 (nil: it can, or n has none).
func checkNodeCIDR6(n *NodeRecord, mode overlay.Mode, own6 netip.Prefix) error {
	switch {
	case !n.PodCIDR6.IsValid():
		return nil
	case !overlay.CarriesIPv6(mode, n.Address6):
		return fmt.Errorf("IPv6 pod CIDR %v: %w", n.PodCIDR6, overlay.CheckIPv6(mode, n.Address6))
	case !n.PodCIDR.IsValid():
		return fmt.Errorf("IPv6 pod CIDR %v: needs the node's IPv4 pod CIDR too (its pods' IPv6 addresses are derived from their IPv4 ones)", n.PodCIDR6)
	case own6.IsValid() && n.PodCIDR6.Overlaps(own6):
		return fmt.Errorf("IPv6 pod CIDR %v overlaps this node's %v", n.PodCIDR6, own6)
	}
	if err := podaddr.CheckPrefix6(n.PodCIDR, n.PodCIDR6); err != nil {
		return fmt.Errorf("IPv6 pod CIDR %v: %w", n.PodCIDR6, err)
	}
	return nil
}

// checkNodeAddress6 says why addr cannot be another node's IPv6 fabric address on a node
// whose IPv6 router address is router6 (nil: it can). A link-local address is refused: a
// route via it would need the interface named, which the node record does not say.
func checkNodeAddress6(addr, router6 netip.Addr) error {
	switch {
	case !addr.Is6() || addr.Is4In6() || addr.IsUnspecified() || addr.IsMulticast() || addr.IsLoopback() || addr.IsLinkLocalUnicast():
		return fmt.Errorf("address6 %v: want the node's global or unique-local IPv6 unicast address on the fabric", addr)
	case router6.IsValid() && addr == router6:
		return fmt.Errorf("address6 %v is this node's IPv6 router address", addr)
	}
	return nil
}

// overlappingCIDR6 returns the name of a node of nodes other than n whose IPv6 pod CIDR
// overlaps n's ("" none): their pods' derived IPv6 addresses could be the same.
func overlappingCIDR6(nodes map[string]*NodeRecord, n *NodeRecord) string {
	if !n.PodCIDR6.IsValid() {
		return ""
	}
	for _, name := range sortedKeys(nodes) {
		if o := nodes[name]; name != n.Name && o.PodCIDR6.IsValid() && o.PodCIDR6.Overlaps(n.PodCIDR6) {
			return name
		}
	}
	return ""
}

// remoteIP6 is the IPv6 address of the pod at ip on node n: its offset in the node's IPv4
// pod CIDR added to its IPv6 one, as podaddr gives the node's own endpoints theirs (the
// node's Rampart did the same). Zero for a node without an IPv6 pod CIDR, or an address
// with none (outside the IPv4 pod CIDR, or the router's offset).
func remoteIP6(n *NodeRecord, ip netip.Addr) netip.Addr {
	if !n.PodCIDR.IsValid() || !n.PodCIDR6.IsValid() {
		return netip.Addr{}
	}
	ip6, _, err := podaddr.Addrs(n.PodCIDR, n.PodCIDR6, ip)
	if err != nil {
		return netip.Addr{}
	}
	return ip6
}

// RemoteEndpointRecord is a pod on another node as persisted. Immutable once in a model.
type RemoteEndpointRecord struct {
	Namespace      string        `json:"namespace"`
	Name           string        `json:"name"`
	Node           string        `json:"node"`
	IP             netip.Addr    `json:"ip"`
	Labels         labels.Labels `json:"labels"`
	ServiceAccount string        `json:"serviceAccount,omitempty"`
	// Identity is the number its node gave its labels (0: allocated here); see
	// api.RemoteEndpointSpec.Identity.
	Identity identity.Identity `json:"identity,omitempty"`
	// Monitor: a monitor endpoint on its node, which this node's tap contracts may name.
	Monitor bool `json:"monitor,omitempty"`
	// Ports are its named ports (Kubernetes: its containers' ports), against which this
	// node's egress rules that name a port resolve when the pod is the peer.
	Ports []PortRecord `json:"ports,omitempty"`
}

// Key is "namespace/name".
func (r *RemoteEndpointRecord) Key() string { return r.Namespace + "/" + r.Name }

// fullLabels is the label set the remote pod's identity is made of (as a local one's).
func (r *RemoteEndpointRecord) fullLabels(nsLabels labels.Labels) labels.Labels {
	return fullLabels(&EndpointRecord{Namespace: r.Namespace, Labels: r.Labels, ServiceAccount: r.ServiceAccount}, nsLabels)
}

// remoteInput adds m's other nodes and remote pods to the computation's input: their
// identities come from alloc (claimed for the number the cluster gave them by
// claimIdentities, else ForLabels) and their label sets are returned so that Retain keeps
// them. Remote pods in skip (their identity unresolved) are left out: their addresses
// have no identity here, so no policy that selects a pod admits them. Where mode carries
// IPv6 to a pod's node (overlay.CarriesIPv6) its IPv6 address is its too; elsewhere no route
// leads to that address, and nothing is admitted on it.
func remoteInput(m *model, alloc *identity.Allocator, in *mapstate.Input, skip map[string]string, mode overlay.Mode) []labels.Labels {
	var used []labels.Labels
	for _, name := range sortedKeys(m.nodes) {
		n := m.nodes[name]
		in.NodeIPs = append(in.NodeIPs, n.Address)
		if n.Address6.IsValid() {
			in.NodeIPs = append(in.NodeIPs, n.Address6)
		}
	}
	for _, key := range sortedKeys(m.remotes) {
		r := m.remotes[key]
		node, ok := m.nodes[r.Node]
		if !ok {
			continue // cannot happen: DeleteNode removes its pods
		}
		if _, ok := skip[key]; ok {
			continue
		}
		full := r.fullLabels(m.namespaces[r.Namespace])
		used = append(used, full)
		rem := mapstate.RemoteEndpoint{
			Namespace: r.Namespace, Name: r.Name, Labels: full,
			Identity: alloc.ForLabels(full), IP: r.IP, Node: node.Address,
			NamedPorts: namedPorts(r.Ports),
		}
		if overlay.CarriesIPv6(mode, node.Address6) {
			rem.IP6 = remoteIP6(node, r.IP)
		}
		in.Remote = append(in.Remote, rem)
	}
	return used
}

// ListNodes lists the other nodes.
func (a *Agent) ListNodes(ctx context.Context) ([]api.Node, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []api.Node{}
	for _, name := range sortedKeys(a.model.nodes) {
		out = append(out, nodeView(a.model, a.model.nodes[name]))
	}
	return out, nil
}

func nodeView(m *model, n *NodeRecord) api.Node {
	v := api.Node{Name: n.Name, Address: n.Address.String(), Address6: addrOrEmpty(n.Address6)}
	if n.PodCIDR.IsValid() {
		v.PodCIDR = n.PodCIDR.String()
	}
	if n.PodCIDR6.IsValid() {
		v.PodCIDR6 = n.PodCIDR6.String()
	}
	for _, r := range m.remotes {
		if r.Node == n.Name {
			v.RemoteEndpoints++
		}
	}
	return v
}

// PutNode declares another node or changes its address or pod CIDR.
func (a *Agent) PutNode(ctx context.Context, name string, spec api.NodeSpec) (api.Node, error) {
	if err := a.errManaged("nodes"); err != nil {
		return api.Node{}, err
	}
	if err := validateNodeName(name); err != nil {
		return api.Node{}, err
	}
	rec := &NodeRecord{Name: name}
	addr, err := netip.ParseAddr(spec.Address)
	if err != nil || !addr.Is4() || addr.IsUnspecified() || addr.IsMulticast() {
		return api.Node{}, api.BadRequest("node %s: address %q: want the node's IPv4 unicast address", name, spec.Address)
	}
	rec.Address = addr
	if spec.PodCIDR != "" {
		p, err := netip.ParsePrefix(spec.PodCIDR)
		if err != nil || !p.Addr().Is4() || p != p.Masked() {
			return api.Node{}, api.BadRequest("node %s: podCIDR %q: want an IPv4 prefix such as 10.1.2.0/24", name, spec.PodCIDR)
		}
		rec.PodCIDR = p
	}
	if spec.Address6 != "" {
		addr6, err := netip.ParseAddr(spec.Address6)
		if err != nil {
			return api.Node{}, api.BadRequest("node %s: address6 %q: want the node's IPv6 address on the fabric", name, spec.Address6)
		}
		if err := checkNodeAddress6(addr6, a.eng.router6); err != nil {
			return api.Node{}, api.BadRequest("node %s: %v", name, err)
		}
		rec.Address6 = addr6
	}
	if spec.PodCIDR6 != "" {
		p, err := netip.ParsePrefix(spec.PodCIDR6)
		if err != nil || !p.Addr().Is6() || p != p.Masked() {
			return api.Node{}, api.BadRequest("node %s: podCIDR6 %q: want an IPv6 prefix such as 2001:db8:0:2::/64", name, spec.PodCIDR6)
		}
		rec.PodCIDR6 = p
	}
	if err := checkNodeCIDR6(rec, a.cfg.Tunnel, a.cfg.PodCIDR6); err != nil {
		return api.Node{}, api.BadRequest("node %s: %v", name, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range a.model.nodes {
		if n.Name != name && n.Address == addr {
			return api.Node{}, api.Conflict("node %s: address %v is node %s's", name, addr, n.Name)
		}
		if n.Name != name && rec.Address6.IsValid() && n.Address6 == rec.Address6 {
			return api.Node{}, api.Conflict("node %s: address6 %v is node %s's", name, rec.Address6, n.Name)
		}
	}
	if addr == a.net.Router() {
		return api.Node{}, api.Conflict("node %s: address %v is this node's router address", name, addr)
	}
	if other := overlappingCIDR6(a.model.nodes, rec); other != "" {
		return api.Node{}, api.Conflict("node %s: IPv6 pod CIDR %v overlaps node %s's", name, rec.PodCIDR6, other)
	}
	m, _, err := a.change(func(m *model) error {
		m.nodes = maps.Clone(m.nodes)
		m.nodes[name] = rec
		return nil
	})
	if err != nil {
		return api.Node{}, err
	}
	if err := a.syncRoutes(m); err != nil {
		return api.Node{}, err
	}
	return nodeView(m, rec), nil
}

// DeleteNode removes another node and every remote pod on it.
func (a *Agent) DeleteNode(ctx context.Context, name string) error {
	if err := a.errManaged("nodes"); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.model.nodes[name]; !ok {
		return api.NotFound("node %s not found", name)
	}
	m, _, err := a.change(func(m *model) error {
		m.nodes = maps.Clone(m.nodes)
		delete(m.nodes, name)
		m.remotes = maps.Clone(m.remotes)
		for k, r := range m.remotes {
			if r.Node == name {
				delete(m.remotes, k)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return a.syncRoutes(m)
}

// ListRemoteEndpoints lists the pods on other nodes with their identities.
func (a *Agent) ListRemoteEndpoints(ctx context.Context) ([]api.RemoteEndpoint, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []api.RemoteEndpoint{}
	for _, key := range sortedKeys(a.model.remotes) {
		out = append(out, a.remoteView(a.model, a.cur, a.model.remotes[key]))
	}
	return out, nil
}

func (a *Agent) remoteView(m *model, d *desired, r *RemoteEndpointRecord) api.RemoteEndpoint {
	v := api.RemoteEndpoint{Namespace: r.Namespace, Name: r.Name, Node: r.Node, IP: r.IP.String(),
		Labels: map[string]string(maps.Clone(r.Labels)), Monitor: r.Monitor, Ports: apiPorts(r.Ports)}
	if n := m.nodes[r.Node]; n != nil && overlay.CarriesIPv6(a.cfg.Tunnel, n.Address6) {
		v.IP6 = addrOrEmpty(remoteIP6(n, r.IP))
	}
	if e, ok := d.state.IPCache[netip.PrefixFrom(r.IP, r.IP.BitLen())]; ok {
		v.Identity = uint32(e.Identity)
	}
	return v
}

// PutRemoteEndpoint declares a pod on another node, or changes its node, address or labels.
func (a *Agent) PutRemoteEndpoint(ctx context.Context, namespace, name string, spec api.RemoteEndpointSpec) (api.RemoteEndpoint, error) {
	if err := a.errManaged("remote endpoints"); err != nil {
		return api.RemoteEndpoint{}, err
	}
	if err := validateNamespace(namespace); err != nil {
		return api.RemoteEndpoint{}, err
	}
	if err := validateName(name); err != nil {
		return api.RemoteEndpoint{}, err
	}
	l, err := validateLabels(spec.Labels)
	if err != nil {
		return api.RemoteEndpoint{}, err
	}
	ip, err := netip.ParseAddr(spec.IP)
	if err != nil || !ip.Is4() || ip.IsUnspecified() {
		return api.RemoteEndpoint{}, api.BadRequest("remote endpoint %s/%s: ip %q: want the pod's IPv4 address", namespace, name, spec.IP)
	}
	ports, err := validatePorts(spec.Ports)
	if err != nil {
		return api.RemoteEndpoint{}, api.BadRequest("remote endpoint %s/%s: %v", namespace, name, err)
	}
	rec := &RemoteEndpointRecord{Namespace: namespace, Name: name, Node: spec.Node, IP: ip, Labels: l,
		ServiceAccount: spec.ServiceAccount, Identity: identity.Identity(spec.Identity), Monitor: spec.Monitor, Ports: ports}
	a.mu.Lock()
	defer a.mu.Unlock()
	node, ok := a.model.nodes[spec.Node]
	if !ok {
		return api.RemoteEndpoint{}, api.BadRequest("remote endpoint %s/%s: node %q: no such node (rampart node add)", namespace, name, spec.Node)
	}
	if node.PodCIDR.IsValid() && !node.PodCIDR.Contains(ip) {
		return api.RemoteEndpoint{}, api.BadRequest("remote endpoint %s/%s: ip %v is outside node %s's pod CIDR %v", namespace, name, ip, node.Name, node.PodCIDR)
	}
	if a.cfg.PodCIDR.Contains(ip) {
		return api.RemoteEndpoint{}, api.BadRequest("remote endpoint %s/%s: ip %v is inside this node's pod CIDR %v", namespace, name, ip, a.cfg.PodCIDR)
	}
	for _, r := range a.model.remotes {
		if r.IP == ip && r.Key() != rec.Key() {
			return api.RemoteEndpoint{}, api.Conflict("remote endpoint %s/%s: ip %v is remote endpoint %s's", namespace, name, ip, r.Key())
		}
	}
	if rec.Identity != 0 {
		// The local API's caller chooses the number: one that other labels have here is
		// refused, rather than taken from them as the cluster's numbers are.
		full := rec.fullLabels(nsLabelsOf(a.model, namespace))
		if have, ok := a.cur.alloc.Labels(rec.Identity); ok && identity.LabelsKey(have) != identity.LabelsKey(full) {
			return api.RemoteEndpoint{}, api.Conflict("remote endpoint %s/%s: identity %d belongs to labels %s here", namespace, name, rec.Identity, have)
		}
	}
	m, d, err := a.change(func(m *model) error {
		m.ensureNamespace(namespace)
		m.remotes = maps.Clone(m.remotes)
		m.remotes[rec.Key()] = rec
		return nil
	})
	if err != nil {
		return api.RemoteEndpoint{}, err
	}
	return a.remoteView(m, d, rec), nil
}

// DeleteRemoteEndpoint removes a pod on another node.
func (a *Agent) DeleteRemoteEndpoint(ctx context.Context, namespace, name string) error {
	if err := a.errManaged("remote endpoints"); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	key := namespace + "/" + name
	if _, ok := a.model.remotes[key]; !ok {
		return api.NotFound("remote endpoint %s not found", key)
	}
	_, _, err := a.change(func(m *model) error {
		m.remotes = maps.Clone(m.remotes)
		delete(m.remotes, key)
		return nil
	})
	return err
}

// validateNodeName checks a node name (a DNS subdomain, as in Kubernetes).
func validateNodeName(name string) error {
	if len(name) > 253 || !dnsSubdomainRE.MatchString(name) {
		return api.BadRequest("node name %q: want a DNS subdomain (lowercase letters, digits, '-', '.')", name)
	}
	return nil
}
