package endpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	rnetns "github.com/rampartnet/rampart/internal/netns"
	"github.com/rampartnet/rampart/internal/podaddr"
)

// PodIfName is the endpoint side of the veth pair.
const PodIfName = "eth0"

// Node is the agent's node network namespace: where host-side veths, the router address
// and the /32 (and /128) routes to endpoints live.
type Node struct {
	// Instance is the agent instance name; it is part of every name the package derives.
	Instance string
	// Netns is the node namespace name under /run/netns, or "" for the agent's own (root)
	// namespace.
	Netns string
	// PodCIDR is the endpoint address range; its first address is the router.
	PodCIDR netip.Prefix
	// PodCIDR6 is the IPv6 endpoint range of a dual-stack node (zero: IPv4 only). An
	// endpoint's IPv6 address is paired with its IPv4 one (podaddr.Addrs) and its
	// first address, Router6, is the node's.
	PodCIDR6 netip.Prefix
	// MTU is the MTU of endpoints' veths (both ends) when they are created; 0 keeps the
	// kernel's default. An overlay sets it to leave room for its headers.
	MTU int
}

// Router returns the router address: the first address after the network address of the
// pod range. Endpoints route through it and it carries the host identity.
func (n Node) Router() netip.Addr { return n.PodCIDR.Masked().Addr().Next() }

// DualStack reports whether endpoints get an IPv6 address too.
func (n Node) DualStack() bool { return n.PodCIDR6.IsValid() }

// Router6 returns the node's IPv6 address in PodCIDR6, paired with the router (zero on an
// IPv4-only node). Endpoints route to it through RouterLinkLocal; it carries the host
// identity.
func (n Node) Router6() netip.Addr {
	if !n.DualStack() {
		return netip.Addr{}
	}
	return podaddr.Router6(n.PodCIDR6)
}

// RouterLinkLocal is the link-local address of every host-side veth of a dual-stack node:
// every endpoint's IPv6 default gateway.
var RouterLinkLocal = podaddr.RouterLinkLocal

// NetnsPath returns the path of the node namespace (the process's own if Netns is "").
func (n Node) NetnsPath() string {
	if n.Netns == "" {
		return rnetns.Own()
	}
	return NetnsPath(n.Netns)
}

// EndpointNetns returns the network namespace name of an endpoint:
// rp-<instance>-<namespace>-<name>.
func (n Node) EndpointNetns(namespace, name string) string {
	return "rp-" + n.Instance + "-" + namespace + "-" + name
}

// HostIfName returns the host-side veth name of an endpoint: "rp" and 8 hex digits of a
// hash of instance, namespace and name (10 characters, within IFNAMSIZ).
func (n Node) HostIfName(namespace, name string) string {
	sum := sha256.Sum256([]byte(n.Instance + "\x00" + namespace + "\x00" + name))
	return "rp" + hex.EncodeToString(sum[:4])
}

// Setup creates the node namespace if it is named and missing, and configures it: loopback
// up, the router address on lo (so ARP for it is answered on every veth and it is the
// host's address), and IPv4 forwarding on; on a dual-stack node also Router6 on lo and
// IPv6 forwarding on. It is idempotent.
func (n Node) Setup() error {
	if !n.PodCIDR.IsValid() || !n.PodCIDR.Addr().Is4() {
		return fmt.Errorf("pod CIDR %v: want an IPv4 prefix", n.PodCIDR)
	}
	if n.PodCIDR.Bits() > 30 {
		return fmt.Errorf("pod CIDR %v: too small", n.PodCIDR)
	}
	if n.DualStack() {
		if err := podaddr.CheckPrefix6(n.PodCIDR, n.PodCIDR6); err != nil {
			return fmt.Errorf("IPv6 pod CIDR %v: %w", n.PodCIDR6, err)
		}
	}
	if n.Netns != "" && !NetnsExists(n.Netns) {
		if err := DeleteNetns(n.Netns); err != nil { // a stale unmounted file
			return err
		}
		if _, err := CreateNetns(n.Netns); err != nil {
			return fmt.Errorf("creating node network namespace: %w", err)
		}
	}
	h, lo, err := n.lo()
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("setting node lo up: %w", err)
	}
	addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(n.Router(), 32)), Scope: unix.RT_SCOPE_HOST}
	if err := h.AddrReplace(lo, addr); err != nil {
		return fmt.Errorf("adding router address %v to node lo: %w", n.Router(), err)
	}
	if n.DualStack() {
		// Usable at once: no duplicate address detection on lo, where nothing could
		// answer it.
		addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(n.Router6(), 128)), Flags: unix.IFA_F_NODAD}
		if err := h.AddrReplace(lo, addr); err != nil {
			return fmt.Errorf("adding router address %v to node lo: %w", n.Router6(), err)
		}
	}
	return Do(n.NetnsPath(), func() error {
		for k, v := range n.Sysctls() {
			if err := writeSysctl(k, v); err != nil {
				return err
			}
		}
		return nil
	})
}

// Teardown removes what Setup added: the node namespace itself when it is named, else the
// router addresses from lo. Forwarding is left as it is in the root namespace.
func (n Node) Teardown() error {
	if n.Netns != "" {
		return DeleteNetns(n.Netns)
	}
	err := n.RemoveLoAddress(n.Router())
	if n.DualStack() {
		err = errors.Join(err, n.RemoveLoAddress(n.Router6()))
	}
	return err
}

func (n Node) handle() (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(n.NetnsPath())
	if err != nil {
		return nil, fmt.Errorf("opening node network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE) // links, addresses, routes: one socket, not one per family
	if err != nil {
		return nil, fmt.Errorf("netlink handle in node network namespace: %w", err)
	}
	return h, nil
}

// Endpoint describes a created endpoint.
type Endpoint struct {
	Namespace   string
	Name        string
	IP          netip.Addr
	NetnsName   string
	NetnsPath   string
	HostIfName  string
	HostIfIndex int // in the node namespace
	// PodIfName is the endpoint side of the veth in its namespace (PodIfName, or the
	// attachment's).
	PodIfName string
	// HostMAC and PodMAC are the veth ends' hardware addresses (set by create).
	HostMAC, PodMAC string
	// IP6 is the endpoint's IPv6 address and LinkLocal6 the link-local address of its
	// interface, on a dual-stack node (podaddr.Addrs); zero on an IPv4-only one.
	IP6, LinkLocal6 netip.Addr
}

// Create makes the endpoint's namespace and veth pair and configures addresses and routes.
// On error everything created so far is removed.
func (n Node) Create(namespace, name string, ip netip.Addr) (ep Endpoint, err error) {
	return n.CreateAttached(namespace, name, ip, nil)
}

// Attachment is where a runtime-made endpoint lives (a CNI ADD): a network namespace that
// the container runtime created and owns, and the name of the endpoint's interface in it.
type Attachment struct {
	NetnsPath string
	IfName    string
}

// CreateAttached is Create with attach, which puts the dataplane's programs on the
// host-side veth (named by its argument), run right after the veth is made, while both its
// ends are down (a veth has carrier only when both are up) and the endpoint has no route:
// no packet ever passes the veth before the programs are on it. If attach fails, Create
// fails and removes everything.
func (n Node) CreateAttached(namespace, name string, ip netip.Addr, attach func(hostIfName string) error) (ep Endpoint, err error) {
	return n.create(namespace, name, ip, nil, attach)
}

// CreateIn is CreateAttached for an endpoint in an existing network namespace (at): the
// veth's endpoint side goes into it under at.IfName. The namespace is the runtime's: on
// error only the veth is removed, never the namespace.
func (n Node) CreateIn(namespace, name string, ip netip.Addr, at Attachment, attach func(hostIfName string) error) (Endpoint, error) {
	if at.NetnsPath == "" || at.IfName == "" {
		return Endpoint{}, fmt.Errorf("endpoint %s/%s: attachment needs a network namespace path and an interface name", namespace, name)
	}
	return n.create(namespace, name, ip, &at, attach)
}

func (n Node) create(namespace, name string, ip netip.Addr, at *Attachment, attach func(hostIfName string) error) (ep Endpoint, err error) {
	if !n.PodCIDR.Contains(ip) || ip == n.Router() {
		return Endpoint{}, fmt.Errorf("address %v: not a usable address of %v", ip, n.PodCIDR)
	}
	ep = Endpoint{
		Namespace:  namespace,
		Name:       name,
		IP:         ip,
		NetnsName:  n.EndpointNetns(namespace, name),
		HostIfName: n.HostIfName(namespace, name),
		PodIfName:  PodIfName,
	}
	if ep.IP6, ep.LinkLocal6, err = podaddr.Addrs(n.PodCIDR, n.PodCIDR6, ip); err != nil {
		return Endpoint{}, err
	}
	if at != nil {
		ep.NetnsName, ep.NetnsPath, ep.PodIfName = "", at.NetnsPath, at.IfName
	} else if len(ep.NetnsName) > 255 {
		return Endpoint{}, fmt.Errorf("endpoint %s/%s: name too long", namespace, name)
	}
	node, err := n.handle()
	if err != nil {
		return Endpoint{}, err
	}
	defer node.Close()
	if _, err := node.LinkByName(ep.HostIfName); err == nil {
		return Endpoint{}, fmt.Errorf("host interface %s already exists", ep.HostIfName)
	}

	if at == nil {
		ep.NetnsPath, err = CreateNetns(ep.NetnsName)
		if err != nil {
			return Endpoint{}, err
		}
	}
	defer func() {
		if err != nil {
			// Deleting the host side deletes the endpoint side, also in the runtime's
			// namespace, which stays.
			if l, lerr := node.LinkByName(ep.HostIfName); lerr == nil {
				node.LinkDel(l)
			}
			if at == nil {
				DeleteNetns(ep.NetnsName)
			}
		}
	}()
	podNs, err := netns.GetFromPath(ep.NetnsPath)
	if err != nil {
		return ep, fmt.Errorf("opening endpoint network namespace %s: %w", ep.NetnsPath, err)
	}
	defer podNs.Close()
	pod, err := netlink.NewHandleAt(podNs, unix.NETLINK_ROUTE)
	if err != nil {
		return ep, fmt.Errorf("netlink handle in endpoint network namespace: %w", err)
	}
	defer pod.Close()
	if at != nil {
		if err := n.checkPodNetns(pod, ep.NetnsPath); err != nil {
			return ep, err
		}
		if _, err := pod.LinkByName(ep.PodIfName); err == nil {
			return ep, fmt.Errorf("interface %s already exists in %s", ep.PodIfName, ep.NetnsPath)
		}
	}

	// The peer is created directly inside the endpoint namespace under its final name, so
	// no temporary name can collide in the node namespace.
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: ep.HostIfName, MTU: n.MTU},
		PeerName:      ep.PodIfName,
		PeerNamespace: netlink.NsFd(int(podNs)),
	}
	if err := node.LinkAdd(veth); err != nil {
		return ep, fmt.Errorf("creating veth %s: %w", ep.HostIfName, err)
	}
	if attach != nil {
		if err := attach(ep.HostIfName); err != nil {
			return ep, fmt.Errorf("attaching to %s: %w", ep.HostIfName, err)
		}
	}
	if err := n.configurePod(pod, ep); err != nil {
		return ep, err
	}
	if err := n.configureHostSide(node, pod, &ep); err != nil {
		return ep, err
	}
	return ep, nil
}

// configureHostSide sets up the host side of ep's veth, whose endpoint side is
// configured: its IPv6 (or IPv6 off), up on both sides, the routes to the endpoint's
// addresses, and the MACs recorded in ep.
func (n Node) configureHostSide(node, pod *netlink.Handle, ep *Endpoint) error {
	host, err := node.LinkByName(ep.HostIfName)
	if err != nil {
		return fmt.Errorf("finding %s: %w", ep.HostIfName, err)
	}
	ep.HostIfIndex = host.Attrs().Index
	if n.DualStack() {
		if err := n.configureHost6(node, host); err != nil {
			return err
		}
	} else {
		// An IPv4-only node: IPv6 is dropped by the dataplane, keep the links quiet.
		_ = Do(n.NetnsPath(), func() error {
			return writeSysctl("net/ipv6/conf/"+ep.HostIfName+"/disable_ipv6", "1")
		})
	}
	if err := node.LinkSetUp(host); err != nil {
		return fmt.Errorf("setting %s up: %w", ep.HostIfName, err)
	}
	if err := WaitOperUp(node, ep.HostIfName, linkUpTimeout); err != nil {
		return err
	}
	if err := WaitOperUp(pod, ep.PodIfName, linkUpTimeout); err != nil {
		return fmt.Errorf("endpoint side: %w", err)
	}
	route := &netlink.Route{
		LinkIndex: ep.HostIfIndex,
		Dst:       ipNet(netip.PrefixFrom(ep.IP, 32)),
		Scope:     netlink.SCOPE_LINK,
		Src:       n.Router().AsSlice(),
	}
	if err := node.RouteReplace(route); err != nil {
		return fmt.Errorf("adding route to %v via %s: %w", ep.IP, ep.HostIfName, err)
	}
	if n.DualStack() {
		route := &netlink.Route{
			LinkIndex: ep.HostIfIndex,
			Dst:       ipNet(netip.PrefixFrom(ep.IP6, 128)),
			Scope:     netlink.SCOPE_LINK,
			Src:       n.Router6().AsSlice(),
		}
		if err := node.RouteReplace(route); err != nil {
			return fmt.Errorf("adding route to %v via %s: %w", ep.IP6, ep.HostIfName, err)
		}
	}
	if l, err := pod.LinkByName(ep.PodIfName); err == nil {
		ep.PodMAC = l.Attrs().HardwareAddr.String()
	}
	ep.HostMAC = host.Attrs().HardwareAddr.String()
	return nil
}

// in6AddrGenModeNone is IN6_ADDR_GEN_MODE_NONE (include/uapi/linux/if_link.h): the
// interface generates no IPv6 address.
const in6AddrGenModeNone = 1

// configureHost6 gives a dual-stack endpoint's host-side veth (down still) IPv6 and only
// RouterLinkLocal: the endpoint's default gateway, the same on every veth, so the node
// answers neighbour solicitations for it on each. No address of its own making
// (addr_gen_mode none, set before the link is up, when the kernel would make one), and
// no duplicate address detection, which would keep the address unusable for a second
// and which the endpoint, the only other host on the link, cannot fail.
func (n Node) configureHost6(node *netlink.Handle, host netlink.Link) error {
	name := host.Attrs().Name
	// Written, not assumed: a node whose default is disable_ipv6=1 would refuse the
	// address.
	if err := Do(n.NetnsPath(), func() error {
		return writeSysctl("net/ipv6/conf/"+name+"/disable_ipv6", "0")
	}); err != nil {
		return err
	}
	if err := node.LinkSetIP6AddrGenMode(host, in6AddrGenModeNone); err != nil {
		return fmt.Errorf("setting addr_gen_mode none on %s: %w", name, err)
	}
	addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(RouterLinkLocal, 64)), Flags: unix.IFA_F_NODAD}
	if err := node.AddrAdd(host, addr); err != nil {
		return fmt.Errorf("adding %v to %s: %w", RouterLinkLocal, name, err)
	}
	return nil
}

func (n Node) configurePod(pod *netlink.Handle, ep Endpoint) error {
	lo, err := pod.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding endpoint lo: %w", err)
	}
	if err := pod.LinkSetUp(lo); err != nil {
		return fmt.Errorf("setting endpoint lo up: %w", err)
	}
	eth, err := pod.LinkByName(ep.PodIfName)
	if err != nil {
		return fmt.Errorf("finding endpoint %s: %w", ep.PodIfName, err)
	}
	// The endpoint side makes no IPv6 address of its own (addr_gen_mode none). On an
	// IPv4-only node, whose dataplane drops IPv6, that keeps it quiet (no link-local
	// address, so no neighbour discovery or router solicitation); on a dual-stack one it
	// has exactly the two addresses the dataplane lets it send from (Endpoint.IP6 and
	// LinkLocal6), which it could not tell from a kernel-made one. Set over netlink, not
	// as the disable_ipv6 sysctl: every endpoint namespace has an eth0, and the kernel
	// finds /proc/sys/.../conf/eth0 by walking the dentries of all of them
	// (proc_sys_compare), about 1 ms per add with 1,000 endpoints. On an IPv4-only node
	// an error (a kernel without IPv6) leaves nothing to quiet.
	if err := pod.LinkSetIP6AddrGenMode(eth, in6AddrGenModeNone); err != nil && n.DualStack() {
		return fmt.Errorf("setting addr_gen_mode none on endpoint %s: %w", ep.PodIfName, err)
	}
	if err := pod.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(ep.IP, 32))}); err != nil {
		return fmt.Errorf("adding %v to endpoint %s: %w", ep.IP, ep.PodIfName, err)
	}
	if n.DualStack() {
		// The address alone (a /128, with no prefix route: no other address is on the
		// link, everything goes through the router, as with IPv4's /32) and the
		// link-local one (a /64, the link's), both usable at once: no duplicate
		// address detection, which would hold them for a second and which the node,
		// the only other host on the link, cannot fail.
		for _, a := range []*netlink.Addr{
			{IPNet: ipNet(netip.PrefixFrom(ep.IP6, 128)), Flags: unix.IFA_F_NODAD | unix.IFA_F_NOPREFIXROUTE},
			{IPNet: ipNet(netip.PrefixFrom(ep.LinkLocal6, 64)), Flags: unix.IFA_F_NODAD},
		} {
			if err := pod.AddrAdd(eth, a); err != nil {
				return fmt.Errorf("adding %v to endpoint %s: %w", a.IPNet, ep.PodIfName, err)
			}
		}
	}
	if err := pod.LinkSetUp(eth); err != nil {
		return fmt.Errorf("setting endpoint %s up: %w", ep.PodIfName, err)
	}
	router := n.Router()
	if err := pod.RouteReplace(&netlink.Route{
		LinkIndex: eth.Attrs().Index,
		Dst:       ipNet(netip.PrefixFrom(router, 32)),
		Scope:     netlink.SCOPE_LINK,
		Src:       ep.IP.AsSlice(),
	}); err != nil {
		return fmt.Errorf("adding route to router %v: %w", router, err)
	}
	if err := pod.RouteReplace(&netlink.Route{
		LinkIndex: eth.Attrs().Index,
		Gw:        router.AsSlice(),
		Src:       ep.IP.AsSlice(),
	}); err != nil {
		return fmt.Errorf("adding default route via %v: %w", router, err)
	}
	if n.DualStack() {
		if err := pod.RouteReplace(&netlink.Route{
			LinkIndex: eth.Attrs().Index,
			Dst:       ipNet(netip.PrefixFrom(netip.IPv6Unspecified(), 0)),
			Gw:        RouterLinkLocal.AsSlice(),
			Src:       ep.IP6.AsSlice(),
		}); err != nil {
			return fmt.Errorf("adding default route via %v: %w", RouterLinkLocal, err)
		}
	}
	return nil
}

// Lookup finds an existing endpoint's host interface and namespace, for reattaching after
// a restart. It fails if either is missing.
func (n Node) Lookup(namespace, name string, ip netip.Addr) (Endpoint, error) {
	ep := Endpoint{
		Namespace:  namespace,
		Name:       name,
		IP:         ip,
		NetnsName:  n.EndpointNetns(namespace, name),
		HostIfName: n.HostIfName(namespace, name),
	}
	ep.NetnsPath = NetnsPath(ep.NetnsName)
	var err error
	if ep.IP6, ep.LinkLocal6, err = podaddr.Addrs(n.PodCIDR, n.PodCIDR6, ip); err != nil {
		return ep, err
	}
	if !NetnsExists(ep.NetnsName) {
		return ep, fmt.Errorf("endpoint %s/%s: network namespace %s missing", namespace, name, ep.NetnsName)
	}
	node, err := n.handle()
	if err != nil {
		return ep, err
	}
	defer node.Close()
	l, err := node.LinkByName(ep.HostIfName)
	if err != nil {
		return ep, fmt.Errorf("endpoint %s/%s: host interface %s: %w", namespace, name, ep.HostIfName, err)
	}
	ep.HostIfIndex = l.Attrs().Index
	return ep, nil
}

// LookupIn finds an endpoint made by CreateIn: its host-side veth in the node namespace,
// and in the runtime's namespace its interface, a veth, up, with the endpoint's address.
// It fails, saying what is wrong, if any of that is missing.
func (n Node) LookupIn(namespace, name string, ip netip.Addr, at Attachment) (Endpoint, error) {
	ep := Endpoint{
		Namespace:  namespace,
		Name:       name,
		IP:         ip,
		NetnsPath:  at.NetnsPath,
		HostIfName: n.HostIfName(namespace, name),
		PodIfName:  at.IfName,
	}
	var err error
	if ep.IP6, ep.LinkLocal6, err = podaddr.Addrs(n.PodCIDR, n.PodCIDR6, ip); err != nil {
		return ep, err
	}
	node, err := n.handle()
	if err != nil {
		return ep, err
	}
	defer node.Close()
	host, err := node.LinkByName(ep.HostIfName)
	if err != nil {
		return ep, fmt.Errorf("endpoint %s/%s: host interface %s: %w", namespace, name, ep.HostIfName, err)
	}
	ep.HostIfIndex = host.Attrs().Index
	ep.HostMAC = host.Attrs().HardwareAddr.String()
	podNs, err := netns.GetFromPath(at.NetnsPath)
	if err != nil {
		return ep, fmt.Errorf("endpoint %s/%s: network namespace %s: %w", namespace, name, at.NetnsPath, err)
	}
	defer podNs.Close()
	pod, err := netlink.NewHandleAt(podNs, unix.NETLINK_ROUTE)
	if err != nil {
		return ep, fmt.Errorf("netlink handle in endpoint network namespace: %w", err)
	}
	defer pod.Close()
	l, err := pod.LinkByName(at.IfName)
	if err != nil {
		return ep, fmt.Errorf("endpoint %s/%s: interface %s in %s: %w", namespace, name, at.IfName, at.NetnsPath, err)
	}
	if l.Type() != "veth" {
		return ep, fmt.Errorf("endpoint %s/%s: interface %s in %s is a %s, not a veth", namespace, name, at.IfName, at.NetnsPath, l.Type())
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		return ep, fmt.Errorf("endpoint %s/%s: interface %s in %s is down", namespace, name, at.IfName, at.NetnsPath)
	}
	ep.PodMAC = l.Attrs().HardwareAddr.String()
	addrs, err := pod.AddrList(l, unix.AF_UNSPEC)
	if err != nil {
		return ep, fmt.Errorf("endpoint %s/%s: listing addresses of %s: %w", namespace, name, at.IfName, err)
	}
	for _, want := range []netip.Addr{ip, ep.IP6} {
		if want.IsValid() && !slices.ContainsFunc(addrs, func(a netlink.Addr) bool {
			got, ok := netip.AddrFromSlice(a.IP)
			return ok && got.Unmap() == want
		}) {
			return ep, fmt.Errorf("endpoint %s/%s: interface %s in %s does not have address %v", namespace, name, at.IfName, at.NetnsPath, want)
		}
	}
	return ep, nil
}

// DeleteLink removes an endpoint's veth pair and nothing else: for an endpoint made by
// CreateIn, whose namespace belongs to the runtime. A missing veth is not an error.
func (n Node) DeleteLink(namespace, name string) error {
	node, err := n.handle()
	if err != nil {
		return err
	}
	defer node.Close()
	l, err := node.LinkByName(n.HostIfName(namespace, name))
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("finding %s: %w", n.HostIfName(namespace, name), err)
	}
	if err := node.LinkDel(l); err != nil {
		return fmt.Errorf("deleting %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// Delete removes an endpoint's veth pair and network namespace. Missing parts are not an
// error, so Delete also cleans up after a half-created endpoint.
func (n Node) Delete(namespace, name string) error {
	var errs []error
	if node, err := n.handle(); err != nil {
		errs = append(errs, err)
	} else {
		if l, err := node.LinkByName(n.HostIfName(namespace, name)); err == nil {
			if err := node.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("deleting %s: %w", l.Attrs().Name, err))
			}
		}
		node.Close()
	}
	if err := DeleteNetns(n.EndpointNetns(namespace, name)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
