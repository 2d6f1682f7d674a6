package service

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

var (
	clusterIP = netip.MustParseAddr("198.18.99.10")
	pod1      = netip.MustParseAddr("198.18.10.2")
	pod2      = netip.MustParseAddr("198.18.10.3")
)

func TestCompute(t *testing.T) {
	web := Service{
		Namespace: "shop", Name: "web", ClusterIPs: []netip.Addr{clusterIP},
		Ports: []Port{
			{Name: "http", Protocol: TCP, Port: 80, TargetPort: 8080},
			{Name: "dns", Protocol: UDP, Port: 53},
		},
		Endpoints: []Endpoint{
			{Addr: pod2, Ports: map[string]uint16{"http": 9090}}, // names its own port
			{Addr: pod1},
			{Addr: pod1}, // listed twice (two slices): one backend
		},
	}
	empty := Service{Namespace: "shop", Name: "empty", ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.99.11")}, Ports: []Port{{Protocol: TCP, Port: 80}}}
	got, err := Compute([]Service{web, empty}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Table{
		{clusterIP, 80, TCP}:                           {{pod1, 8080}, {pod2, 9090}},
		{clusterIP, 53, UDP}:                           {{pod1, 53}, {pod2, 53}},
		{netip.MustParseAddr("198.18.99.11"), 80, TCP}: {},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Compute =\n%v\nwant\n%v", got, want)
	}
}

// A node port is a frontend on every node's address, with the cluster IP's backends.
func TestComputeNodePort(t *testing.T) {
	node1, node2 := netip.MustParseAddr("198.19.254.1"), netip.MustParseAddr("198.19.254.2")
	s := Service{Namespace: "x", Name: "web", ClusterIPs: []netip.Addr{clusterIP},
		Ports:     []Port{{Protocol: TCP, Port: 80, TargetPort: 8080, NodePort: 30080}},
		Endpoints: []Endpoint{{Addr: pod1}}}
	got, err := Compute([]Service{s}, []netip.Addr{node1, node2})
	if err != nil {
		t.Fatal(err)
	}
	b := []Backend{{pod1, 8080}}
	want := Table{{clusterIP, 80, TCP}: b, {node1, 30080, TCP}: b, {node2, 30080, TCP}: b}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Compute =\n%v\nwant\n%v", got, want)
	}
	other := Service{Namespace: "y", Name: "other", ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.200.20")}, Ports: []Port{{Protocol: TCP, Port: 80, NodePort: 30080}}}
	if _, err := Compute([]Service{s, other}, []netip.Addr{node1}); err == nil || !strings.Contains(err.Error(), "198.19.254.1:30080/TCP is also service x/web's") {
		t.Errorf("two Services on one node port: %v", err)
	}
}

// A dual-stack Service: a frontend per cluster address, each with its family's endpoints;
// an IPv6-only one has IPv6 frontends only.
func TestComputeDualStack(t *testing.T) {
	ip6, pod1v6, pod2v6 := netip.MustParseAddr("2001:2::99:10"), netip.MustParseAddr("2001:2::10:2"), netip.MustParseAddr("2001:2::10:3")
	s := Service{Namespace: "x", Name: "web", ClusterIPs: []netip.Addr{clusterIP, ip6},
		Ports:     []Port{{Protocol: TCP, Port: 80, TargetPort: 8080}},
		Endpoints: []Endpoint{{Addr: pod2v6}, {Addr: pod1}, {Addr: pod1v6}}}
	only6 := Service{Namespace: "x", Name: "six", ClusterIPs: []netip.Addr{netip.MustParseAddr("2001:2::99:11")},
		Ports:     []Port{{Protocol: UDP, Port: 53}},
		Endpoints: []Endpoint{{Addr: pod2}, {Addr: pod2v6}}}
	got, err := Compute([]Service{s, only6}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Table{
		{clusterIP, 80, TCP}: {{pod1, 8080}},
		{ip6, 80, TCP}:       {{pod1v6, 8080}, {pod2v6, 8080}},
		{netip.MustParseAddr("2001:2::99:11"), 53, UDP}: {{pod2v6, 53}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Compute =\n%v\nwant\n%v", got, want)
	}
}

func TestComputeErrors(t *testing.T) {
	ok := Service{Namespace: "a", Name: "web", ClusterIPs: []netip.Addr{clusterIP}, Ports: []Port{{Name: "http", Protocol: TCP, Port: 80}}}
	mod := func(f func(*Service)) Service {
		s := ok
		s.Ports = append([]Port(nil), ok.Ports...)
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name     string
		services []Service
		want     string
	}{
		{"no name", []Service{mod(func(s *Service) { s.Name = "" })}, "name is empty"},
		{"no cluster IP", []Service{mod(func(s *Service) { s.ClusterIPs = nil })}, "clusterIPs: want one"},
		{"two IPv4", []Service{mod(func(s *Service) { s.ClusterIPs = []netip.Addr{clusterIP, pod1} })}, "clusterIPs[1]"},
		{"IPv4-mapped", []Service{mod(func(s *Service) { s.ClusterIPs = []netip.Addr{netip.MustParseAddr("::ffff:198.18.99.10")} })}, "clusterIPs[0]"},
		{"no ports", []Service{mod(func(s *Service) { s.Ports = nil })}, "ports: at least one"},
		{"port 0", []Service{mod(func(s *Service) { s.Ports[0].Port = 0 })}, "ports[0].port"},
		{"sctp", []Service{mod(func(s *Service) { s.Ports[0].Protocol = 132 })}, "ports[0].protocol"},
		{"name twice", []Service{mod(func(s *Service) { s.Ports = append(s.Ports, Port{Name: "http", Protocol: UDP, Port: 81}) })}, `"http" is used twice`},
		{"endpoint unspecified", []Service{mod(func(s *Service) { s.Endpoints = []Endpoint{{Addr: netip.IPv6Unspecified()}} })}, "endpoints[0].address"},
		{"same frontend", []Service{ok, mod(func(s *Service) { s.Name = "other" })}, "also service a/web's"},
	} {
		_, err := Compute(tc.services, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestParseProtocol(t *testing.T) {
	for in, want := range map[string]Protocol{"": TCP, "tcp": TCP, "UDP": UDP} {
		if got, err := ParseProtocol(in); err != nil || got != want {
			t.Errorf("ParseProtocol(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"SCTP", "icmp"} {
		if _, err := ParseProtocol(in); err == nil {
			t.Errorf("ParseProtocol(%q) succeeded", in)
		}
	}
}
