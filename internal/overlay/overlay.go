package overlay

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Mode is how packets between pods of different nodes travel.
type Mode string

const (
	// Native routes the other nodes' pod CIDRs to the nodes' addresses over the fabric;
	// the receiving node derives the source's identity from its address (ipcache).
	Native Mode = "native"
	// VXLAN encapsulates them in the node's VXLAN device, the VNI carrying the source's
	// security identity.
	VXLAN Mode = "vxlan"
	// IPIP encapsulates them in an outer IPv4 header (protocol 4) from node address to
	// node address, which the dataplane adds and removes on the fabric interfaces
	// (bpf/include/ipip.h); the routes are native routing's. There is no field for an
	// identity: the receiving node takes it from the inner source address (ipcache).
	IPIP Mode = "ipip"
)

// ErrNoIPv6 is the refusal of an IPv6 pod CIDR of a node that native routing cannot reach
// over IPv6: the node has no IPv6 address on the fabric. Linux takes no IPv6 route with an
// IPv4 next hop ("IPv6 does not support RTA_VIA"), so native routing needs the node's IPv6
// fabric address as the gateway; VXLAN carries IPv6 inner packets in its IPv4 outer ones
// and needs none. Without a route the node's IPv6 pod addresses are unreachable from pods
// here, and they have no identity here (remote pods' IPv6 addresses go into the ipcache only
// where they are routed), so nothing is admitted on an address no route leads to.
var ErrNoIPv6 = errors.New("IPv6 between nodes needs the node's IPv6 fabric address for native routing " +
	"(rampart node add --address6; in Kubernetes an IPv6 InternalIP of the Node) or the VXLAN overlay (rampartd --tunnel=vxlan)")

// ErrIPIPNoIPv6 is the refusal of an IPv6 pod CIDR of another node on the IP-in-IP overlay:
// the dataplane encapsulates IPv4 in IPv4 only (bpf/include/ipip.h), and the kernels here
// have no sit or ip6tnl driver to carry IPv6 in its stead.
var ErrIPIPNoIPv6 = errors.New("the IP-in-IP overlay carries no IPv6 between nodes: use native routing with " +
	"the nodes' IPv6 fabric addresses (rampartd --tunnel=native) or the VXLAN overlay (rampartd --tunnel=vxlan)")

// CheckIPv6 says why mode cannot carry IPv6 packets between pods here and pods of a node
// whose IPv6 fabric address is address6 (zero: it has none); nil when it can.
func CheckIPv6(mode Mode, address6 netip.Addr) error {
	switch mode {
	case VXLAN:
		return nil
	case IPIP:
		return ErrIPIPNoIPv6
	}
	if !address6.IsValid() {
		return ErrNoIPv6
	}
	return nil
}

// CarriesIPv6 says whether mode carries IPv6 packets between pods here and pods of a node
// whose IPv6 fabric address is address6 (see CheckIPv6).
func CarriesIPv6(mode Mode, address6 netip.Addr) bool { return CheckIPv6(mode, address6) == nil }

// Underlay is the address family of the fabric that this node's VXLAN packets travel in to
// the other nodes: the overlay's (VXLAN mode) and the tap tunnel's copies for monitors on
// other nodes (every mode). Receiving, a node takes both families from any node.
type Underlay string

const (
	// UnderlayIPv4 sends to the nodes' IPv4 addresses (the default).
	UnderlayIPv4 Underlay = "ipv4"
	// UnderlayIPv6 sends to the IPv6 fabric address of each node that has one (Node.Address6),
	// to the IPv4 address of the others. The pods of a VXLAN node get room for the larger
	// outer header (VXLAN6Overhead).
	UnderlayIPv6 Underlay = "ipv6"
)

// ParseUnderlay checks an underlay's name ("" is UnderlayIPv4).
func ParseUnderlay(s string) (Underlay, error) {
	switch Underlay(s) {
	case "", UnderlayIPv4:
		return UnderlayIPv4, nil
	case UnderlayIPv6:
		return UnderlayIPv6, nil
	}
	return "", fmt.Errorf("VXLAN underlay %q: want %q or %q", s, UnderlayIPv4, UnderlayIPv6)
}

// Remote6 returns the nodes that VXLAN packets reach over the IPv6 fabric with underlay u:
// by IPv4 node address (which the ipcache names as a remote pod's tunnel endpoint), the
// node's IPv6 fabric address. Nil with UnderlayIPv4.
func Remote6(u Underlay, nodes []Node) map[netip.Addr]netip.Addr {
	if u != UnderlayIPv6 {
		return nil
	}
	out := map[netip.Addr]netip.Addr{}
	for _, n := range nodes {
		if n.Address.Is4() && n.Address6.IsValid() {
			out[n.Address] = n.Address6
		}
	}
	return out
}

// ParseMode checks a mode's name ("" is Native).
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", Native:
		return Native, nil
	case VXLAN, IPIP:
		return Mode(s), nil
	}
	return "", fmt.Errorf("tunnel %q: want %q, %q or %q", s, VXLAN, IPIP, Native)
}

const (
	// DeviceName is the VXLAN device in the node's namespace.
	DeviceName = "rampart_vxlan"
	// Port is the VXLAN UDP port (IANA).
	Port = 4789
	// TapDeviceName is the tap tunnel device: copies of tapped packets for monitors on
	// other nodes (docs/taps.md).
	TapDeviceName = "rampart_tap"
	// TapPort is the tap tunnel's UDP port, apart from the overlay's so that a copy is
	// never taken for a packet to deliver (unassigned by IANA).
	TapPort = 8479
	// VXLANOverhead is what VXLAN adds to a packet: outer IPv4 (20), UDP (8), VXLAN (8)
	// and the inner Ethernet header (14). Pods on a VXLAN overlay get the fabric's MTU less
	// this, so their packets are never fragmented once encapsulated.
	VXLANOverhead = 50
	// VXLAN6Overhead is VXLANOverhead with an outer IPv6 header (40) instead of IPv4's: a
	// node's VXLAN packets that leave over IPv6 and would be larger than the fabric's MTU
	// are not fragmented but dropped (the kernel fragments no tunnel packet over IPv6).
	VXLAN6Overhead = 70
	// IPIPOverhead is what IP-in-IP adds: the outer IPv4 header.
	IPIPOverhead = 20
	// FabricMTU is the fabric's MTU the pod MTU is derived from.
	FabricMTU = 1500
	// routeProtocol marks the routes this package installs (rtm_protocol), so that Sync
	// finds and replaces its own and leaves everyone else's alone. 0xb7 is unassigned in
	// /etc/iproute2/rt_protos.
	routeProtocol netlink.RouteProtocol = 0xb7
)

// PodMTU returns the MTU of pods' interfaces in mode with underlay u (0: the default, no
// change).
func PodMTU(mode Mode, u Underlay) int {
	switch {
	case mode == VXLAN && u == UnderlayIPv6:
		return FabricMTU - VXLAN6Overhead
	case mode == VXLAN:
		return FabricMTU - VXLANOverhead
	case mode == IPIP:
		return FabricMTU - IPIPOverhead
	}
	return 0
}

// Node is another node as the routes need it.
type Node struct {
	Address netip.Addr
	PodCIDR netip.Prefix
	// PodCIDR6 is its IPv6 pod CIDR (zero: none), routed where the mode CarriesIPv6 to the
	// node only.
	PodCIDR6 netip.Prefix
	// Address6 is its IPv6 address on the fabric (zero: none), native routing's gateway to
	// PodCIDR6.
	Address6 netip.Addr
}

func handle(netnsPath string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", netnsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", netnsPath, err)
	}
	return h, nil
}

// EnsureDevice creates the VXLAN device in the namespace at netnsPath if it is missing
// (collect_md: no VNI or remote of its own, the dataplane sets them per packet, to an IPv4
// or an IPv6 node address: such a device listens on both families; no ARP: the routes
// point into it and the receiving program delivers the inner packet whatever its MAC),
// gives it the pods' MTU with underlay u, which sizes the node's own packets into it, and
// sets it up. It returns the device's index.
func EnsureDevice(netnsPath string, u Underlay) (int, error) {
	return ensureVXLAN(netnsPath, DeviceName, Port, PodMTU(VXLAN, u))
}

// EnsureTapDevice creates the tap tunnel device in the namespace at netnsPath if it is
// missing: a collect_md VXLAN device like the overlay's, on a port of its own (TapPort),
// which carries copies of tapped packets to monitors on other nodes in every overlay mode.
// It has no routes: the dataplane clones copies into it. It returns the device's index.
func EnsureTapDevice(netnsPath string) (int, error) {
	return ensureVXLAN(netnsPath, TapDeviceName, TapPort, FabricMTU-VXLANOverhead)
}

func ensureVXLAN(netnsPath, name string, port, mtu int) (int, error) {
	h, err := handle(netnsPath)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	lnk, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return 0, fmt.Errorf("finding %s: %w", name, err)
		}
		dev := &netlink.Vxlan{
			LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu},
			FlowBased: true,
			Port:      port,
			Learning:  false,
		}
		if err := h.LinkAdd(dev); err != nil {
			return 0, fmt.Errorf("creating VXLAN device %s: %w", name, err)
		}
		if lnk, err = h.LinkByName(name); err != nil {
			return 0, fmt.Errorf("finding %s: %w", name, err)
		}
	} else if vx, ok := lnk.(*netlink.Vxlan); !ok || !vx.FlowBased || vx.Port != port {
		return 0, fmt.Errorf("interface %s exists and is not a collect_md VXLAN device on port %d", name, port)
	} else if lnk.Attrs().MTU != mtu {
		// Left by a run with the other underlay.
		if err := h.LinkSetMTU(lnk, mtu); err != nil {
			return 0, fmt.Errorf("setting %s's MTU to %d: %w", name, mtu, err)
		}
	}
	if err := h.LinkSetARPOff(lnk); err != nil {
		return 0, fmt.Errorf("setting %s noarp: %w", name, err)
	}
	if err := h.LinkSetUp(lnk); err != nil {
		return 0, fmt.Errorf("setting %s up: %w", name, err)
	}
	return lnk.Attrs().Index, nil
}

// DeleteDevice removes the VXLAN device (and with it its routes); a missing one is not an
// error.
func DeleteDevice(netnsPath string) error {
	return deleteLink(netnsPath, DeviceName)
}

// DeleteTapDevice removes the tap tunnel device; a missing one is not an error.
func DeleteTapDevice(netnsPath string) error {
	return deleteLink(netnsPath, TapDeviceName)
}

func deleteLink(netnsPath, name string) error {
	h, err := handle(netnsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	lnk, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("finding %s: %w", name, err)
	}
	if err := h.LinkDel(lnk); err != nil {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// SyncRoutes makes this package's routes in the namespace at netnsPath those of
// wantRoutes. Routes it installed before that are no longer wanted are deleted; other
// routes are not touched. A route the kernel refuses (a gateway it has no route to) does
// not keep the others from being made: every refusal is in the error.
func SyncRoutes(netnsPath string, mode Mode, src netip.Addr, nodes []Node) error {
	h, err := handle(netnsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	var devIndex int
	if mode == VXLAN {
		lnk, err := h.LinkByName(DeviceName)
		if err != nil {
			return fmt.Errorf("finding %s: %w", DeviceName, err)
		}
		devIndex = lnk.Attrs().Index
	}
	want := wantRoutes(mode, src, devIndex, nodes)
	var errs []error
	for _, p := range slices.SortedFunc(maps.Keys(want), netip.Prefix.Compare) {
		if err := h.RouteReplace(want[p]); err != nil {
			errs = append(errs, fmt.Errorf("adding route to %v: %w", p, err))
		}
	}
	have, err := Routes(netnsPath)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, r := range have {
		if _, ok := want[r]; ok {
			continue
		}
		if err := h.RouteDel(&netlink.Route{Dst: ipNet(r), Protocol: routeProtocol}); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("deleting route to %v: %w", r, err))
		}
	}
	return errors.Join(errs...)
}

// wantRoutes computes the routes SyncRoutes makes, by destination: one per node with a
// pod CIDR, through the VXLAN device devIndex with source src (VXLAN), or via the node's
// address (Native; IPIP with the pod MTU as the route's); and one per node with an IPv6
// pod CIDR where mode CarriesIPv6 to it: through the device (VXLAN) or via the node's IPv6
// fabric address (Native). Other nodes' IPv6 pod CIDRs get no route (see ErrNoIPv6).
func wantRoutes(mode Mode, src netip.Addr, devIndex int, nodes []Node) map[netip.Prefix]*netlink.Route {
	want := map[netip.Prefix]*netlink.Route{}
	for _, n := range nodes {
		if !n.PodCIDR.IsValid() {
			continue
		}
		r := &netlink.Route{Dst: ipNet(n.PodCIDR), Protocol: routeProtocol}
		switch mode {
		case VXLAN:
			r.LinkIndex, r.Scope, r.Src = devIndex, netlink.SCOPE_LINK, src.AsSlice()
		case IPIP:
			// The route's MTU leaves room for the outer header the dataplane adds after
			// routing: the node's own packets to remote pods are sized for it, and a
			// forwarded packet too large for it gets "fragmentation needed" (DF) or is
			// fragmented here, instead of being lost on the fabric once encapsulated.
			r.Gw, r.MTU = n.Address.AsSlice(), PodMTU(IPIP, UnderlayIPv4)
		default:
			r.Gw = n.Address.AsSlice()
		}
		want[n.PodCIDR.Masked()] = r
	}
	for _, n := range nodes {
		if !n.PodCIDR6.IsValid() || !CarriesIPv6(mode, n.Address6) {
			continue
		}
		r := &netlink.Route{Dst: ipNet(n.PodCIDR6), Protocol: routeProtocol}
		if mode == VXLAN {
			// No source: src is IPv4; the kernel picks the node's IPv6 router address
			// for the node's own packets, and forwarded ones keep theirs.
			r.LinkIndex, r.Scope = devIndex, netlink.SCOPE_LINK
		} else {
			r.Gw = n.Address6.AsSlice()
		}
		want[n.PodCIDR6.Masked()] = r
	}
	return want
}

// Routes lists the destinations of the routes this package installed in the namespace at
// netnsPath, IPv4 and IPv6.
func Routes(netnsPath string) ([]netip.Prefix, error) {
	h, err := handle(netnsPath)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	rs, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: routeProtocol, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	var out []netip.Prefix
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		a, _ := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		out = append(out, netip.PrefixFrom(a.Unmap(), ones))
	}
	return out, nil
}

// RemoveRoutes deletes every route this package installed in the namespace at netnsPath.
func RemoveRoutes(netnsPath string) error {
	return SyncRoutes(netnsPath, Native, netip.Addr{}, nil)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Fabric returns the interfaces through which the namespace at netnsPath reaches the
// nodes' addresses (sorted, without duplicates), and the source address of the first
// node's route: the node's own address on the fabric, which IP-in-IP uses as the outer
// source and accepts as the only outer destination.
func Fabric(netnsPath string, nodes []Node) ([]string, netip.Addr, error) {
	h, err := handle(netnsPath)
	if err != nil {
		return nil, netip.Addr{}, err
	}
	defer h.Close()
	var names []string
	var local netip.Addr
	for _, n := range nodes {
		rs, err := h.RouteGet(n.Address.AsSlice())
		if err != nil || len(rs) == 0 {
			return nil, netip.Addr{}, fmt.Errorf("route to node %v: %w", n.Address, err)
		}
		lnk, err := h.LinkByIndex(rs[0].LinkIndex)
		if err != nil {
			return nil, netip.Addr{}, fmt.Errorf("interface to node %v: %w", n.Address, err)
		}
		if !slices.Contains(names, lnk.Attrs().Name) {
			names = append(names, lnk.Attrs().Name)
		}
		if src, ok := netip.AddrFromSlice(rs[0].Src); ok && !local.IsValid() {
			local = src.Unmap()
		}
	}
	if len(nodes) > 0 && !local.IsValid() {
		return nil, netip.Addr{}, fmt.Errorf("no source address for the route to node %v", nodes[0].Address)
	}
	slices.Sort(names)
	return names, local, nil
}
