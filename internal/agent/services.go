package agent

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/service"
)

// ServiceTable is the socket-level Service translation (datapath.Services): it makes the
// kernel translate exactly the table it is given. The agent writes it after the endpoints
// and the ipcache, so that a new backend's policy is in place before any socket is sent
// to it; whatever it translates to, the tc programs judge the backend.
type ServiceTable interface {
	Replace(service.Table) error
}

// ServiceRecord is a Service as declared (docs/services.md), persisted in the state.
type ServiceRecord struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// ClusterIP is its cluster address; a dual-stack Service has a second one, of the
	// other family, in ClusterIPs (which then holds both, ClusterIP first).
	ClusterIP  netip.Addr          `json:"clusterIP"`
	ClusterIPs []netip.Addr        `json:"clusterIPs,omitempty"`
	Ports      []ServicePortRecord `json:"ports"`
	// Selector picks the backends among the endpoints, local and remote, of the Service's
	// namespace (nil: none by label).
	Selector labels.Labels `json:"selector,omitempty"`
	// Endpoints are backends listed by address: the local API's addresses, or in
	// Kubernetes mode the ready endpoints of the Service's EndpointSlices.
	Endpoints []ServiceEndpointRecord `json:"endpoints,omitempty"`
}

// ServiceEndpointRecord is one listed backend: its address and its ports by the Service
// port's name (an EndpointSlice's ports; a port missing uses the target port).
type ServiceEndpointRecord struct {
	Addr  netip.Addr        `json:"addr"`
	Ports map[string]uint16 `json:"ports,omitempty"`
}

// ServicePortRecord is one port of a Service.
type ServicePortRecord struct {
	Name       string           `json:"name,omitempty"`
	Protocol   service.Protocol `json:"protocol"`
	Port       uint16           `json:"port"`
	TargetPort uint16           `json:"targetPort,omitempty"`
	NodePort   uint16           `json:"nodePort,omitempty"`
}

// Key is the record's namespace/name.
func (r *ServiceRecord) Key() string { return r.Namespace + "/" + r.Name }

// addrs are the Service's cluster addresses, ClusterIP first.
func (r *ServiceRecord) addrs() []netip.Addr {
	if len(r.ClusterIPs) > 0 {
		return r.ClusterIPs
	}
	return []netip.Addr{r.ClusterIP}
}

// serviceModel resolves the Services of m against its endpoints: the pure model's input.
func serviceModel(m *model) []service.Service {
	out := make([]service.Service, 0, len(m.services))
	for _, key := range sortedKeys(m.services) {
		r := m.services[key]
		s := service.Service{Namespace: r.Namespace, Name: r.Name, ClusterIPs: r.addrs()}
		for _, p := range r.Ports {
			s.Ports = append(s.Ports, service.Port{Name: p.Name, Protocol: p.Protocol, Port: p.Port, TargetPort: p.TargetPort, NodePort: p.NodePort})
		}
		for _, e := range r.Endpoints {
			s.Endpoints = append(s.Endpoints, service.Endpoint{Addr: e.Addr, Ports: e.Ports})
		}
		if r.Selector != nil {
			for _, key := range sortedKeys(m.endpoints) {
				e := m.endpoints[key]
				if e.Namespace == r.Namespace && !e.Monitor && selects(r.Selector, e.Labels) {
					s.Endpoints = append(s.Endpoints, service.Endpoint{Addr: e.IP})
					if e.IP6.IsValid() {
						s.Endpoints = append(s.Endpoints, service.Endpoint{Addr: e.IP6})
					}
				}
			}
			for _, key := range sortedKeys(m.remotes) {
				e := m.remotes[key]
				if e.Namespace == r.Namespace && !e.Monitor && selects(r.Selector, e.Labels) {
					s.Endpoints = append(s.Endpoints, service.Endpoint{Addr: e.IP})
				}
			}
		}
		out = append(out, s)
	}
	return out
}

// nodeAddrs are the addresses of the nodes, this one's (own, in Kubernetes mode) and the
// others', sorted: the frontends of NodePort Services.
func nodeAddrs(m *model, own netip.Addr) []netip.Addr {
	var out []netip.Addr
	if own.IsValid() {
		out = append(out, own)
	}
	for _, n := range m.nodes {
		out = append(out, n.Address)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// selects reports whether every label of sel is in l (a Service selector: equality only).
func selects(sel, l labels.Labels) bool {
	for k, v := range sel {
		if w, ok := l[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// applyServices writes the Service table when it changed (or forced). Without the
// translation, a table with Services is an error: the change is refused.
func (a *Agent) applyServices(old, new *desired, force bool) error {
	if !force && maps.EqualFunc(old.services, new.services, slices.Equal) {
		return nil
	}
	if a.dp.Services == nil {
		if len(new.services) == 0 {
			return nil
		}
		return fmt.Errorf("services: this agent has no Service translation")
	}
	if err := a.dp.Services.Replace(new.services); err != nil {
		return fmt.Errorf("services: %w", err)
	}
	return nil
}

// ListServices lists the Services with the backends they translate to now.
func (a *Agent) ListServices(ctx context.Context) ([]api.ServiceEntry, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []api.ServiceEntry{}
	for _, key := range sortedKeys(a.model.services) {
		out = append(out, serviceView(a.model.services[key], a.cur))
	}
	return out, nil
}

func serviceView(r *ServiceRecord, d *desired) api.ServiceEntry {
	v := api.ServiceEntry{Namespace: r.Namespace, Name: r.Name, Backends: []string{}}
	v.ClusterIP = r.ClusterIP.String()
	if len(r.ClusterIPs) > 0 {
		for _, ip := range r.ClusterIPs {
			v.ClusterIPs = append(v.ClusterIPs, ip.String())
		}
	}
	for _, p := range r.Ports {
		v.Ports = append(v.Ports, api.ServicePort{Name: p.Name, Protocol: p.Protocol.String(), Port: p.Port, TargetPort: p.TargetPort, NodePort: p.NodePort})
		for _, ip := range r.addrs() {
			for _, b := range d.services[service.Frontend{Addr: ip, Port: p.Port, Protocol: p.Protocol}] {
				v.Backends = append(v.Backends, b.Addr.String())
			}
		}
	}
	slices.Sort(v.Backends)
	v.Backends = slices.Compact(v.Backends)
	if r.Selector != nil {
		v.Selector = map[string]string(maps.Clone(r.Selector))
	}
	for _, e := range r.Endpoints {
		v.Addresses = append(v.Addresses, e.Addr.String())
	}
	return v
}

// PutService declares a Service or changes it.
func (a *Agent) PutService(ctx context.Context, namespace, name string, spec api.ServiceSpec) (api.ServiceEntry, error) {
	if err := a.errManaged("services"); err != nil {
		return api.ServiceEntry{}, err
	}
	rec, err := serviceRecord(namespace, name, spec)
	if err != nil {
		return api.ServiceEntry{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// Validated here, against the other Services, for an error that names the request.
	m := a.model.clone()
	m.services[rec.Key()] = rec
	if _, err := service.Compute(serviceModel(m), nodeAddrs(m, a.eng.nodeAddr)); err != nil {
		return api.ServiceEntry{}, api.BadRequest("%v", err)
	}
	_, d, err := a.change(func(m *model) error {
		m.services[rec.Key()] = rec
		return nil
	})
	if err != nil {
		return api.ServiceEntry{}, err
	}
	return serviceView(rec, d), nil
}

// DeleteService removes a Service: its address is translated no more.
func (a *Agent) DeleteService(ctx context.Context, namespace, name string) error {
	if err := a.errManaged("services"); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	key := namespace + "/" + name
	if _, ok := a.model.services[key]; !ok {
		return api.NotFound("service %s not found", key)
	}
	_, _, err := a.change(func(m *model) error {
		delete(m.services, key)
		return nil
	})
	return err
}

// serviceRecord validates a Service's declaration into its record.
func serviceRecord(namespace, name string, spec api.ServiceSpec) (*ServiceRecord, error) {
	if err := validateNamespace(namespace); err != nil {
		return nil, err
	}
	if err := validateName(name); err != nil {
		return nil, err
	}
	key := namespace + "/" + name
	rec := &ServiceRecord{Namespace: namespace, Name: name}
	ip, err := netip.ParseAddr(spec.ClusterIP)
	if err != nil || ip.Zone() != "" || ip.Is4In6() || ip.IsUnspecified() {
		return nil, api.BadRequest("service %s: clusterIP %q: want an IPv4 or IPv6 address", key, spec.ClusterIP)
	}
	rec.ClusterIP = ip
	if len(spec.ClusterIPs) > 0 {
		// Kubernetes' clusterIPs: the primary first, then at most one of the other family.
		for i, s := range spec.ClusterIPs {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" || a.Is4In6() || a.IsUnspecified() {
				return nil, api.BadRequest("service %s: clusterIPs[%d] %q: want an IPv4 or IPv6 address", key, i, s)
			}
			rec.ClusterIPs = append(rec.ClusterIPs, a)
		}
		if rec.ClusterIPs[0] != ip || len(rec.ClusterIPs) > 2 ||
			len(rec.ClusterIPs) == 2 && rec.ClusterIPs[1].Is4() == ip.Is4() {
			return nil, api.BadRequest("service %s: clusterIPs %v: want clusterIP first, then at most one address of the other family", key, spec.ClusterIPs)
		}
		if len(rec.ClusterIPs) == 1 {
			rec.ClusterIPs = nil
		}
	}
	for i, p := range spec.Ports {
		proto, err := service.ParseProtocol(p.Protocol)
		if err != nil {
			return nil, api.BadRequest("service %s: ports[%d].protocol: %v", key, i, err)
		}
		rec.Ports = append(rec.Ports, ServicePortRecord{Name: p.Name, Protocol: proto, Port: p.Port, TargetPort: p.TargetPort, NodePort: p.NodePort})
	}
	if spec.Selector != nil {
		sel, err := validateLabels(spec.Selector)
		if err != nil {
			return nil, api.BadRequest("service %s: selector: %v", key, err)
		}
		rec.Selector = sel
	}
	for i, s := range spec.Addresses {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.Is4In6() || a.IsUnspecified() {
			return nil, api.BadRequest("service %s: addresses[%d] %q: want an IPv4 or IPv6 address", key, i, s)
		}
		rec.Endpoints = append(rec.Endpoints, ServiceEndpointRecord{Addr: a})
	}
	return rec, nil
}

// clusterServices are the Services of a Kubernetes view that the agent can translate,
// each checked alone and then against the others (a frontend taken by an earlier Service,
// by key, leaves the later one out); what is left out is a problem of the view.
func clusterServices(recs []ServiceRecord, nodes []netip.Addr) (map[string]*ServiceRecord, []string) {
	out := map[string]*ServiceRecord{}
	var problems []string
	taken := map[service.Frontend]string{}
	slices.SortFunc(recs, func(a, b ServiceRecord) int { return strings.Compare(a.Key(), b.Key()) })
	for i := range recs {
		r := &recs[i]
		one := newModel()
		one.services[r.Key()] = r
		t, err := service.Compute(serviceModel(one), nodes)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		var clash string
		for f := range t {
			if o, ok := taken[f]; ok {
				clash = fmt.Sprintf("service %s: port %s is also service %s's", r.Key(), f, o)
			}
		}
		if clash != "" {
			problems = append(problems, clash)
			continue
		}
		for f := range t {
			taken[f] = r.Key()
		}
		out[r.Key()] = r
	}
	return out, problems
}
