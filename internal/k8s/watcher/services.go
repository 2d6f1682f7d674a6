package watcher

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/service"
)

// listServices adds the Services with a cluster IP to the view, their backends the ready
// endpoints of their EndpointSlices (kubernetes.io/service-name; IPv4 and IPv6 slices),
// each with the slice's ports by name. What cannot be translated (SCTP, a bad port) is a
// problem of the view, and the rest of the Service stays.
func listServices(c *caches, v *agent.ClusterView) error {
	svcs, err := c.services.List(k8slabels.Everything())
	if err != nil {
		return fmt.Errorf("listing services: %w", err)
	}
	all, err := c.slices.List(k8slabels.Everything())
	if err != nil {
		return fmt.Errorf("listing endpoint slices: %w", err)
	}
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range all {
		if name := s.Labels[discoveryv1.LabelServiceName]; name != "" &&
			(s.AddressType == discoveryv1.AddressTypeIPv4 || s.AddressType == discoveryv1.AddressTypeIPv6) {
			bySvc[s.Namespace+"/"+name] = append(bySvc[s.Namespace+"/"+name], s)
		}
	}
	for _, s := range svcs {
		rec, problems := serviceRecord(s, bySvc[s.Namespace+"/"+s.Name])
		v.Problems = append(v.Problems, problems...)
		if rec != nil {
			v.Services = append(v.Services, *rec)
		}
	}
	return nil
}

// serviceRecord is the agent's record of one Service (nil: none to translate: headless,
// ExternalName), with the problems of its ports and endpoints. A dual-stack Service
// (spec.clusterIPs) has a frontend in each family.
func serviceRecord(s *corev1.Service, eps []*discoveryv1.EndpointSlice) (*agent.ServiceRecord, []string) {
	key := s.Namespace + "/" + s.Name
	if s.Spec.Type == corev1.ServiceTypeExternalName || s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil, nil
	}
	ip, err := netip.ParseAddr(s.Spec.ClusterIP)
	if err != nil {
		return nil, []string{fmt.Sprintf("service %s: spec.clusterIP %q: not an address", key, s.Spec.ClusterIP)}
	}
	var problems []string
	rec := &agent.ServiceRecord{Namespace: s.Namespace, Name: s.Name, ClusterIP: ip}
	if len(s.Spec.ClusterIPs) == 2 {
		if other, err := netip.ParseAddr(s.Spec.ClusterIPs[1]); err == nil && other.Is4() != ip.Is4() {
			rec.ClusterIPs = []netip.Addr{ip, other}
		} else {
			problems = append(problems, fmt.Sprintf("service %s: spec.clusterIPs[1] %q: want an address of the other family", key, s.Spec.ClusterIPs[1]))
		}
	}
	for i, p := range s.Spec.Ports {
		proto, err := service.ParseProtocol(string(p.Protocol))
		if err != nil {
			problems = append(problems, fmt.Sprintf("service %s: spec.ports[%d].protocol: %v", key, i, err))
			continue
		}
		if p.Port <= 0 || p.Port > 65535 {
			problems = append(problems, fmt.Sprintf("service %s: spec.ports[%d].port %d: want 1-65535", key, i, p.Port))
			continue
		}
		// A named targetPort is resolved per endpoint by the slices' ports; a numeric
		// one is the default for endpoints that do not name the port.
		var target uint16
		if n := p.TargetPort.IntValue(); n > 0 && n <= 65535 {
			target = uint16(n)
		}
		// A node port (NodePort and LoadBalancer Services) is translated for clients of
		// the cluster's nodes too (docs/services.md: not for clients outside them).
		var nodePort uint16
		if p.NodePort > 0 && p.NodePort <= 65535 {
			nodePort = uint16(p.NodePort)
		}
		rec.Ports = append(rec.Ports, agent.ServicePortRecord{Name: p.Name, Protocol: proto, Port: uint16(p.Port), TargetPort: target, NodePort: nodePort})
	}
	if len(rec.Ports) == 0 {
		return nil, problems
	}
	seen := map[netip.Addr]bool{}
	for _, sl := range eps {
		ports := map[string]uint16{}
		for _, p := range sl.Ports {
			if p.Port != nil && *p.Port > 0 && *p.Port <= 65535 {
				name := ""
				if p.Name != nil {
					name = *p.Name
				}
				ports[name] = uint16(*p.Port)
			}
		}
		for _, e := range sl.Endpoints {
			// Ready nil means ready (the API's convention); terminating endpoints take no
			// new connections.
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				addr, err := netip.ParseAddr(a)
				if err != nil || addr.Is4() != (sl.AddressType == discoveryv1.AddressTypeIPv4) {
					problems = append(problems, fmt.Sprintf("service %s: endpoint slice %s: address %q: want %s", key, sl.Name, a, sl.AddressType))
					continue
				}
				if seen[addr] {
					continue
				}
				seen[addr] = true
				rec.Endpoints = append(rec.Endpoints, agent.ServiceEndpointRecord{Addr: addr, Ports: ports})
			}
		}
	}
	sortEndpoints(rec.Endpoints)
	return rec, problems
}

func sortEndpoints(es []agent.ServiceEndpointRecord) {
	slices.SortFunc(es, func(a, b agent.ServiceEndpointRecord) int { return a.Addr.Compare(b.Addr) })
}
