package endpoint

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	rnetns "github.com/rampartnet/rampart/internal/netns"
)

// NetnsDir is where named network namespaces are bind-mounted, as iproute2 does.
const NetnsDir = "/run/netns"

// NetnsPath returns the path of the named network namespace.
func NetnsPath(name string) string { return filepath.Join(NetnsDir, name) }

// Do runs fn on a dedicated OS thread switched into the network namespace at nsPath
// (netns.Do).
func Do(nsPath string, fn func() error) error { return rnetns.Do(nsPath, fn) }

// ensureNetnsDir creates /run/netns as a shared mount point, as `ip netns add` does, so
// namespaces mounted there are visible in mount namespaces created later.
func ensureNetnsDir() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", NetnsDir, err)
	}
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("making %s shared: %w", NetnsDir, err)
	}
	// Not a mount point yet: bind it onto itself first.
	if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s: %w", NetnsDir, err)
	}
	if err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s shared: %w", NetnsDir, err)
	}
	return nil
}

// ErrNetnsExists is returned by CreateNetns when the name is taken.
var ErrNetnsExists = errors.New("network namespace already exists")

// CreateNetns creates a new network namespace bind-mounted at /run/netns/name and returns
// its path. Loopback is left down; callers configure it through a netlink handle.
func CreateNetns(name string) (string, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return "", fmt.Errorf("invalid network namespace name %q", name)
	}
	if err := ensureNetnsDir(); err != nil {
		return "", err
	}
	path := NetnsPath(name)
	if err := rnetns.Create(path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("%s: %w", path, ErrNetnsExists)
		}
		return "", err
	}
	return path, nil
}

// DeleteNetns unmounts and removes a named network namespace. A missing one is not an error.
func DeleteNetns(name string) error {
	path := NetnsPath(name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}

// NetnsExists reports whether /run/netns/name is a mounted network namespace.
func NetnsExists(name string) bool { return IsNetns(NetnsPath(name)) }

// IsNetns reports whether path is a network namespace (a bind mount of one, or a
// /proc/PID/ns/net link).
func IsNetns(path string) bool {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return false
	}
	defer h.Close()
	// An unmounted leftover file is not a namespace: compare with our own namespace's type.
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(h), &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// writeSysctl writes /proc/sys/key (key written with slashes, e.g. net/ipv4/ip_forward);
// call it inside Do so it hits that namespace.
func writeSysctl(key, value string) error {
	p := filepath.Join("/proc/sys", key)
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting %s: %w", key, err)
	}
	return nil
}

// ErrNotPodNetns is returned when a runtime names a network namespace that is not a new
// pod's: putting a pod interface, address and default route there would change a node's,
// the host's or another pod's network.
var ErrNotPodNetns = errors.New("not a new pod network namespace")

// checkPodNetns refuses a runtime's namespace (pod is a handle in it) that is the node
// namespace, the agent's own or the host's, or that is already in use: an interface
// other than lo is up, or it has a default route. A runtime's new sandbox has neither
// (the kernel's fallback tunnel devices, tunl0 and the like, are down), while every
// node, the host and every pod Rampart or another plugin has set up has both.
func (n Node) checkPodNetns(pod *netlink.Handle, path string) error {
	id, err := rnetns.Identify(path)
	if err != nil {
		return err
	}
	if nid, err := rnetns.Identify(n.NetnsPath()); err == nil && nid == id {
		return fmt.Errorf("network namespace %s is the node's network namespace: %w", path, ErrNotPodNetns)
	}
	what, err := rnetns.Reserved(path)
	if err != nil {
		return err
	}
	if what != "" {
		return fmt.Errorf("network namespace %s is %s: %w", path, what, ErrNotPodNetns)
	}
	links, err := pod.LinkList()
	if err != nil {
		return fmt.Errorf("listing interfaces in %s: %w", path, err)
	}
	for _, l := range links {
		if l.Attrs().Flags&net.FlagLoopback == 0 && l.Attrs().Flags&net.FlagUp != 0 {
			return fmt.Errorf("network namespace %s has interface %s up already (another pod's, a node's or the host's?): %w", path, l.Attrs().Name, ErrNotPodNetns)
		}
	}
	routes, err := pod.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("listing routes in %s: %w", path, err)
	}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask) {
			return fmt.Errorf("network namespace %s has a default route already (another pod's, a node's or the host's?): %w", path, ErrNotPodNetns)
		}
	}
	return nil
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}
