package nodetest

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
)

// removeStaleHostLinks removes the host links holding addr, a slot's host address, that a
// lab which could not clean up left behind (its process killed: a test binary's timeout,
// SIGKILL). Called with the slot's lock held, so no live lab's link is touched; left in
// place, a second link with the address would take the API server's traffic from this
// lab's nodes. Only labs put a slot's host address on a host link.
func removeStaleHostLinks(addr netip.Addr, logf func(string, ...any)) error {
	links, err := hostLinksWith(addr)
	if err != nil {
		return err
	}
	for _, l := range links {
		logf("removing link %s with %v, left by a lab that did not end", l.Attrs().Name, addr)
		if err := deleteLink(l.Attrs().Name); err != nil {
			return fmt.Errorf("removing stale link: %w", err)
		}
	}
	return nil
}

// deleteLink deletes the host's link name if it is there (the kernel may be deleting it
// with its peer's namespace meanwhile).
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			return nil
		}
		return fmt.Errorf("finding link %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, syscall.ENODEV) {
		return fmt.Errorf("deleting link %s: %w", name, err)
	}
	return nil
}

// hostLinksWith are the links of the host's network namespace that hold addr.
func hostLinksWith(addr netip.Addr) ([]netlink.Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var out []netlink.Link
	for _, l := range links {
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if a.IP.Equal(addr.AsSlice()) {
				out = append(out, l)
				break
			}
		}
	}
	return out, nil
}

// LeftoverHostLinks are the host links holding the host address of a slot that no lab
// holds: what a lab that ended left behind (a test of a lab's clean-up checks that it is
// empty; another lab's link, in a slot it holds, is not listed). It looks at each slot
// with the host record's lock held, so no lab takes a slot meanwhile.
func LeftoverHostLinks() ([]string, error) {
	h := theHost(func(string, ...any) {})
	var names []string
	err := h.locked(func(rec *hostRecord) (bool, error) {
		for i := range MaxSlots {
			s := SlotAt(h.dir, i)
			f, free, err := tryLock(s.LockFile)
			if err != nil {
				return false, err
			}
			if !free {
				continue
			}
			links, err := hostLinksWith(s.HostAddress)
			f.Close()
			if err != nil {
				return false, err
			}
			for _, l := range links {
				names = append(names, fmt.Sprintf("%s (%v, slot %d)", l.Attrs().Name, s.HostAddress, i))
			}
		}
		return false, nil
	})
	return names, err
}
