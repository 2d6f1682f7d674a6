package service

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Protocol is a Service port's transport protocol, as the IP protocol number.
type Protocol uint8

// The protocols a Service port may have. SCTP is not translated (docs/services.md).
const (
	TCP Protocol = 6
	UDP Protocol = 17
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return fmt.Sprintf("protocol %d", uint8(p))
}

// ParseProtocol reads a protocol name as Kubernetes writes it (case-insensitive; empty is
// TCP, the Kubernetes default).
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToUpper(s) {
	case "", "TCP":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "SCTP":
		return 0, errors.New("SCTP Services are not supported (no socket-level translation for SCTP)")
	}
	return 0, fmt.Errorf("unknown protocol %q (want TCP or UDP)", s)
}

// Frontend is what a client addresses: a Service's cluster address, port and protocol.
type Frontend struct {
	Addr     netip.Addr
	Port     uint16
	Protocol Protocol
}

func (f Frontend) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(f.Addr, f.Port), f.Protocol)
}

// Backend is where a frontend's connections go: a backend pod's address and port.
type Backend struct {
	Addr netip.Addr
	Port uint16
}

// Table is every frontend with its backends, sorted. A frontend with no backend is in the
// table with none: connects to it are refused rather than sent elsewhere.
type Table map[Frontend][]Backend

// Service is a Service as the agent knows it: from the local API or from the Kubernetes
// Service and its EndpointSlices.
type Service struct {
	Namespace string
	Name      string
	// ClusterIPs are its cluster addresses, at most one per family (a dual-stack Service
	// has an IPv4 and an IPv6 one); each family's frontends go to that family's endpoints.
	ClusterIPs []netip.Addr
	Ports      []Port
	// Endpoints are the ready backend pods.
	Endpoints []Endpoint
}

// Port is one port of a Service.
type Port struct {
	Name     string // matches Endpoint.Ports; may be empty for a Service's only port
	Protocol Protocol
	Port     uint16 // the frontend's port
	// TargetPort is the backend's port when an endpoint does not name one (0: Port).
	TargetPort uint16
	// NodePort (0: none) is also a frontend on every node address.
	NodePort uint16
}

// Endpoint is one backend pod of a Service.
type Endpoint struct {
	Addr netip.Addr
	// Ports are the pod's ports by the Service port's name (an EndpointSlice's ports);
	// a Service port missing here uses its TargetPort.
	Ports map[string]uint16
}

// ID is the Service's namespace/name.
func (s Service) ID() string { return s.Namespace + "/" + s.Name }

// Validate reports the first thing wrong with s, naming the field.
func (s Service) Validate() error {
	if s.Name == "" {
		return errors.New("service: name is empty")
	}
	if len(s.ClusterIPs) == 0 || len(s.ClusterIPs) > 2 {
		return fmt.Errorf("service %s: clusterIPs: want one address, or one of each family", s.ID())
	}
	for i, ip := range s.ClusterIPs {
		if !ip.IsValid() || ip.IsUnspecified() || ip.Is4In6() || ip.Zone() != "" {
			return fmt.Errorf("service %s: clusterIPs[%d] %q: want an IPv4 or IPv6 address", s.ID(), i, ip)
		}
		if i > 0 && ip.Is4() == s.ClusterIPs[0].Is4() {
			return fmt.Errorf("service %s: clusterIPs[%d] %q: a second address of the same family", s.ID(), i, ip)
		}
	}
	if len(s.Ports) == 0 {
		return fmt.Errorf("service %s: ports: at least one port is needed", s.ID())
	}
	seen := map[string]bool{}
	for i, p := range s.Ports {
		if p.Port == 0 {
			return fmt.Errorf("service %s: ports[%d].port: must be 1-65535", s.ID(), i)
		}
		if p.Protocol != TCP && p.Protocol != UDP {
			return fmt.Errorf("service %s: ports[%d].protocol: %s is not supported (TCP or UDP)", s.ID(), i, p.Protocol)
		}
		if seen[p.Name] {
			return fmt.Errorf("service %s: ports[%d].name: %q is used twice", s.ID(), i, p.Name)
		}
		seen[p.Name] = true
	}
	for i, e := range s.Endpoints {
		if !e.Addr.IsValid() || e.Addr.IsUnspecified() || e.Addr.Is4In6() || e.Addr.Zone() != "" {
			return fmt.Errorf("service %s: endpoints[%d].address %q: want an IPv4 or IPv6 address", s.ID(), i, e.Addr)
		}
		for name, port := range e.Ports {
			if port == 0 {
				return fmt.Errorf("service %s: endpoints[%d].ports[%q]: must be 1-65535", s.ID(), i, name)
			}
		}
	}
	return nil
}

// Compute is the table of the services: every port of every Service a frontend on each of
// its cluster addresses (and, with a node port, one on each of the nodes' addresses), its
// backends every endpoint of the frontend's family at the port the endpoint names for it
// (or the target port). Two Services with one frontend are an error naming both.
func Compute(services []Service, nodes []netip.Addr) (Table, error) {
	t := Table{}
	owner := map[Frontend]string{}
	for _, s := range services {
		if err := s.Validate(); err != nil {
			return nil, err
		}
		for _, p := range s.Ports {
			var fronts []Frontend
			for _, ip := range s.ClusterIPs {
				fronts = append(fronts, Frontend{Addr: ip, Port: p.Port, Protocol: p.Protocol})
			}
			if p.NodePort != 0 {
				for _, n := range nodes {
					fronts = append(fronts, Frontend{Addr: n, Port: p.NodePort, Protocol: p.Protocol})
				}
			}
			for _, f := range fronts {
				if o, ok := owner[f]; ok {
					return nil, fmt.Errorf("service %s: port %s is also service %s's", s.ID(), f, o)
				}
				owner[f] = s.ID()
			}
			byFamily := map[bool][]Backend{true: {}, false: {}} // by Is4
			for _, e := range s.Endpoints {
				port, ok := e.Ports[p.Name]
				if !ok {
					port = cmp.Or(p.TargetPort, p.Port)
				}
				byFamily[e.Addr.Is4()] = append(byFamily[e.Addr.Is4()], Backend{Addr: e.Addr, Port: port})
			}
			for _, backends := range byFamily {
				slices.SortFunc(backends, func(a, b Backend) int {
					return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
				})
			}
			for _, f := range fronts {
				t[f] = slices.Compact(byFamily[f.Addr.Is4()])
			}
		}
	}
	return t, nil
}
