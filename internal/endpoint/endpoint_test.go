package endpoint_test

import (
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
)

func TestHostIfName(t *testing.T) {
	n := endpoint.Node{Instance: "a-very-long-instance-name-indeed"}
	a := n.HostIfName("default", "web-1")
	if len(a) != 10 || a[:2] != "rp" {
		t.Fatalf("HostIfName = %q, want rp + 8 hex", a)
	}
	if a != n.HostIfName("default", "web-1") {
		t.Fatal("HostIfName not deterministic")
	}
	if a == n.HostIfName("default", "web-2") || a == (endpoint.Node{Instance: "other"}).HostIfName("default", "web-1") {
		t.Fatal("HostIfName collides for different endpoints/instances")
	}
	// The separator keeps "a"+"b-c" and "a-b"+"c" apart.
	if n.HostIfName("a", "b-c") == n.HostIfName("a-b", "c") {
		t.Fatal("HostIfName ambiguous across namespace/name boundary")
	}
}

func TestRouter(t *testing.T) {
	n := endpoint.Node{PodCIDR: netip.MustParsePrefix("198.18.0.0/16")}
	if got := n.Router(); got != netip.MustParseAddr("198.18.0.1") {
		t.Fatalf("Router = %v", got)
	}
}

func newNode(t *testing.T) endpoint.Node {
	t.Helper()
	testenv.RequireRoot(t)
	sfx := testenv.Suffix(6)
	n := endpoint.Node{
		Instance: "eptest" + sfx,
		Netns:    "rp-eptest-node-" + sfx,
		PodCIDR:  netip.MustParsePrefix("198.18.0.0/24"),
	}
	t.Cleanup(func() {
		if err := n.Teardown(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	if err := n.Setup(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	// Setup is idempotent (the agent calls it on every start).
	if err := n.Setup(); err != nil {
		t.Fatalf("second setup: %v", err)
	}
	return n
}

func TestCreateConnectDelete(t *testing.T) {
	n := newNode(t)
	ipA := netip.MustParseAddr("198.18.0.10")
	ipB := netip.MustParseAddr("198.18.0.11")
	a, err := n.Create("x", "a", ipA)
	if err != nil {
		t.Fatalf("create a: %v", err)
	}
	t.Cleanup(func() { n.Delete("x", "a") })
	b, err := n.Create("y", "b", ipB)
	if err != nil {
		t.Fatalf("create b: %v", err)
	}
	t.Cleanup(func() { n.Delete("y", "b") })

	if a.HostIfIndex == 0 || a.NetnsPath != "/run/netns/"+n.EndpointNetns("x", "a") {
		t.Fatalf("endpoint a = %+v", a)
	}
	// Host veth is in the node namespace, not in the test's own.
	if _, err := netlink.LinkByName(a.HostIfName); err == nil {
		t.Fatalf("%s found in the root namespace", a.HostIfName)
	}
	nodeNs, err := netns.GetFromPath(n.NetnsPath())
	if err != nil {
		t.Fatal(err)
	}
	defer nodeNs.Close()
	h, err := netlink.NewHandleAt(nodeNs)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if l, err := h.LinkByName(a.HostIfName); err != nil || l.Attrs().Index != a.HostIfIndex {
		t.Fatalf("host veth in node ns: %v %v", l, err)
	}
	got, err := n.Lookup("x", "a", ipA)
	if err != nil || got.HostIfIndex != a.HostIfIndex || got.NetnsPath != a.NetnsPath {
		t.Fatalf("Lookup = %+v, %v; want %+v", got, err, a)
	}

	srv, err := testenv.Serve(b.NetnsPath, []uint16{80}, []uint16{81})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if !testenv.Probe(a.NetnsPath, netip.AddrPortFrom(ipB, 80), "tcp", 3*time.Second) {
		t.Fatal("tcp a -> b:80 failed")
	}
	if !testenv.Probe(a.NetnsPath, netip.AddrPortFrom(ipB, 81), "udp", 3*time.Second) {
		t.Fatal("udp a -> b:81 failed")
	}
	// The router address answers from the node namespace (host identity's address).
	if testenv.Probe(a.NetnsPath, netip.AddrPortFrom(n.Router(), 80), "tcp", time.Second) {
		t.Fatal("unexpected listener on router address")
	}
	if _, err := n.Create("x", "a", netip.MustParseAddr("198.18.0.12")); err == nil {
		t.Fatal("creating a duplicate endpoint succeeded")
	}

	if err := n.Delete("x", "a"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := os.Stat(a.NetnsPath); !os.IsNotExist(err) {
		t.Fatalf("netns file still there: %v", err)
	}
	if _, err := h.LinkByName(a.HostIfName); err == nil {
		t.Fatal("host veth still there after delete")
	}
	if _, err := n.Lookup("x", "a", ipA); err == nil {
		t.Fatal("Lookup found a deleted endpoint")
	}
	// Deleting again is fine (cleanup after partial failures).
	if err := n.Delete("x", "a"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
}

func TestCreateRejectsBadAddress(t *testing.T) {
	n := newNode(t)
	for _, ip := range []string{"198.18.0.1", "198.19.0.5"} {
		if _, err := n.Create("x", "bad", netip.MustParseAddr(ip)); err == nil {
			n.Delete("x", "bad")
			t.Fatalf("Create with %s succeeded", ip)
		}
	}
	if endpoint.NetnsExists(n.EndpointNetns("x", "bad")) {
		t.Fatal("failed create left a namespace behind")
	}
}
