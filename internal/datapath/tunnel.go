package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The overlay's programs on the node's VXLAN device (bpf/include/tunnel.h).
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
func (d *Datapath) AttachTunnel(netnsPath, ifname string) (uint32, error) {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return 0, fmt.Errorf("attaching the overlay to %s: %w", ifname, err)
	}
	defer h.Close()
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
	if err := h.FilterReplace(bpfFilter(idx, netlink.HANDLE_MIN_INGRESS, filterFromTunnel, d.objs.RampartFromTunnel)); err != nil {
		return 0, fmt.Errorf("attaching the overlay to %s: tc ingress filter: %w", ifname, err)
	}
	if err := h.FilterReplace(bpfFilter(idx, netlink.HANDLE_MIN_EGRESS, filterToTunnel, d.objs.RampartToTunnel)); err != nil {
		return 0, fmt.Errorf("attaching the overlay to %s: tc egress filter: %w", ifname, err)
	}
	if err := d.setTunnel(uint32(idx)); err != nil {
		return 0, fmt.Errorf("attaching the overlay to %s: %w", ifname, err)
	}
	return uint32(idx), nil
}

// ClearTunnel forgets the VXLAN device (the overlay is off): from then on no packet's mark
// is taken for an identity that arrived in the overlay. The device's filters go with the
// device.
func (d *Datapath) ClearTunnel() error {
	if err := d.setTunnel(0); err != nil {
		return fmt.Errorf("clearing the overlay: %w", err)
	}
	return nil
}

// TunnelIfindex returns the VXLAN device's index as the tunnel map holds it (0: none).
func (d *Datapath) TunnelIfindex() (uint32, error) {
	var cfg rampartTunnelConfig
	if err := d.objs.Tunnel.Lookup(uint32(0), &cfg); err != nil {
		return 0, fmt.Errorf("reading the tunnel map: %w", err)
	}
	return cfg.Ifindex, nil
}

func (d *Datapath) setTunnel(ifindex uint32) error {
	cfg := rampartTunnelConfig{Ifindex: ifindex}
	if err := d.objs.Tunnel.Update(uint32(0), &cfg, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("writing the tunnel map: %w", err)
	}
	return nil
}
