package agent

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/service"
)

// fakeServices is the Service translation's maps: the last table written, or an error.
type fakeServices struct {
	mu    sync.Mutex
	table service.Table
	err   error
}

func (f *fakeServices) Replace(t service.Table) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.table = t
	return nil
}

func (f *fakeServices) get() service.Table {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.table
}

// newServiceHarness is a harness whose kernel has the Service translation.
func newServiceHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t)
	h.dp.services = &fakeServices{}
	h.restart()
	return h
}

var webFront = service.Frontend{Addr: netip.MustParseAddr("198.19.200.10"), Port: 80, Protocol: service.TCP}

func webSpec() api.ServiceSpec {
	return api.ServiceSpec{ClusterIP: "198.19.200.10", Ports: []api.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, TargetPort: 8080}},
		Selector: map[string]string{"app": "web"}}
}

func TestServicesFollowEndpoints(t *testing.T) {
	h := newServiceHarness(t)
	ctx := context.Background()
	w1 := netip.MustParseAddr(h.add("y", "web1", map[string]string{"app": "web"}).IP)
	w2 := netip.MustParseAddr(h.add("y", "web2", map[string]string{"app": "web"}).IP)
	h.add("y", "db", map[string]string{"app": "db"})
	h.add("z", "web", map[string]string{"app": "web"}) // another namespace: not a backend

	s, err := h.a.PutService(ctx, "y", "web", webSpec())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{w1.String(), w2.String()}; !reflect.DeepEqual(s.Backends, want) {
		t.Errorf("PutService backends %v, want %v", s.Backends, want)
	}
	want := service.Table{webFront: {{Addr: w1, Port: 8080}, {Addr: w2, Port: 8080}}}
	if got := h.dp.services.get(); !reflect.DeepEqual(got, want) {
		t.Errorf("table %v, want %v", got, want)
	}

	// An endpoint going goes from the table in the same change.
	if err := h.a.DeleteEndpoint(ctx, "y", "web2"); err != nil {
		t.Fatal(err)
	}
	want = service.Table{webFront: {{Addr: w1, Port: 8080}}}
	if got := h.dp.services.get(); !reflect.DeepEqual(got, want) {
		t.Errorf("after deleting a backend: %v, want %v", got, want)
	}

	// A restarted agent writes the stored Services into its new (empty) maps.
	h.restart()
	if got := h.dp.services.get(); !reflect.DeepEqual(got, want) {
		t.Errorf("after a restart: %v, want %v", got, want)
	}

	if err := h.a.DeleteService(ctx, "y", "web"); err != nil {
		t.Fatal(err)
	}
	if got := h.dp.services.get(); len(got) != 0 {
		t.Errorf("after deleting the Service: %v", got)
	}
	if err := h.a.DeleteService(ctx, "y", "web"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("deleting it again: %v, want not found", err)
	}
}

// A table the kernel refuses refuses the change: the Service is not declared, and the
// state is as before.
func TestServiceWriteFailureRefusesChange(t *testing.T) {
	h := newServiceHarness(t)
	ctx := context.Background()
	h.add("y", "web1", map[string]string{"app": "web"})
	h.dp.services.mu.Lock()
	h.dp.services.err = errors.New("map full")
	h.dp.services.mu.Unlock()
	if _, err := h.a.PutService(ctx, "y", "web", webSpec()); err == nil || !strings.Contains(err.Error(), "map full") {
		t.Fatalf("PutService with a failing table: %v", err)
	}
	if l, _ := h.a.ListServices(ctx); len(l) != 0 {
		t.Errorf("services after a refused change: %+v", l)
	}
}

func TestServiceBadInput(t *testing.T) {
	h := newServiceHarness(t)
	ctx := context.Background()
	if _, err := h.a.PutService(ctx, "y", "web", webSpec()); err != nil {
		t.Fatal(err)
	}
	mod := func(f func(*api.ServiceSpec)) api.ServiceSpec {
		s := webSpec()
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name, want string
		spec       api.ServiceSpec
	}{
		{"web2", `clusterIP "x"`, mod(func(s *api.ServiceSpec) { s.ClusterIP = "x" })},
		{"web2", "ports[0].protocol: SCTP", mod(func(s *api.ServiceSpec) { s.Ports[0].Protocol = "SCTP" })},
		{"web2", "ports[0].port", mod(func(s *api.ServiceSpec) { s.Ports[0].Port = 0 })},
		{"web2", "ports: at least one", mod(func(s *api.ServiceSpec) { s.Ports = nil })},
		{"web2", `addresses[0] "::ffff:198.18.0.9"`, mod(func(s *api.ServiceSpec) { s.Addresses = []string{"::ffff:198.18.0.9"} })},
		{"web2", "clusterIPs", mod(func(s *api.ServiceSpec) { s.ClusterIPs = []string{"2001:2::c8:10", "198.19.200.12"} })},
		{"web2", "clusterIPs", mod(func(s *api.ServiceSpec) {
			s.ClusterIP = "198.19.200.12"
			s.ClusterIPs = []string{"198.19.200.12", "198.19.200.13"}
		})},
		{"web2", "also service y/web's", webSpec()},
		{"Bad_Name", "name", webSpec()},
	} {
		if _, err := h.a.PutService(ctx, "y", tc.name, tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %+v: %v, want an error containing %q", tc.name, tc.spec, err, tc.want)
		}
	}
}

// Without the translation, Services are refused rather than left untranslated.
func TestServiceWithoutTranslation(t *testing.T) {
	h := newHarness(t)
	if _, err := h.a.PutService(context.Background(), "y", "web", webSpec()); err == nil || !strings.Contains(err.Error(), "no Service translation") {
		t.Errorf("PutService without the translation: %v", err)
	}
}

// Services from a Kubernetes view: each checked alone, a frontend taken twice leaves the
// later Service out, and both are problems of the view, not errors of the sync.
func TestClusterServices(t *testing.T) {
	ip := netip.MustParseAddr("198.19.200.10")
	port := []ServicePortRecord{{Name: "http", Protocol: service.TCP, Port: 80}}
	recs := []ServiceRecord{
		{Namespace: "x", Name: "web", ClusterIP: ip, Ports: port, Endpoints: []ServiceEndpointRecord{{Addr: netip.MustParseAddr("198.18.0.2")}}},
		{Namespace: "x", Name: "again", ClusterIP: ip, Ports: port}, // sorts first: keeps the frontend
		{Namespace: "x", Name: "noports", ClusterIP: netip.MustParseAddr("198.19.200.11")},
	}
	got, problems := clusterServices(recs, nil)
	if len(got) != 1 || got["x/again"] == nil {
		t.Errorf("kept %v, want x/again only", slices.Collect(maps.Keys(got)))
	}
	joined := strings.Join(problems, "\n")
	if len(problems) != 2 || !strings.Contains(joined, "service x/web: port 198.19.200.10:80/TCP is also service x/again's") || !strings.Contains(joined, "x/noports: ports") {
		t.Errorf("problems %q", problems)
	}
}

// A dual-stack Service translates each cluster address to its family's backends: a
// dual-stack endpoint is a backend by both its addresses.
func TestServiceDualStack(t *testing.T) {
	h := newDualStackHarness(t)
	h.a.Close()
	h.a = nil
	h.dp.services = &fakeServices{}
	h.start()
	ctx := context.Background()
	web := h.add("y", "web1", map[string]string{"app": "web"})
	spec := webSpec()
	spec.ClusterIPs = []string{"198.19.200.10", "2001:2::c8:10"}
	got, err := h.a.PutService(ctx, "y", "web", spec)
	if err != nil {
		t.Fatal(err)
	}
	front6 := service.Frontend{Addr: netip.MustParseAddr("2001:2::c8:10"), Port: 80, Protocol: service.TCP}
	table := h.dp.services.get()
	if b := table[webFront]; len(b) != 1 || b[0].Addr.String() != web.IP {
		t.Errorf("IPv4 frontend backends %v, want %s", b, web.IP)
	}
	if b := table[front6]; len(b) != 1 || b[0].Addr.String() != web.IP6 || b[0].Port != 8080 {
		t.Errorf("IPv6 frontend backends %v, want %s:8080", b, web.IP6)
	}
	if len(got.Backends) != 2 || len(got.ClusterIPs) != 2 {
		t.Errorf("service view %+v, want both cluster IPs and both backend addresses", got)
	}
}
