package agent

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
)

// selfNetns is a path that is a network namespace without root: the fake network creates
// nothing in it.
const selfNetns = "/proc/self/ns/net"

func cniAdd(t *testing.T, h *harness, id, ifname, ns, name string) api.CNIResult {
	t.Helper()
	r, err := h.a.CNIAdd(context.Background(), api.CNIAddRequest{ContainerID: id, Netns: selfNetns, IfName: ifname, PodNamespace: ns, PodName: name})
	if err != nil {
		t.Fatalf("CNI ADD %s: %v", id, err)
	}
	return r
}

// A CNI endpoint is keyed by container and interface, named after its pod, gets an
// address, gateway and default route; a repeated ADD answers the same; DEL never removes
// the runtime's namespace and succeeds twice; GC removes only CNI endpoints outside the
// valid list; a restarted agent knows the CNI endpoints it made.
func TestCNIEndpointLifecycle(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	plain := h.add("x", "plain", nil)

	r1 := cniAdd(t, h, "c1", "eth0", "shop", "web")
	if r1.Namespace != "shop" || r1.Name != "web" || r1.IfName != "eth0" || r1.Netns != selfNetns || r1.MAC == "" || r1.HostInterface == "" {
		t.Fatalf("ADD result %+v", r1)
	}
	if r1.IP != "198.18.0.3/32" || r1.Gateway != "198.18.0.1" || !slices.Equal(r1.Routes, []string{"0.0.0.0/0"}) || r1.Identity < 256 {
		t.Fatalf("ADD result address %s gateway %s routes %v identity %d", r1.IP, r1.Gateway, r1.Routes, r1.Identity)
	}
	if again := cniAdd(t, h, "c1", "eth0", "shop", "web"); again.IP != r1.IP || again.HostInterface != r1.HostInterface {
		t.Fatalf("repeated ADD answered %+v, first %+v", again, r1)
	}
	// The same attachment in another namespace, and another container under the same pod
	// name: both refused.
	if _, err := h.a.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", Netns: "/proc/thread-self/ns/net", IfName: "eth0", PodNamespace: "shop", PodName: "web"}); err == nil || !strings.Contains(err.Error(), "already has endpoint shop/web") {
		t.Fatalf("ADD of c1 in another namespace: %v", err)
	}
	if _, err := h.a.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c9", Netns: selfNetns, IfName: "eth0", PodNamespace: "shop", PodName: "web"}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("ADD of another container as shop/web: %v", err)
	}
	// No pod arguments: default/cni-<hash>.
	r2 := cniAdd(t, h, "c2", "eth0", "", "")
	if r2.Namespace != "default" || !strings.HasPrefix(r2.Name, "cni-") || len(r2.Name) != 16 {
		t.Fatalf("ADD without pod arguments named the endpoint %s/%s", r2.Namespace, r2.Name)
	}
	r3 := cniAdd(t, h, "c3", "net1", "shop", "db")

	if _, err := h.a.CNICheck(ctx, api.CNICheckRequest{CNIAttachment: api.CNIAttachment{ContainerID: "c1", IfName: "eth0"}, Netns: selfNetns}); err != nil {
		t.Fatalf("CHECK c1: %v", err)
	}
	if _, err := h.a.CNICheck(ctx, api.CNICheckRequest{CNIAttachment: api.CNIAttachment{ContainerID: "c1", IfName: "eth0"}, Netns: "/proc/thread-self/ns/net"}); err == nil {
		t.Fatal("CHECK with another namespace passed")
	}
	if _, err := h.a.CNICheck(ctx, api.CNICheckRequest{CNIAttachment: api.CNIAttachment{ContainerID: "nope", IfName: "eth0"}}); !api.IsNotFound(err) {
		t.Fatalf("CHECK of an unknown container: %v", err)
	}
	// An endpoint whose veth vanished fails CHECK.
	h.net.DeleteLink(r3.Namespace, r3.Name)
	if _, err := h.a.CNICheck(ctx, api.CNICheckRequest{CNIAttachment: api.CNIAttachment{ContainerID: "c3", IfName: "net1"}}); err == nil {
		t.Fatal("CHECK passed without the veth")
	}

	// A restart reattaches (recreating the missing veth in the runtime's namespace).
	h.restart()
	for _, at := range []api.CNIAttachment{{ContainerID: "c1", IfName: "eth0"}, {ContainerID: "c3", IfName: "net1"}} {
		if _, err := h.a.CNICheck(ctx, api.CNICheckRequest{CNIAttachment: at}); err != nil {
			t.Fatalf("CHECK %s after restart: %v", at.ContainerID, err)
		}
	}

	if err := h.a.CNIDel(ctx, api.CNIAttachment{ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Fatalf("DEL c1: %v", err)
	}
	if err := h.a.CNIDel(ctx, api.CNIAttachment{ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Fatalf("second DEL c1: %v", err)
	}
	if _, err := h.a.GetEndpoint(ctx, "shop", "web"); !api.IsNotFound(err) {
		t.Fatalf("endpoint after DEL: %v", err)
	}

	gc, err := h.a.CNIGC(ctx, api.CNIGCRequest{Valid: []api.CNIAttachment{{ContainerID: "c3", IfName: "net1"}}})
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if len(gc.Deleted) != 1 || gc.Deleted[0].ContainerID != "c2" {
		t.Fatalf("GC deleted %+v, want c2 only", gc.Deleted)
	}
	eps, _ := h.a.ListEndpoints(ctx)
	var keys []string
	for _, e := range eps {
		keys = append(keys, e.Namespace+"/"+e.Name)
	}
	if !slices.Equal(keys, []string{"shop/db", "x/plain"}) {
		t.Fatalf("endpoints after GC: %v", keys)
	}
	// The runtime's namespaces were never deleted; the plain endpoint's is the agent's.
	for _, k := range h.net.netnsDeleted {
		if k != "x/plain" {
			t.Fatalf("the agent deleted the namespace of CNI endpoint %s", k)
		}
	}
	if err := h.a.DeleteEndpoint(ctx, plain.Namespace, plain.Name); err != nil {
		t.Fatal(err)
	}
}

// A CNI endpoint whose runtime namespace went away while the agent was down is dropped
// at start, not a reason to fail it.
func TestCNIEndpointOfGoneNamespaceIsDroppedAtStart(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	cniAdd(t, h, "c1", "eth0", "shop", "web")
	h.a.mu.Lock()
	rec := h.a.model.endpoints["shop/web"]
	c := *rec
	cr := *rec.CNI
	cr.Netns = "/nonexistent/netns"
	c.CNI = &cr
	m := h.a.model.clone()
	m.endpoints["shop/web"] = &c
	if err := h.a.commit(m, h.a.cur); err != nil {
		h.a.mu.Unlock()
		t.Fatal(err)
	}
	h.a.mu.Unlock()
	h.restart()
	if _, err := h.a.GetEndpoint(ctx, "shop", "web"); !api.IsNotFound(err) {
		t.Fatalf("endpoint of a gone namespace after restart: %v", err)
	}
	if err := h.a.CNIDel(ctx, api.CNIAttachment{ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Fatalf("DEL after the drop: %v", err)
	}
}

func TestCNIValidation(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	for _, tc := range []struct {
		req  api.CNIAddRequest
		want string
	}{
		{api.CNIAddRequest{ContainerID: "", Netns: selfNetns, IfName: "eth0"}, "container ID"},
		{api.CNIAddRequest{ContainerID: "a/b", Netns: selfNetns, IfName: "eth0"}, "container ID"},
		{api.CNIAddRequest{ContainerID: "c", Netns: selfNetns, IfName: "a-very-long-name0"}, "interface name"},
		{api.CNIAddRequest{ContainerID: "c", Netns: selfNetns, IfName: "a/b"}, "interface name"},
		{api.CNIAddRequest{ContainerID: "c", Netns: "run/netns/x", IfName: "eth0"}, "clean absolute path"},
		{api.CNIAddRequest{ContainerID: "c", Netns: "/nonexistent", IfName: "eth0"}, "not a network namespace"},
		{api.CNIAddRequest{ContainerID: "c", Netns: selfNetns, IfName: "eth0", PodName: "web"}, "both or neither"},
		{api.CNIAddRequest{ContainerID: "c", Netns: selfNetns, IfName: "eth0", PodNamespace: "Shop", PodName: "web"}, "namespace \"Shop\""},
	} {
		_, err := h.a.CNIAdd(ctx, tc.req)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ADD %+v: %v, want an error about %s", tc.req, err, tc.want)
		}
	}
	if h.net.count() != 0 {
		t.Fatal("a refused ADD made an endpoint")
	}
}

// Uninstall deletes a CNI endpoint's veth and leaves its namespace to the runtime; a plain
// endpoint's namespace is the agent's and goes.
func TestUninstallLeavesCNINamespaces(t *testing.T) {
	h := newHarness(t)
	h.add("x", "plain", nil)
	cniAdd(t, h, "c1", "eth0", "shop", "web")
	h.a.Close()
	h.a = nil
	h.net.netnsDeleted = nil
	if err := Uninstall(h.cfg); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	if h.net.count() != 0 {
		t.Fatalf("%d endpoints left after uninstall", h.net.count())
	}
	if !slices.Equal(h.net.netnsDeleted, []string{"x/plain"}) {
		t.Fatalf("uninstall deleted the namespaces of %v, want x/plain only", h.net.netnsDeleted)
	}
}
