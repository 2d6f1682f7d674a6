package watcher

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/service"
)

func ptr[T any](v T) *T { return &v }

func TestServiceRecord(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "198.19.200.10", Ports: []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30080},
			{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromString("dns")},
			{Name: "sig", Protocol: corev1.ProtocolSCTP, Port: 9},
		}},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "x", Name: "web-abc"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}, {Name: ptr("dns"), Port: ptr(int32(5353))}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"198.18.0.3"}}, // ready (nil)
			{Addresses: []string{"198.18.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}},
			{Addresses: []string{"198.18.0.4"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(false)}}, // not ready
		},
	}
	rec, problems := serviceRecord(svc, []*discoveryv1.EndpointSlice{slice})
	if len(problems) != 1 || !strings.Contains(problems[0], "spec.ports[2].protocol") {
		t.Errorf("problems %q, want one about the SCTP port", problems)
	}
	ports := map[string]uint16{"http": 8080, "dns": 5353}
	want := &agent.ServiceRecord{Namespace: "x", Name: "web", ClusterIP: netip.MustParseAddr("198.19.200.10"),
		Ports:     []agent.ServicePortRecord{{Name: "http", Protocol: service.TCP, Port: 80, TargetPort: 8080, NodePort: 30080}, {Name: "dns", Protocol: service.UDP, Port: 53}},
		Endpoints: []agent.ServiceEndpointRecord{{Addr: netip.MustParseAddr("198.18.0.2"), Ports: ports}, {Addr: netip.MustParseAddr("198.18.0.3"), Ports: ports}}}
	if !reflect.DeepEqual(rec, want) {
		t.Errorf("record\n%+v\nwant\n%+v", rec, want)
	}

	// Dual stack: a frontend per family, the endpoints of both families' slices; an
	// address of the wrong family in a slice is a problem.
	dual := svc.DeepCopy()
	dual.Spec.ClusterIPs = []string{"198.19.200.10", "2001:2::c8:10"}
	slice6 := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "x", Name: "web-six"},
		AddressType: discoveryv1.AddressTypeIPv6,
		Ports:       slice.Ports,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"2001:2::3"}}, {Addresses: []string{"198.18.0.9"}}},
	}
	rec, problems = serviceRecord(dual, []*discoveryv1.EndpointSlice{slice, slice6})
	if len(problems) != 2 || !strings.Contains(problems[1], `address "198.18.0.9": want IPv6`) {
		t.Errorf("dual stack: problems %q, want the SCTP port's and the IPv4 address in the IPv6 slice", problems)
	}
	if want := []netip.Addr{netip.MustParseAddr("198.19.200.10"), netip.MustParseAddr("2001:2::c8:10")}; !reflect.DeepEqual(rec.ClusterIPs, want) {
		t.Errorf("dual stack: cluster IPs %v, want %v", rec.ClusterIPs, want)
	}
	if n := len(rec.Endpoints); n != 3 || rec.Endpoints[2].Addr != netip.MustParseAddr("2001:2::3") {
		t.Errorf("dual stack: endpoints %+v, want the two IPv4 ones and 2001:2::3", rec.Endpoints)
	}

	for _, s := range []corev1.ServiceSpec{
		{ClusterIP: corev1.ClusterIPNone, Ports: svc.Spec.Ports},            // headless
		{Type: corev1.ServiceTypeExternalName, ExternalName: "example.org"}, // no address
	} {
		if rec, _ := serviceRecord(&corev1.Service{ObjectMeta: svc.ObjectMeta, Spec: s}, nil); rec != nil {
			t.Errorf("%+v: translated as %+v", s, rec)
		}
	}
}
