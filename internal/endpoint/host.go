package endpoint

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NodeSysctls are the settings Setup makes in the node namespace, key (under /proc/sys)
// to value. An agent records their previous values so that uninstall can restore them.
var NodeSysctls = map[string]string{"net/ipv4/ip_forward": "1"}

// ReadSysctl reads /proc/sys/key in the network namespace at netnsPath, with runs of
// white space made one space (ip_local_port_range reads "61000\t65535").
func ReadSysctl(netnsPath, key string) (string, error) {
	var v string
	err := Do(netnsPath, func() error {
		b, err := os.ReadFile(filepath.Join("/proc/sys", key))
		if err != nil {
			return fmt.Errorf("reading %s: %w", key, err)
		}
		v = strings.Join(strings.Fields(string(b)), " ")
		return nil
	})
	return v, err
}

// WriteSysctl writes /proc/sys/key in the network namespace at netnsPath.
func WriteSysctl(netnsPath, key, value string) error {
	return Do(netnsPath, func() error { return writeSysctl(key, value) })
}

// HasLoAddress reports whether addr is on the node namespace's lo (Setup puts the router
// address there).
func (n Node) HasLoAddress(addr netip.Addr) (bool, error) {
	h, lo, err := n.lo()
	if err != nil {
		return false, err
	}
	defer h.Close()
	addrs, err := h.AddrList(lo, unix.AF_INET)
	if err != nil {
		return false, fmt.Errorf("listing node lo addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
			return true, nil
		}
	}
	return false, nil
}

// RemoveLoAddress removes addr/32 from the node namespace's lo (missing is not an error).
func (n Node) RemoveLoAddress(addr netip.Addr) error {
	h, lo, err := n.lo()
	if err != nil {
		return err
	}
	defer h.Close()
	a := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(addr, 32))}
	if err := h.AddrDel(lo, a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("removing %v from node lo: %w", addr, err)
	}
	return nil
}

// lo returns a netlink handle in the node namespace and its lo; the caller closes the
// handle.
func (n Node) lo() (*netlink.Handle, netlink.Link, error) {
	h, err := n.handle()
	if err != nil {
		return nil, nil, err
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		h.Close()
		return nil, nil, fmt.Errorf("finding node lo: %w", err)
	}
	return h, lo, nil
}
