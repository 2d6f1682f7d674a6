package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// endpoint6Of checks an endpoint's IPv6 addresses and gives them as the endpoints6 map
// holds them; ok is false for an endpoint without IPv6.
func endpoint6Of(ep EndpointInfo) (v rampartEndpoint6, ok bool, err error) {
	if !ep.Addr6.IsValid() && !ep.LinkLocal6.IsValid() {
		return v, false, nil
	}
	a, ll := ep.Addr6, ep.LinkLocal6
	if !a.Is6() || a.Is4In6() || a.IsUnspecified() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.Zone() != "" {
		return v, false, fmt.Errorf("endpoint IPv6 address %v: want a unicast IPv6 address beyond the link", a)
	}
	if !ll.Is6() || !ll.IsLinkLocalUnicast() || ll.Zone() != "" {
		return v, false, fmt.Errorf("endpoint link-local address %v: want an address of fe80::/10", ll)
	}
	return rampartEndpoint6{Addr: a.As16(), Lladdr: ll.As16()}, true, nil
}

// putEndpoint6 writes (or, for an endpoint without IPv6, deletes) the endpoint's IPv6
// addresses in endpoints6, the IPv6 path's anti-spoofing: only they may be its sources.
func (d *Endpoints) putEndpoint6(epID uint32, v rampartEndpoint6, ok bool) error {
	old, had := d.addrs6[epID]
	switch {
	case ok && (!had || old != v):
		if err := d.objs.Endpoints6.Put(&epID, &v); err != nil {
			return fmt.Errorf("writing IPv6 addresses: %w", err)
		}
		d.addrs6[epID] = v
	case !ok && had:
		if err := d.deleteEndpoint6(epID); err != nil {
			return err
		}
	}
	return nil
}

func (d *Endpoints) deleteEndpoint6(epID uint32) error {
	if err := d.objs.Endpoints6.Delete(&epID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting IPv6 addresses: %w", err)
	}
	delete(d.addrs6, epID)
	return nil
}

// addrs6Of is what endpoints6 holds for epID, as EndpointInfo has it.
func (d *Endpoints) addrs6Of(epID uint32) (addr, ll netip.Addr) {
	v, ok := d.addrs6[epID]
	if !ok {
		return netip.Addr{}, netip.Addr{}
	}
	return netip.AddrFrom16(v.Addr), netip.AddrFrom16(v.Lladdr)
}
