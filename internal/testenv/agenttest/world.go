package agenttest

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
)

// World is a namespace that stands for the outside world: it is linked to an agent's node
// namespace by a veth, outside the pod range, and serves TCP and UDP on its addresses.
type World struct {
	// Path is the world namespace's path.
	Path string
	// Gateway is the node side's address, the world's default route.
	Gateway netip.Addr
	// Addrs are the world's own addresses: IPv4 ones in the gateway's /24, IPv6 ones in a
	// /64 whose ::1 the node side takes as their gateway.
	Addrs []netip.Addr
}

// AddWorld creates the world namespace of an agent instance behind its node namespace,
// serves the given ports on every address, and returns once each address answers TCP on
// the first TCP port from the node namespace. Everything is removed when the test ends.
func AddWorld(t testing.TB, e *Env, gw netip.Addr, addrs []netip.Addr, tcp, udp []uint16) *World {
	t.Helper()
	name := "rp-" + e.Config.Instance + "-world"
	path, err := endpoint.CreateNetns(name)
	if err != nil {
		t.Fatalf("creating world namespace: %v", err)
	}
	t.Cleanup(func() { endpoint.DeleteNetns(name) })
	w := &World{Path: path, Gateway: gw, Addrs: addrs}
	nodePath := endpoint.NetnsPath(e.Config.NodeNetns)
	if err := linkWorld(nodePath, w, testenv.Suffix(6)); err != nil {
		t.Fatalf("linking the world namespace: %v", err)
	}
	s, err := testenv.Serve(path, tcp, udp)
	if err != nil {
		t.Fatalf("serving in the world namespace: %v", err)
	}
	t.Cleanup(s.Close)
	if len(tcp) > 0 {
		for _, a := range addrs {
			to := netip.AddrPortFrom(a, tcp[0])
			if !testenv.Eventually(5*time.Second, func() bool { return testenv.Probe(nodePath, to, "tcp", 200*time.Millisecond) }) {
				t.Fatalf("world address %v not reachable from the node namespace", to)
			}
		}
	}
	return w
}

// linkWorld creates the veth between the node and world namespaces (named with suffix),
// addresses both sides, routes the world's traffic through the node, and waits until both
// sides can carry packets.
func linkWorld(nodePath string, w *World, suffix string) error {
	nodeNs, err := netns.GetFromPath(nodePath)
	if err != nil {
		return err
	}
	defer nodeNs.Close()
	worldNs, err := netns.GetFromPath(w.Path)
	if err != nil {
		return err
	}
	defer worldNs.Close()
	nodeH, err := netlink.NewHandleAt(nodeNs)
	if err != nil {
		return err
	}
	defer nodeH.Close()
	worldH, err := netlink.NewHandleAt(worldNs)
	if err != nil {
		return err
	}
	defer worldH.Close()

	hostSide, worldSide := "rpw"+suffix, "rpx"+suffix
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostSide}, PeerName: worldSide, PeerNamespace: netlink.NsFd(int(worldNs))}
	if err := nodeH.LinkAdd(veth); err != nil {
		return fmt.Errorf("creating veth %s: %w", hostSide, err)
	}
	hl, err := nodeH.LinkByName(hostSide)
	if err != nil {
		return err
	}
	if err := nodeH.AddrAdd(hl, &netlink.Addr{IPNet: prefix24(w.Gateway)}); err != nil {
		return fmt.Errorf("gateway address: %w", err)
	}
	if err := nodeH.LinkSetUp(hl); err != nil {
		return err
	}
	wl, err := worldH.LinkByName(worldSide)
	if err != nil {
		return err
	}
	var gw6 netip.Addr
	for _, a := range w.Addrs {
		if a.Is6() {
			// An IPv6 address: the node side takes the /64's ::1 as the world's gateway.
			p := netip.PrefixFrom(a, 64).Masked()
			gw6 = p.Addr().Next()
			if err := nodeH.AddrReplace(hl, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(gw6, 64)), Flags: unix.IFA_F_NODAD}); err != nil {
				return fmt.Errorf("IPv6 gateway address: %w", err)
			}
			if err := worldH.AddrAdd(wl, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a, 64)), Flags: unix.IFA_F_NODAD}); err != nil {
				return fmt.Errorf("world address %v: %w", a, err)
			}
			continue
		}
		if err := worldH.AddrAdd(wl, &netlink.Addr{IPNet: prefix24(a)}); err != nil {
			return fmt.Errorf("world address %v: %w", a, err)
		}
	}
	if err := worldH.LinkSetUp(wl); err != nil {
		return err
	}
	lo, err := worldH.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := worldH.LinkSetUp(lo); err != nil {
		return err
	}
	if err := worldH.RouteAdd(&netlink.Route{LinkIndex: wl.Attrs().Index, Gw: net.IP(w.Gateway.AsSlice())}); err != nil {
		return fmt.Errorf("world default route: %w", err)
	}
	if gw6.IsValid() {
		if err := worldH.RouteAdd(&netlink.Route{LinkIndex: wl.Attrs().Index, Gw: net.IP(gw6.AsSlice())}); err != nil {
			return fmt.Errorf("world IPv6 default route: %w", err)
		}
	}
	if err := endpoint.WaitOperUp(nodeH, hostSide, 5*time.Second); err != nil {
		return err
	}
	return endpoint.WaitOperUp(worldH, worldSide, 5*time.Second)
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// prefix24 is addr with a /24 mask, as netlink wants an interface address.
func prefix24(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(24, 32)}
}
