package datapath

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// fabricFilters names a pair of Rampart's filters on the node's own interfaces (not the
// endpoints' veths): the IP-in-IP overlay's and host policy's, each at a priority of its
// own on the same clsact qdisc.
type fabricFilters struct {
	what     string // for messages
	priority uint16
	names    [2]string
}

var (
	ipipFilters = fabricFilters{"the IP-in-IP overlay", fabricFilterPrio, [2]string{filterToIPIP, filterFromIPIP}}
	hostFilters = fabricFilters{"host policy", hostFilterPrio, [2]string{filterToHost, filterFromHost}}
)

// filter is the filter of program prog named name on interface idx's hook parent, at the
// pair's priority (handle 1): FilterReplace swaps its program in place.
func (ff fabricFilters) filter(idx int, parent uint32, name string, prog *ebpf.Program) *netlink.BpfFilter {
	f := bpfFilter(idx, parent, name, prog)
	f.Priority, f.Handle = ff.priority, 1
	return f
}

// detach removes the filters from every interface of the network namespace at netnsPath
// except those in keep, and returns the interfaces it removed them from.
func (ff fabricFilters) detach(netnsPath string, keep []string) ([]string, error) {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("detaching %s: %w", ff.what, err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("detaching %s: listing interfaces: %w", ff.what, err)
	}
	var done []string
	for _, lnk := range links {
		if slices.Contains(keep, lnk.Attrs().Name) {
			continue
		}
		removed, err := ff.detachLink(h, lnk)
		if err != nil {
			return done, err
		}
		if removed {
			done = append(done, lnk.Attrs().Name)
		}
	}
	return done, nil
}

// detachFrom removes the filters from the interface ifname, if it still exists.
func (ff fabricFilters) detachFrom(netnsPath, ifname string) error {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return fmt.Errorf("detaching %s: %w", ff.what, err)
	}
	defer h.Close()
	lnk, err := h.LinkByName(ifname)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil // gone, and its filters with it
		}
		return fmt.Errorf("detaching %s from %s: %w", ff.what, ifname, err)
	}
	_, err = ff.detachLink(h, lnk)
	return err
}

// detachLink removes the filters from lnk; a clsact qdisc left without filters is removed
// too, one that holds someone else's (or the other pair) stays.
func (ff fabricFilters) detachLink(h *netlink.Handle, lnk netlink.Link) (bool, error) {
	name, idx := lnk.Attrs().Name, lnk.Attrs().Index
	removed, others := false, false
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := h.FilterList(lnk, parent)
		if err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				continue // no clsact qdisc
			}
			return false, fmt.Errorf("detaching %s from %s: listing filters: %w", ff.what, name, err)
		}
		for _, f := range fs {
			bf, ok := f.(*netlink.BpfFilter)
			if !ok || bf.Priority != ff.priority || !slices.Contains(ff.names[:], bf.Name) {
				others = true
				continue
			}
			if err := h.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
				return false, fmt.Errorf("detaching %s from %s: %w", ff.what, name, err)
			}
			removed = true
		}
	}
	if removed && !others {
		if err := h.QdiscDel(clsact(idx)); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return removed, fmt.Errorf("detaching %s from %s: removing clsact qdisc: %w", ff.what, name, err)
		}
	}
	return removed, nil
}
