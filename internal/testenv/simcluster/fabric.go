package simcluster

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/rampartnet/rampart/internal/endpoint"
	rnetns "github.com/rampartnet/rampart/internal/netns"
)

// FabricPrefix is the fabric's subnet: node i (from 0) has address .(i+1). It is inside the
// project's test range and away from the pod CIDRs (NodePodCIDR) and the control plane's
// service range (198.19.255.0/24).
var FabricPrefix = netip.MustParsePrefix("198.19.254.0/24")

// MaxNodes is the most nodes a fabric holds.
const MaxNodes = 200

// NodeAddress is node i's (from 0) fabric address, its Node's InternalIP.
func NodeAddress(i int) netip.Addr { return NodeAddressIn(FabricPrefix, i) }

// NodeAddressIn is node i's (from 0) address in the /24 fabric: its .(i+1).
func NodeAddressIn(fabric netip.Prefix, i int) netip.Addr {
	a := fabric.Masked().Addr().As4()
	a[3] = byte(i + 1)
	return netip.AddrFrom4(a)
}

// NodePodCIDR is node i's (from 0) pod CIDR: a /20 of 198.18.0.0/16 for the first 15 nodes,
// then a /24 of 198.19.0.0/16 (198.19.14.0 and up, below the fabric).
func NodePodCIDR(i int) netip.Prefix {
	if i >= 14 {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(i), 0}), 24)
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(16 * (i + 1)), 0}), 20)
}

// LinkFabric makes the network between the nodes: the namespace fabricNetns holding a
// bridge, and a namespace per name of nodeNetns, joined to the bridge by a veth whose node
// end is eth0 with address NodeAddress(i)/24, up. It returns the nodes' addresses. On error
// it deletes the namespaces it created; on success the caller deletes them
// (DeleteNetns), which removes the links too.
func LinkFabric(fabricNetns string, nodeNetns []string) ([]netip.Addr, error) {
	return LinkFabricIn(FabricPrefix, fabricNetns, nodeNetns)
}

// LinkFabricIn is LinkFabric on the /24 fabric instead of FabricPrefix: real-node labs
// side by side on one host each link the host into a fabric of their own
// (nodetest's slots), which must not share a subnet on the host.
func LinkFabricIn(fabric netip.Prefix, fabricNetns string, nodeNetns []string) (_ []netip.Addr, err error) {
	if fabric.Bits() != 24 {
		return nil, fmt.Errorf("fabric %v: want a /24", fabric)
	}
	if len(nodeNetns) > MaxNodes {
		return nil, fmt.Errorf("%d nodes: at most %d", len(nodeNetns), MaxNodes)
	}
	var created []string
	defer func() {
		if err != nil {
			for _, n := range created {
				endpoint.DeleteNetns(n)
			}
		}
	}()
	fabPath, err := endpoint.CreateNetns(fabricNetns)
	if err != nil {
		return nil, fmt.Errorf("fabric namespace: %w", err)
	}
	created = append(created, fabricNetns)
	hf, fabNs, err := handleAt(fabPath)
	if err != nil {
		return nil, err
	}
	defer hf.Close()
	defer fabNs.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "fabric"}}
	if err := hf.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("fabric bridge: %w", err)
	}
	if err := hf.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("fabric bridge: %w", err)
	}
	var addrs []netip.Addr
	for i, name := range nodeNetns {
		path, err := endpoint.CreateNetns(name)
		if err != nil {
			return nil, fmt.Errorf("node namespace: %w", err)
		}
		created = append(created, name)
		addr := NodeAddressIn(fabric, i)
		if err := linkNode(hf, fabNs, br, path, "eth0", fmt.Sprintf("fab%d", i+1), netip.PrefixFrom(addr, fabric.Bits())); err != nil {
			return nil, fmt.Errorf("fabric link of node %d: %w", i+1, err)
		}
		addrs = append(addrs, addr)
	}
	return addrs, nil
}

// LinkHost joins the host to the fabric in fabricNetns (made by LinkFabric or
// LinkFabricIn): a veth from the host (link name) to a port of the bridge, with address
// addr (in the fabric, with its length) on the host's end. Deleting the fabric namespace
// deletes it.
func LinkHost(fabricNetns, name string, addr netip.Prefix) error {
	hf, fabNs, err := handleAt("/run/netns/" + fabricNetns)
	if err != nil {
		return err
	}
	defer hf.Close()
	defer fabNs.Close()
	br, err := hf.LinkByName("fabric")
	if err != nil {
		return fmt.Errorf("fabric bridge: %w", err)
	}
	return linkNode(hf, fabNs, br.(*netlink.Bridge), rnetns.Own(), name, "host", addr)
}

// linkNode links the namespace at path to the bridge: a veth whose end there is named
// link, with address addr, and whose other end is the bridge's port.
func linkNode(hf *netlink.Handle, fabNs netns.NsHandle, br *netlink.Bridge, path, link, port string, addr netip.Prefix) error {
	hn, ns, err := handleAt(path)
	if err != nil {
		return err
	}
	defer hn.Close()
	defer ns.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: link}, PeerName: port, PeerNamespace: netlink.NsFd(int(fabNs))}
	if err := hn.LinkAdd(veth); err != nil {
		return err
	}
	p, err := hf.LinkByName(port)
	if err != nil {
		return err
	}
	if err := hf.LinkSetMaster(p, br); err != nil {
		return err
	}
	if err := hf.LinkSetUp(p); err != nil {
		return err
	}
	l, err := hn.LinkByName(link)
	if err != nil {
		return err
	}
	if err := hn.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), 32)}}); err != nil {
		return fmt.Errorf("address %v: %w", addr, err)
	}
	if err := hn.LinkSetUp(l); err != nil {
		return err
	}
	return endpoint.WaitOperUp(hn, link, 5*time.Second)
}

// handleAt is a netlink handle in the namespace at path; the caller closes both.
func handleAt(path string) (*netlink.Handle, netns.NsHandle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, 0, fmt.Errorf("opening %s: %w", path, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, 0, fmt.Errorf("netlink in %s: %w", path, err)
	}
	return h, ns, nil
}

// DeleteNetns deletes the named namespaces that exist (their links go with them).
func DeleteNetns(names ...string) error {
	var errs []error
	for _, n := range names {
		if n != "" && endpoint.NetnsExists(n) {
			if err := endpoint.DeleteNetns(n); err != nil {
				errs = append(errs, fmt.Errorf("deleting network namespace %s: %w", n, err))
			}
		}
	}
	return errors.Join(errs...)
}
