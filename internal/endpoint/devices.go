package endpoint

import (
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"
)

// Device is an interface of the node namespace: its name, index and addresses (IPv4 first,
// then IPv6; no link-local ones).
type Device struct {
	Name  string
	Index uint32
	Addrs []netip.Addr
}

// Devices returns the node namespace's interfaces named names, or, with no names, those
// that hold the address holding (the node's address: the interfaces its traffic to the
// other nodes uses). An interface that is missing, or no interface holding the address, is
// an error.
func (n Node) Devices(names []string, holding netip.Addr) ([]Device, error) {
	h, err := n.handle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing node interfaces: %w", err)
	}
	var out []Device
	for _, l := range links {
		name := l.Attrs().Name
		if len(names) > 0 && !slices.Contains(names, name) {
			continue
		}
		d := Device{Name: name, Index: uint32(l.Attrs().Index)}
		for _, family := range []int{unix.AF_INET, unix.AF_INET6} {
			addrs, err := h.AddrList(l, family)
			if err != nil {
				return nil, fmt.Errorf("listing the addresses of %s: %w", name, err)
			}
			for _, a := range addrs {
				// A link-local address is no host address in the ipcache: the same
				// fe80:: addresses are on every link, and the host programs take
				// link-local traffic on a host device as the node's own anyway.
				if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.Unmap().IsLinkLocalUnicast() {
					d.Addrs = append(d.Addrs, ip.Unmap())
				}
			}
		}
		if len(names) == 0 && !slices.Contains(d.Addrs, holding) {
			continue
		}
		out = append(out, d)
	}
	if len(names) == 0 && len(out) == 0 {
		return nil, fmt.Errorf("no interface of the node holds its address %v", holding)
	}
	for _, name := range names {
		if !slices.ContainsFunc(out, func(d Device) bool { return d.Name == name }) {
			return nil, fmt.Errorf("host device %s: no such interface in the node namespace", name)
		}
	}
	return out, nil
}
