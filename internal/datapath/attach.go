package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// tc filter identity: the same priority and handle every time, so attaching again (for
// example by a restarted agent with freshly loaded programs) replaces the filter in place,
// without a moment with no filter.
const (
	filterPriority = 1
	filterHandle   = 1
	filterFromEp   = "rampart_from_ep"
	filterToEp     = "rampart_to_ep"
)

// netlinkHandle opens a netlink handle in the network namespace at netnsPath ("" = the
// caller's). Handles work on their own socket in that namespace, so no thread switches
// namespaces.
func netlinkHandle(netnsPath string) (*netlink.Handle, error) {
	if netnsPath == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("opening netlink handle: %w", err)
		}
		return h, nil
	}
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", netnsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("opening netlink handle in %s: %w", netnsPath, err)
	}
	return h, nil
}

// IfIndex returns the interface index of ifname in the network namespace at netnsPath
// ("" = the caller's): the key of the endpoint in ApplyEndpoint when ifname is the
// endpoint's host-side veth.
func IfIndex(netnsPath, ifname string) (uint32, error) {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	link, err := h.LinkByName(ifname)
	if err != nil {
		return 0, fmt.Errorf("finding interface %s: %w", ifname, err)
	}
	return uint32(link.Attrs().Index), nil
}

func bpfFilter(linkIndex int, parent uint32, name string, prog *ebpf.Program) *netlink.BpfFilter {
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: linkIndex,
			Parent:    parent,
			Handle:    filterHandle,
			Priority:  filterPriority,
			Protocol:  unix.ETH_P_ALL,
		},
		Name:         name,
		DirectAction: true,
		Fd:           -1,
	}
	if prog != nil {
		f.Fd = prog.FD()
	}
	return f
}

// Attach installs the programs on ifname, the host-side veth of an endpoint, in the
// network namespace at netnsPath ("" = the caller's): a clsact qdisc, rampart_from_ep at
// tc ingress and rampart_to_ep at tc egress, both direct-action. Existing Rampart filters
// are replaced in place. The filters stay after the process exits.
//
// Attach before ApplyEndpoint is safe: until the endpoint has its info, every packet on
// the interface is dropped.
func (d *Datapath) Attach(netnsPath, ifname string) error {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return fmt.Errorf("attaching to %s: %w", ifname, err)
	}
	defer h.Close()
	link, err := h.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("attaching to %s: finding interface: %w", ifname, err)
	}
	idx := link.Attrs().Index
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: idx,
			Handle:    netlink.MakeHandle(0xffff, 0),
			Parent:    netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
	if err := h.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("attaching to %s: adding clsact qdisc: %w", ifname, err)
	}
	// Each filter is replaced atomically by the kernel (same parent, priority and handle),
	// so a re-attach never leaves a hook without a program.
	if err := h.FilterReplace(bpfFilter(idx, netlink.HANDLE_MIN_EGRESS, filterToEp, d.objs.RampartToEp)); err != nil {
		return fmt.Errorf("attaching to %s: tc egress filter: %w", ifname, err)
	}
	if err := h.FilterReplace(bpfFilter(idx, netlink.HANDLE_MIN_INGRESS, filterFromEp, d.objs.RampartFromEp)); err != nil {
		return fmt.Errorf("attaching to %s: tc ingress filter: %w", ifname, err)
	}
	return nil
}

// Detach removes the Rampart filters from ifname in the network namespace at netnsPath,
// and the clsact qdisc when no other filter uses it. A missing interface or filter is not
// an error (already detached).
func Detach(netnsPath, ifname string) error {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return fmt.Errorf("detaching from %s: %w", ifname, err)
	}
	defer h.Close()
	link, err := h.LinkByName(ifname)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("detaching from %s: finding interface: %w", ifname, err)
	}
	idx := link.Attrs().Index
	for _, f := range []*netlink.BpfFilter{
		bpfFilter(idx, netlink.HANDLE_MIN_INGRESS, filterFromEp, nil),
		bpfFilter(idx, netlink.HANDLE_MIN_EGRESS, filterToEp, nil),
	} {
		if err := h.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("detaching from %s: deleting filter %s: %w", ifname, f.Name, err)
		}
	}
	remaining := 0
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := h.FilterList(link, parent)
		if err != nil {
			// No clsact qdisc (already removed): nothing left to clean up.
			return nil
		}
		remaining += len(fs)
	}
	if remaining == 0 {
		qdisc := &netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{
				LinkIndex: idx,
				Handle:    netlink.MakeHandle(0xffff, 0),
				Parent:    netlink.HANDLE_CLSACT,
			},
			QdiscType: "clsact",
		}
		if err := h.QdiscDel(qdisc); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("detaching from %s: deleting clsact qdisc: %w", ifname, err)
		}
	}
	return nil
}

// Detach is Detach for convenience on a Datapath.
func (d *Datapath) Detach(netnsPath, ifname string) error { return Detach(netnsPath, ifname) }
