package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	rnetns "github.com/rampartnet/rampart/internal/netns"
)

// The tc cls_bpf filters of AttachTC are identified by priority and handle, so the agent
// finds and replaces its own; the program names also identify Rampart's TCX links.
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
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE) // links, addresses, routes: one socket, not one per family
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
// network namespace at netnsPath ("" = the caller's): rampart_from_ep on its ingress and
// rampart_to_ep on its egress, as the Datapath's attach mode says (Config.Attach). Both
// modes outlive the process: tc filters live as long as the veth, TCX links are pinned.
// Attaching again (a restarted agent with freshly loaded programs) swaps the programs in
// place, atomically for the packet path: a cls_bpf filter is replaced (same parent,
// priority and handle) with the new program, a pinned TCX link is updated. Programs the
// other mode attached (an agent started with another --attach, or an earlier version's
// filters) are removed only once the new ones are on, so no packet meets the veth
// without a program. With both on, the TCX program runs first and its verdict (our
// programs return TC_ACT_OK or TC_ACT_SHOT, never TCX_NEXT) ends the hook: the cls_bpf
// filter does not see the packet (tested).
//
// Attach before ApplyEndpoint is safe: until the endpoint has its info, every packet on
// the interface is dropped. It returns the interface's index (0 on error).
func (d *Endpoints) Attach(netnsPath, ifname string) (uint32, error) {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return 0, fmt.Errorf("attaching to %s: %w", ifname, err)
	}
	defer h.Close()
	lnk, err := h.LinkByName(ifname)
	if err != nil {
		return 0, fmt.Errorf("attaching to %s: finding interface: %w", ifname, err)
	}
	idx := lnk.Attrs().Index
	if d.attach == AttachTCX {
		err = d.attachTCXLinks(netnsPath, h, lnk)
	} else {
		err = d.attachClsBPF(netnsPath, h, lnk)
	}
	if err != nil {
		return 0, fmt.Errorf("attaching to %s: %w", ifname, err)
	}
	d.mu.Lock()
	d.netns[uint32(idx)] = netnsPath
	d.mu.Unlock()
	return uint32(idx), nil
}

// attachClsBPF is Attach in AttachTC mode: a clsact qdisc and the two filters, replaced in
// place when they are there; then the TCX links of an agent that ran with AttachTCX are
// detached and their pins removed.
func (d *Endpoints) attachClsBPF(netnsPath string, h *netlink.Handle, lnk netlink.Link) error {
	idx := lnk.Attrs().Index
	if err := h.QdiscAdd(clsact(idx)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding clsact qdisc: %w", err)
	}
	// The kernel replaces a filter of the same parent, priority and handle atomically
	// (cls_bpf_change swaps the program under RCU).
	if err := h.FilterReplace(bpfFilter(idx, netlink.HANDLE_MIN_EGRESS, filterToEp, d.objs.RampartToEp)); err != nil {
		return fmt.Errorf("tc egress filter: %w", err)
	}
	if err := h.FilterReplace(bpfFilter(idx, netlink.HANDLE_MIN_INGRESS, filterFromEp, d.objs.RampartFromEp)); err != nil {
		return fmt.Errorf("tc ingress filter: %w", err)
	}
	err := rnetns.Do(netnsPath, func() error {
		return errors.Join(detachTCX(idx, ebpf.AttachTCXIngress, 0), detachTCX(idx, ebpf.AttachTCXEgress, 0))
	})
	if err != nil {
		return fmt.Errorf("detaching the TCX links of an earlier run: %w", err)
	}
	if err := d.removeLinkPins(idx); err != nil {
		return err
	}
	return nil
}

// attachTCXLinks is Attach in AttachTCX mode: pinned TCX links, updated in place when they
// are there; then the cls_bpf filters of an agent that ran with AttachTC (or an earlier
// version) are removed.
func (d *Endpoints) attachTCXLinks(netnsPath string, h *netlink.Handle, lnk netlink.Link) error {
	idx := lnk.Attrs().Index
	if err := os.MkdirAll(filepath.Join(d.pinDir, tcxPinDir), 0o700); err != nil {
		return err
	}
	// The link's interface index is resolved in the calling thread's namespace.
	err := rnetns.Do(netnsPath, func() error {
		for _, hk := range []tcxHook{
			{ebpf.AttachTCXEgress, "egress", d.objs.RampartToEp},
			{ebpf.AttachTCXIngress, "ingress", d.objs.RampartFromEp},
		} {
			if err := d.attachTCX(idx, hk); err != nil {
				return fmt.Errorf("TCX %s: %w", hk.dir, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := removeClsBPF(h, lnk); err != nil {
		return fmt.Errorf("removing the tc filters of an earlier run: %w", err)
	}
	return nil
}

// tcxPinDir is the pin directory's subdirectory of the TCX links, pinned as
// "<ifindex>-<ingress|egress>".
const tcxPinDir = "tcx"

type tcxHook struct {
	attach ebpf.AttachType
	dir    string
	prog   *ebpf.Program
}

func (d *Endpoints) tcxPin(ifindex int, dir string) string {
	return filepath.Join(d.pinDir, tcxPinDir, fmt.Sprintf("%d-%s", ifindex, dir))
}

// attachTCX puts hk's program on interface ifindex (of the calling thread's namespace):
// by updating the pinned link when it is there and still on this interface, else with a
// new pinned link. Any other Rampart program on the hook (a link whose pin was lost) is
// detached afterwards, so exactly one runs.
func (d *Endpoints) attachTCX(ifindex int, hk tcxHook) error {
	pin := d.tcxPin(ifindex, hk.dir)
	var keep link.ID
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		info, ierr := l.Info()
		if ierr == nil && info.TCX() != nil && int(info.TCX().Ifindex) == ifindex && l.Update(hk.prog) == nil {
			keep = info.ID
		} else {
			// Defunct (its interface is gone: this index is a new one) or elsewhere.
			_ = l.Unpin()
		}
		l.Close()
	}
	if keep == 0 {
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: hk.prog, Attach: hk.attach})
		if err != nil {
			return fmt.Errorf("attaching: %w", err)
		}
		defer l.Close()
		if err := l.Pin(pin); err != nil {
			return fmt.Errorf("pinning the link: %w", err) // closing it detaches it
		}
		info, err := l.Info()
		if err != nil {
			return fmt.Errorf("reading the link: %w", err)
		}
		keep = info.ID
	}
	return detachTCX(ifindex, hk.attach, keep)
}

// detachTCX detaches every Rampart program from the TCX hook attach of interface ifindex
// (of the calling thread's namespace) except the one of link keep.
func detachTCX(ifindex int, attach ebpf.AttachType, keep link.ID) error {
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: attach})
	if err != nil {
		return fmt.Errorf("listing the hook's programs: %w", err)
	}
	for _, ap := range res.Programs {
		id, ok := ap.LinkID()
		if !ok || id == keep || !rampartProgram(ap.ID) {
			continue
		}
		l, err := link.NewFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		err = l.Detach()
		l.Close()
		if err != nil {
			return fmt.Errorf("detaching link %d: %w", id, err)
		}
	}
	return nil
}

// rampartProgram says whether program id is one of the dataplane's hook programs.
func rampartProgram(id ebpf.ProgramID) bool {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return false
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return false
	}
	// The kernel keeps the first 15 characters of a program's name.
	return info.Name == filterFromEp || info.Name == filterToEp
}

// Detach removes the Rampart programs from ifname in the network namespace at netnsPath,
// whatever the mode that attached them: its TCX links, and its tc filters (with their
// clsact qdisc, when no other filter uses it). A missing interface or program is not an error (already
// detached). The links' pins, if any, are left to Endpoints.Detach (or to the removal of
// the pin directory); a detached link's pin holds nothing.
func Detach(netnsPath, ifname string) error {
	_, err := detach(netnsPath, ifname)
	return err
}

func detach(netnsPath, ifname string) (ifindex int, err error) {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return 0, fmt.Errorf("detaching from %s: %w", ifname, err)
	}
	defer h.Close()
	lnk, err := h.LinkByName(ifname)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return 0, nil
		}
		return 0, fmt.Errorf("detaching from %s: finding interface: %w", ifname, err)
	}
	idx := lnk.Attrs().Index
	err = rnetns.Do(netnsPath, func() error {
		return errors.Join(detachTCX(idx, ebpf.AttachTCXIngress, 0), detachTCX(idx, ebpf.AttachTCXEgress, 0))
	})
	if err != nil {
		return idx, fmt.Errorf("detaching from %s: %w", ifname, err)
	}
	if err := removeClsBPF(h, lnk); err != nil {
		return idx, fmt.Errorf("detaching from %s: %w", ifname, err)
	}
	return idx, nil
}

// clsact is interface idx's clsact qdisc, the parent of the tc filters.
func clsact(idx int) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: idx,
			Handle:    netlink.MakeHandle(0xffff, 0),
			Parent:    netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
}

// removeClsBPF removes Rampart's tc cls_bpf filters from lnk, and the clsact
// qdisc when no other filter uses it.
func removeClsBPF(h *netlink.Handle, lnk netlink.Link) error {
	idx := lnk.Attrs().Index
	for _, f := range []*netlink.BpfFilter{
		bpfFilter(idx, netlink.HANDLE_MIN_INGRESS, filterFromEp, nil),
		bpfFilter(idx, netlink.HANDLE_MIN_EGRESS, filterToEp, nil),
	} {
		if err := h.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("deleting filter %s: %w", f.Name, err)
		}
	}
	remaining := 0
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := h.FilterList(lnk, parent)
		if err != nil {
			// No clsact qdisc (never added, or removed): nothing left to clean up.
			return nil
		}
		remaining += len(fs)
	}
	if remaining == 0 {
		if err := h.QdiscDel(clsact(idx)); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("deleting clsact qdisc: %w", err)
		}
	}
	return nil
}

// Detach is Detach, and removes the interface's link pins too.
func (d *Endpoints) Detach(netnsPath, ifname string) error {
	idx, err := detach(netnsPath, ifname)
	if err != nil || idx == 0 {
		return err
	}
	if err := d.removeLinkPins(idx); err != nil {
		return fmt.Errorf("detaching from %s: %w", ifname, err)
	}
	return nil
}

// removeLinkPins removes the pins of interface ifindex's TCX links (none in AttachTC mode,
// unless an agent ran with AttachTCX before).
func (d *Endpoints) removeLinkPins(ifindex int) error {
	var errs []error
	for _, dir := range []string{"ingress", "egress"} {
		if err := os.Remove(d.tcxPin(ifindex, dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing link pin: %w", err))
		}
	}
	return errors.Join(errs...)
}

// ReleaseLinks forgets the interface ifindex of the node namespace once it is gone (its
// endpoint deleted): it removes the pins of its TCX links (AttachTCX), which the kernel
// detached when the interface went; tc filters went with the interface. Deleting the interface is how an endpoint's programs are removed:
// detaching them first would cost two RCU grace periods more, each with the RTNL lock
// held (kernel/bpf/tcx.c), for nothing. Call it only after the interface is deleted: a
// link whose interface still exists is detached when its last pin goes.
func (d *Endpoints) ReleaseLinks(ifindex uint32) error {
	err := d.removeLinkPins(int(ifindex))
	d.mu.Lock()
	delete(d.netns, ifindex)
	d.mu.Unlock()
	return err
}
