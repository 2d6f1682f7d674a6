package cli

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
)

// fakeServices is an agent that only knows Services, recording what it was sent.
type fakeServices struct {
	api.Service
	put     map[string]api.ServiceSpec
	deleted []string
}

func (f *fakeServices) PutService(_ context.Context, ns, name string, spec api.ServiceSpec) (api.ServiceEntry, error) {
	f.put[ns+"/"+name] = spec
	return api.ServiceEntry{Namespace: ns, Name: name, ServiceSpec: spec, Backends: []string{"198.18.0.2"}}, nil
}

func (f *fakeServices) ListServices(context.Context) ([]api.ServiceEntry, error) {
	return []api.ServiceEntry{{Namespace: "x", Name: "web", ServiceSpec: api.ServiceSpec{ClusterIP: "198.19.200.10",
		Ports: []api.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, TargetPort: 8080}, {Protocol: "UDP", Port: 53}}}, Backends: []string{"198.18.0.2"}}}, nil
}

func (f *fakeServices) DeleteService(_ context.Context, ns, name string) error {
	f.deleted = append(f.deleted, ns+"/"+name)
	return nil
}

func TestServiceCommands(t *testing.T) {
	f := &fakeServices{put: map[string]api.ServiceSpec{}}
	out, errs, code := runFake(t, f, "", "service", "add", "x/web", "--cluster-ip", "198.19.200.10", "--port", "http=80:8080", "--port", "53/udp", "--selector", "app=web", "--address", "198.18.9.9")
	if code != 0 || !strings.Contains(out, "service x/web: 198.19.200.10, backends 198.18.0.2") {
		t.Fatalf("service add: %d %q %q", code, out, errs)
	}
	want := api.ServiceSpec{ClusterIP: "198.19.200.10", Selector: map[string]string{"app": "web"}, Addresses: []string{"198.18.9.9"},
		Ports: []api.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, TargetPort: 8080}, {Protocol: "udp", Port: 53}}}
	if got := f.put["x/web"]; !reflect.DeepEqual(got, want) {
		t.Errorf("service sent %+v, want %+v", got, want)
	}
	if _, errs, code := runFake(t, f, "", "service", "add", "x/dual", "--cluster-ip", "198.19.200.12,2001:2::c8:12", "--port", "80"); code != 0 {
		t.Errorf("service add with two cluster IPs: %d %q", code, errs)
	} else if got := f.put["x/dual"]; got.ClusterIP != "198.19.200.12" || !reflect.DeepEqual(got.ClusterIPs, []string{"198.19.200.12", "2001:2::c8:12"}) {
		t.Errorf("dual-stack service sent %+v, want clusterIP 198.19.200.12 and both in clusterIPs", got)
	}
	for _, bad := range []string{"0", "http=x", "80:0", "80:99999/TCP"} {
		if _, errs, code := runFake(t, f, "", "service", "add", "x/b", "--cluster-ip", "198.19.200.11", "--port", bad); code == 0 || !strings.Contains(errs, "--port") {
			t.Errorf("service add --port %s: exit %d, stderr %q", bad, code, errs)
		}
	}
	out, _, code = runFake(t, f, "", "service", "list")
	if code != 0 || !strings.Contains(out, "x/web") || !strings.Contains(out, "http=80:8080/TCP,53/UDP") || !strings.Contains(out, "198.18.0.2") {
		t.Errorf("service list: %d %q", code, out)
	}
	if _, _, code := runFake(t, f, "", "service", "delete", "x/web"); code != 0 || !reflect.DeepEqual(f.deleted, []string{"x/web"}) {
		t.Errorf("service delete: exit %d, deleted %v", code, f.deleted)
	}
}
