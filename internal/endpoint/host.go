package endpoint

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NodeSysctls are the settings Setup makes in the node namespace, key (under /proc/sys)
// to value; NodeSysctls6 those it makes too on a dual-stack node. An agent records their
// previous values (Node.Sysctls) so that uninstall can restore them.
var (
	NodeSysctls  = map[string]string{"net/ipv4/ip_forward": "1"}
	NodeSysctls6 = map[string]string{"net/ipv6/conf/all/forwarding": "1"}
)

// Sysctls are the settings Setup makes in n's node namespace: NodeSysctls, and on a
// dual-stack node NodeSysctls6.
func (n Node) Sysctls() map[string]string {
	if !n.DualStack() {
		return NodeSysctls
	}
	out := maps.Clone(NodeSysctls)
	maps.Copy(out, NodeSysctls6)
	return out
}

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
// addresses there).
func (n Node) HasLoAddress(addr netip.Addr) (bool, error) {
	h, lo, err := n.lo()
	if err != nil {
		return false, err
	}
	defer h.Close()
	addrs, err := h.AddrList(lo, unix.AF_UNSPEC)
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

// RemoveLoAddress removes addr (a /32 or /128) from the node namespace's lo (missing is
// not an error).
func (n Node) RemoveLoAddress(addr netip.Addr) error {
	h, lo, err := n.lo()
	if err != nil {
		return err
	}
	defer h.Close()
	a := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(addr, addr.BitLen()))}
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
