package endpoint_test

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/rampartnet/rampart/internal/endpoint"
	rnetns "github.com/rampartnet/rampart/internal/netns"
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
	return newNodeWith(t, netip.Prefix{})
}

// newNodeWith is a node of its own with the pod range 198.18.0.0/24 and the IPv6 pod
// range cidr6 (none: IPv4 only), set up, torn down when the test ends.
func newNodeWith(t *testing.T, cidr6 netip.Prefix) endpoint.Node {
	t.Helper()
	testenv.RequireRoot(t)
	sfx := testenv.Suffix(6)
	n := endpoint.Node{
		Instance: "eptest" + sfx,
		Netns:    "rp-eptest-node-" + sfx,
		PodCIDR:  netip.MustParsePrefix("198.18.0.0/24"),
		PodCIDR6: cidr6,
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
	h := nodeHandle(t, n)
	if l, err := h.LinkByName(a.HostIfName); err != nil || l.Attrs().Index != a.HostIfIndex {
		t.Fatalf("host veth in node ns: %v %v", l, err)
	}
	got, err := n.Lookup("x", "a", ipA)
	if err != nil || got.HostIfIndex != a.HostIfIndex || got.NetnsPath != a.NetnsPath {
		t.Fatalf("Lookup = %+v, %v; want %+v", got, err, a)
	}

	// The endpoint side has no IPv6 address and makes none (IPv6 is kept quiet; see
	// configurePod).
	err = rnetns.Do(a.NetnsPath, func() error {
		mode, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + endpoint.PodIfName + "/addr_gen_mode")
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(mode)) != "1" {
			t.Errorf("%s addr_gen_mode = %q, want 1 (none)", endpoint.PodIfName, mode)
		}
		eth, err := netlink.LinkByName(endpoint.PodIfName)
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(eth, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		if len(addrs) != 0 {
			t.Errorf("%s has IPv6 addresses: %v", endpoint.PodIfName, addrs)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
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

// CreateAttached runs attach while the veth cannot carry a packet: its host side is down
// and the node has no route to the endpoint. A failed attach fails the create and leaves
// nothing behind.
func TestCreateAttachedRunsBeforeTheVethCarriesPackets(t *testing.T) {
	n := newNode(t)
	ip := netip.MustParseAddr("198.18.0.20")
	h := nodeHandle(t, n)
	calls := 0
	ep, err := n.CreateAttached("x", "a", ip, func(hostIf string) error {
		calls++
		l, err := h.LinkByName(hostIf)
		if err != nil {
			return err
		}
		if l.Attrs().Flags&net.FlagUp != 0 || l.Attrs().OperState == netlink.OperUp {
			t.Errorf("attach: %s is up (flags %v, oper %v)", hostIf, l.Attrs().Flags, l.Attrs().OperState)
		}
		routes, err := h.RouteGet(ip.AsSlice())
		if err == nil && len(routes) > 0 && routes[0].LinkIndex == l.Attrs().Index {
			t.Errorf("attach: the node already routes %v to %s", ip, hostIf)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { n.Delete("x", "a") })
	if calls != 1 {
		t.Fatalf("attach called %d times, want 1", calls)
	}
	if l, err := h.LinkByName(ep.HostIfName); err != nil || l.Attrs().OperState != netlink.OperUp {
		t.Fatalf("after create: %s not up (%v)", ep.HostIfName, err)
	}

	_, err = n.CreateAttached("x", "b", netip.MustParseAddr("198.18.0.21"), func(string) error {
		return errors.New("injected attach failure")
	})
	if err == nil || !strings.Contains(err.Error(), "injected attach failure") {
		t.Fatalf("create with a failing attach: %v", err)
	}
	if endpoint.NetnsExists(n.EndpointNetns("x", "b")) {
		t.Fatal("failed attach left the namespace behind")
	}
	if _, err := h.LinkByName(n.HostIfName("x", "b")); err == nil {
		t.Fatal("failed attach left the veth behind")
	}
}

// nodeHandle is a netlink handle in n's node namespace, closed when the test ends.
func nodeHandle(t *testing.T, n endpoint.Node) *netlink.Handle {
	t.Helper()
	nodeNs, err := netns.GetFromPath(n.NetnsPath())
	if err != nil {
		t.Fatal(err)
	}
	defer nodeNs.Close()
	h, err := netlink.NewHandleAt(nodeNs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// CreateIn puts an endpoint into a namespace the runtime made, under the runtime's
// interface name; LookupIn finds it and notices what is wrong; DeleteLink removes the veth
// and leaves the runtime's namespace; a failed create also leaves that namespace.
func TestCreateInExistingNamespace(t *testing.T) {
	n := newNode(t)
	ip := netip.MustParseAddr("198.18.0.30")
	sandbox := testenv.NewNetns(t, "rp-eptest-sb-"+testenv.Suffix(6))
	at := endpoint.Attachment{NetnsPath: sandbox, IfName: "net1"}
	ep, err := n.CreateIn("x", "c", ip, at, nil)
	if err != nil {
		t.Fatalf("CreateIn: %v", err)
	}
	t.Cleanup(func() { n.DeleteLink("x", "c") })
	if ep.PodIfName != "net1" || ep.NetnsPath != sandbox || ep.PodMAC == "" || ep.HostMAC == "" {
		t.Fatalf("CreateIn returned %+v", ep)
	}
	if endpoint.NetnsExists(n.EndpointNetns("x", "c")) {
		t.Fatal("CreateIn made a namespace of its own")
	}
	sb := testenv.NetlinkHandle(t, sandbox)
	l, err := sb.LinkByName("net1")
	if err != nil {
		t.Fatalf("net1 in the sandbox: %v", err)
	}
	addrs, _ := sb.AddrList(l, netlink.FAMILY_V4)
	if len(addrs) != 1 || !addrs[0].IP.Equal(ip.AsSlice()) {
		t.Fatalf("net1 addresses %v, want %v", addrs, ip)
	}
	if _, err := n.LookupIn("x", "c", ip, at); err != nil {
		t.Fatalf("LookupIn: %v", err)
	}
	if _, err := n.LookupIn("x", "c", netip.MustParseAddr("198.18.0.31"), at); err == nil || !strings.Contains(err.Error(), "does not have address") {
		t.Fatalf("LookupIn with another address: %v", err)
	}
	if _, err := n.LookupIn("x", "c", ip, endpoint.Attachment{NetnsPath: sandbox, IfName: "net2"}); err == nil {
		t.Fatal("LookupIn found a missing interface")
	}
	// The same interface name again in the same namespace: refused, and the first stays.
	if _, err := n.CreateIn("x", "d", netip.MustParseAddr("198.18.0.31"), at, nil); err == nil {
		n.DeleteLink("x", "d")
		t.Fatal("CreateIn over an existing interface succeeded")
	}
	h := nodeHandle(t, n)
	if _, err := h.LinkByName(n.HostIfName("x", "d")); err == nil {
		t.Fatal("failed CreateIn left its veth behind")
	}
	if _, err := n.LookupIn("x", "c", ip, at); err != nil {
		t.Fatalf("LookupIn after a refused create: %v", err)
	}

	if err := n.DeleteLink("x", "c"); err != nil {
		t.Fatalf("DeleteLink: %v", err)
	}
	if _, err := h.LinkByName(ep.HostIfName); err == nil {
		t.Fatal("host veth still there after DeleteLink")
	}
	if _, err := sb.LinkByName("net1"); err == nil {
		t.Fatal("sandbox interface still there after DeleteLink")
	}
	if !netnsAlive(sandbox) {
		t.Fatal("DeleteLink removed the runtime's namespace")
	}
	if err := n.DeleteLink("x", "c"); err != nil {
		t.Fatalf("second DeleteLink: %v", err)
	}
	if _, err := n.LookupIn("x", "c", ip, at); err == nil {
		t.Fatal("LookupIn found a deleted endpoint")
	}

	// A failed attach removes the veth, never the runtime's namespace.
	_, err = n.CreateIn("x", "e", netip.MustParseAddr("198.18.0.32"), at, func(string) error {
		return errors.New("injected attach failure")
	})
	if err == nil || !strings.Contains(err.Error(), "injected attach failure") {
		t.Fatalf("CreateIn with a failing attach: %v", err)
	}
	if _, err := h.LinkByName(n.HostIfName("x", "e")); err == nil {
		t.Fatal("failed attach left the veth behind")
	}
	if !netnsAlive(sandbox) {
		t.Fatal("failed CreateIn removed the runtime's namespace")
	}
}

// netnsAlive reports whether the namespace mounted at path is still a namespace.
func netnsAlive(path string) bool {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return false
	}
	h.Close()
	return true
}
