package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Tunnel is the overlay's programs and maps: the VXLAN device's, the IP-in-IP programs on
// the fabric, the tap tunnel's, and the nodes reached over the IPv6 fabric.
type Tunnel struct{ *handle }

// The VXLAN overlay's programs on the node's VXLAN device (bpf/include/tunnel.h).
const (
	filterToTunnel   = "rampart_to_tunnel"
	filterFromTunnel = "rampart_from_tunnel"
)

// AttachTunnel installs the overlay programs on ifname, the node's collect_md VXLAN
// device in the network namespace at netnsPath ("" = the caller's): rampart_to_tunnel on
// its egress (sets each packet's tunnel key: the destination's node, and the source's
// identity as VNI) and rampart_from_tunnel on its ingress (admits packets from known
// nodes only), as tc filters that live as long as the device and are replaced in place on
// a restart. Then it records the device's index in the tunnel map, from which
// rampart_to_ep believes the identity that arrived in the VNI only for packets received
// on this device. It returns the device's index.
func (d *Tunnel) AttachTunnel(netnsPath, ifname string) (uint32, error) {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return 0, fmt.Errorf("attaching the overlay to %s: %w", ifname, err)
	}
	defer h.Close()
	progs, err := programs(d.handle, (*dataplaneObjects).vxlanProgs)
	if err != nil {
		return 0, fmt.Errorf("attaching the overlay to %s: %w", ifname, err)
	}
	lnk, err := h.LinkByName(ifname)
	if err != nil {
		return 0, fmt.Errorf("attaching the overlay to %s: finding interface: %w", ifname, err)
	}
	idx := lnk.Attrs().Index
	if err := h.QdiscAdd(clsact(idx)); err != nil && !errors.Is(err, unix.EEXIST) {
		return 0, fmt.Errorf("attaching the overlay to %s: adding clsact qdisc: %w", ifname, err)
	}
	// Ingress first: until both are on, packets into the overlay leave without a tunnel
	// key, which the device drops (it has no destination for them).
	if err := h.FilterReplace(bpfFilter(idx, netlink.HANDLE_MIN_INGRESS, filterFromTunnel, progs.RampartFromTunnel)); err != nil {
		return 0, fmt.Errorf("attaching the overlay to %s: tc ingress filter: %w", ifname, err)
	}
	if err := h.FilterReplace(bpfFilter(idx, netlink.HANDLE_MIN_EGRESS, filterToTunnel, progs.RampartToTunnel)); err != nil {
		return 0, fmt.Errorf("attaching the overlay to %s: tc egress filter: %w", ifname, err)
	}
	if err := d.setTunnel(rampartTunnelConfig{Ifindex: uint32(idx)}); err != nil {
		return 0, fmt.Errorf("attaching the overlay to %s: %w", ifname, err)
	}
	return uint32(idx), nil
}

// ClearTunnel forgets the overlay (VXLAN device, IP-in-IP address): from then on no
// packet's mark is taken for an identity that arrived in the overlay, and the IP-in-IP
// programs, where still attached, open and encapsulate nothing. The VXLAN device's filters
// go with the device; DetachIPIP removes the IP-in-IP ones.
func (d *Tunnel) ClearTunnel() error {
	if err := d.setTunnel(rampartTunnelConfig{}); err != nil {
		return fmt.Errorf("clearing the overlay: %w", err)
	}
	return nil
}

// TunnelIfindex returns the VXLAN device's index as the tunnel map holds it (0: none).
func (d *Tunnel) TunnelIfindex() (uint32, error) {
	var cfg rampartTunnelConfig
	if err := d.objs.Tunnel.Lookup(uint32(0), &cfg); err != nil {
		return 0, fmt.Errorf("reading the tunnel map: %w", err)
	}
	return cfg.Ifindex, nil
}

func (d *Tunnel) setTunnel(cfg rampartTunnelConfig) error {
	if err := d.objs.Tunnel.Update(uint32(0), &cfg, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("writing the tunnel map: %w", err)
	}
	return nil
}

// SetTunnelRemote6 makes the nodes the VXLAN overlay and the tap tunnel reach over the IPv6
// fabric those of remote6: by IPv4 node address (the ipcache's tunnel endpoint), the IPv6
// fabric address the outer packets go to (the tunnel_remote6 map). Nodes it no longer
// names are reached at their IPv4 address again. Entries are written before stale ones go,
// so a node that stays is never without one.
func (d *Tunnel) SetTunnelRemote6(remote6 map[netip.Addr]netip.Addr) error {
	want := map[uint32]rampartTunnelAddr6{}
	for node, addr6 := range remote6 {
		if !node.Is4() || !addr6.Is6() || addr6.Is4In6() {
			return fmt.Errorf("writing the tunnel_remote6 map: node %v at %v: want an IPv4 node address and an IPv6 fabric address", node, addr6)
		}
		a := node.As4()
		want[binary.NativeEndian.Uint32(a[:])] = rampartTunnelAddr6{Addr: addr6.As16()}
	}
	for k, v := range want {
		if err := d.objs.TunnelRemote6.Update(k, &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("writing the tunnel_remote6 map: %w", err)
		}
	}
	have, err := d.TunnelRemote6()
	if err != nil {
		return err
	}
	for node := range have {
		if _, ok := remote6[node]; ok {
			continue
		}
		a := node.As4()
		if err := d.objs.TunnelRemote6.Delete(binary.NativeEndian.Uint32(a[:])); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting from the tunnel_remote6 map: %w", err)
		}
	}
	return nil
}

// TunnelRemote6 returns the tunnel_remote6 map's content (see SetTunnelRemote6).
func (d *Tunnel) TunnelRemote6() (map[netip.Addr]netip.Addr, error) {
	out := map[netip.Addr]netip.Addr{}
	var k uint32
	var v rampartTunnelAddr6
	it := d.objs.TunnelRemote6.Iterate()
	for it.Next(&k, &v) {
		var a [4]byte
		binary.NativeEndian.PutUint32(a[:], k)
		out[netip.AddrFrom4(a)] = netip.AddrFrom16(v.Addr)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the tunnel_remote6 map: %w", err)
	}
	return out, nil
}

// The IP-in-IP overlay's programs on the fabric interfaces (bpf/include/ipip.h). Their
// priority differs from the endpoints' filters': a fabric interface is not Rampart's (on a
// real host it is eth0), and a filter of someone else's at priority 1 must not be
// replaced.
const (
	filterToIPIP     = "rampart_to_ipip"
	filterFromIPIP   = "rampart_from_ipip"
	fabricFilterPrio = 0xb7
)

// AttachIPIP makes the node an IP-in-IP overlay node: local, its address on the fabric,
// becomes the outer source of what it encapsulates and the only outer destination it
// decapsulates, and the programs go on the fabric interfaces ifnames (those the routes to
// the other nodes leave through) in the network namespace at netnsPath: rampart_to_ipip on
// egress, rampart_from_ipip on ingress, replaced in place on a restart. They leave the
// interfaces they were on before and that are not in ifnames (the first call in a process
// looks at every interface, later ones at those of the call before). The tunnel map's
// VXLAN index is 0, so no packet's mark is taken for an identity: the inner source address
// gives it. The address is written first: programs attached without it would drop the
// remote pods' packets.
func (d *Tunnel) AttachIPIP(netnsPath string, local netip.Addr, ifnames []string) error {
	if err := d.attachIPIP(netnsPath, local, ifnames); err != nil {
		return err
	}
	d.mu.Lock()
	before := d.ipipFabric
	d.mu.Unlock()
	var err error
	if before == nil {
		_, err = DetachIPIP(netnsPath, ifnames...)
	} else {
		for _, name := range before {
			if !slices.Contains(ifnames, name) {
				err = errors.Join(err, detachIPIPFrom(netnsPath, name))
			}
		}
	}
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.ipipFabric = append([]string{}, ifnames...)
	d.mu.Unlock()
	return nil
}

// StopIPIP ends the IP-in-IP overlay if this node runs it (the tunnel map holds a node
// address, which AttachIPIP writes before it attaches anything and which only StopIPIP
// clears, after the programs are gone): the programs leave every interface and the address
// is cleared. Otherwise it changes nothing and looks at no interface.
func (d *Tunnel) StopIPIP(netnsPath string) error {
	var cfg rampartTunnelConfig
	if err := d.objs.Tunnel.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("reading the tunnel map: %w", err)
	}
	if cfg.IpipLocal != 0 {
		if _, err := DetachIPIP(netnsPath); err != nil {
			return err
		}
		if err := d.ClearTunnel(); err != nil {
			return err
		}
	}
	d.mu.Lock()
	d.ipipFabric = []string{}
	d.mu.Unlock()
	return nil
}

func (d *Tunnel) attachIPIP(netnsPath string, local netip.Addr, ifnames []string) error {
	if !local.Is4() {
		return fmt.Errorf("attaching the IP-in-IP overlay: node address %v is not IPv4", local)
	}
	a := local.As4()
	if err := d.setTunnel(rampartTunnelConfig{IpipLocal: binary.NativeEndian.Uint32(a[:])}); err != nil {
		return fmt.Errorf("attaching the IP-in-IP overlay: %w", err)
	}
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return fmt.Errorf("attaching the IP-in-IP overlay: %w", err)
	}
	defer h.Close()
	progs, err := programs(d.handle, (*dataplaneObjects).ipipProgs)
	if err != nil {
		return fmt.Errorf("attaching the IP-in-IP overlay: %w", err)
	}
	for _, ifname := range ifnames {
		lnk, err := h.LinkByName(ifname)
		if err != nil {
			return fmt.Errorf("attaching the IP-in-IP overlay to %s: finding interface: %w", ifname, err)
		}
		idx := lnk.Attrs().Index
		if err := h.QdiscAdd(clsact(idx)); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("attaching the IP-in-IP overlay to %s: adding clsact qdisc: %w", ifname, err)
		}
		if err := h.FilterReplace(ipipFilters.filter(idx, netlink.HANDLE_MIN_INGRESS, filterFromIPIP, progs.RampartFromIpip)); err != nil {
			return fmt.Errorf("attaching the IP-in-IP overlay to %s: tc ingress filter: %w", ifname, err)
		}
		if err := h.FilterReplace(ipipFilters.filter(idx, netlink.HANDLE_MIN_EGRESS, filterToIPIP, progs.RampartToIpip)); err != nil {
			return fmt.Errorf("attaching the IP-in-IP overlay to %s: tc egress filter: %w", ifname, err)
		}
	}
	return nil
}

// DetachIPIP removes the IP-in-IP programs from every interface of the network namespace
// at netnsPath, except those in keep, and returns the interfaces it removed them from. A
// clsact qdisc left without filters is removed too; one that holds someone else's stays.
func DetachIPIP(netnsPath string, keep ...string) ([]string, error) {
	return ipipFilters.detach(netnsPath, keep)
}

// detachIPIPFrom removes the IP-in-IP programs from the interface ifname, if it still exists.
func detachIPIPFrom(netnsPath, ifname string) error { return ipipFilters.detachFrom(netnsPath, ifname) }

const filterFromTapTunnel = "rampart_from_tap_tunnel"

// AttachTapTunnel puts rampart_from_tap_tunnel on the tc ingress of ifname, the node's tap
// tunnel device (a collect_md VXLAN device of its own port, in the namespace at
// netnsPath), through which copies for monitors on other nodes leave and those for this
// node's monitors arrive. It returns the device's index (TapRule.MonitorRx of remote
// rules).
func (d *Tunnel) AttachTapTunnel(netnsPath, ifname string) (uint32, error) {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return 0, fmt.Errorf("attaching the tap tunnel to %s: %w", ifname, err)
	}
	defer h.Close()
	progs, err := programs(d.handle, (*dataplaneObjects).tapTunnelProgs)
	if err != nil {
		return 0, fmt.Errorf("attaching the tap tunnel to %s: %w", ifname, err)
	}
	lnk, err := h.LinkByName(ifname)
	if err != nil {
		return 0, fmt.Errorf("attaching the tap tunnel to %s: finding interface: %w", ifname, err)
	}
	idx := lnk.Attrs().Index
	if err := h.QdiscAdd(clsact(idx)); err != nil && !errors.Is(err, unix.EEXIST) {
		return 0, fmt.Errorf("attaching the tap tunnel to %s: adding clsact qdisc: %w", ifname, err)
	}
	if err := h.FilterReplace(bpfFilter(idx, netlink.HANDLE_MIN_INGRESS, filterFromTapTunnel, progs.RampartFromTapTunnel)); err != nil {
		return 0, fmt.Errorf("attaching the tap tunnel to %s: tc ingress filter: %w", ifname, err)
	}
	d.mu.Lock()
	d.tapTunnel = uint32(idx)
	d.mu.Unlock()
	return uint32(idx), nil
}
