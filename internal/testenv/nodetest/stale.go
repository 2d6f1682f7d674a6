package nodetest

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

// removeStaleHostLinks removes the host links holding HostAddress that a lab which could
// not clean up left behind (its process killed: a test binary's timeout, SIGKILL). Called
// with the lock held, when no other lab runs, so no live lab's link is touched; left in
// place, a second link with HostAddress would take the API server's traffic from this
// lab's nodes. Only labs put HostAddress on a host link.
func removeStaleHostLinks(logf func(string, ...any)) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("listing links: %w", err)
	}
	for _, l := range links {
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if a.IP.Equal(HostAddress.AsSlice()) {
				logf("removing link %s with %v, left by a lab that did not end", l.Attrs().Name, HostAddress)
				if err := netlink.LinkDel(l); err != nil {
					return fmt.Errorf("removing stale link %s: %w", l.Attrs().Name, err)
				}
				break
			}
		}
	}
	return nil
}
