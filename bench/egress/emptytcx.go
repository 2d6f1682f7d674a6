package egress

import (
	"context"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/endpoint"
)

// emptyTCXFilter attaches programs that only return TC_ACT_OK where Rampart attaches its
// own: TCX ingress and egress of the client's host-side veth, in the node namespace. It
// blocks nothing (it is measured like the A/A control, with no set-up probe); its ratios
// are what the two hooks and two program runs per round trip cost before any work, the
// floor under any tc program at Rampart's place.
type emptyTCXFilter struct {
	topo  *topology
	prog  *ebpf.Program
	links []link.Link
}

func (f *emptyTCXFilter) Name() string        { return FilterEmptyTCX }
func (f *emptyTCXFilter) Topology() *topology { return f.topo }
func (f *emptyTCXFilter) Prepare(context.Context, List, string, string) error {
	return nil
}

func (f *emptyTCXFilter) Install(ctx context.Context) (install, error) {
	in := install{Entries: -1}
	var err error
	if f.prog, err = loadEmptyTC(); err != nil {
		return in, err
	}
	err = endpoint.Do(f.topo.NodeNetns, func() error {
		veth, err := netlink.LinkByName(f.topo.Client.HostIf)
		if err != nil {
			return err
		}
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			l, err := link.AttachTCX(link.TCXOptions{Interface: veth.Attrs().Index, Program: f.prog, Attach: at})
			if err != nil {
				return err
			}
			f.links = append(f.links, l)
		}
		return nil
	})
	if err != nil {
		return in, fmt.Errorf("attaching the empty program to %s: %w", f.topo.Client.HostIf, err)
	}
	return in, nil
}

func (f *emptyTCXFilter) Remove(ctx context.Context) error {
	var errs []error
	for _, l := range f.links {
		errs = append(errs, l.Close())
	}
	f.links = nil
	if f.prog != nil {
		errs = append(errs, f.prog.Close())
		f.prog = nil
	}
	return errors.Join(errs...)
}

func (f *emptyTCXFilter) Version(ctx context.Context) string {
	return "two programs returning TC_ACT_OK (TCX ingress and egress of the client's host-side veth), cilium/ebpf"
}

// loadEmptyTC loads a tc program that only returns TC_ACT_OK (named empty_tcx).
func loadEmptyTC() (*ebpf.Program, error) {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "empty_tcx", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}, // TC_ACT_OK
	})
	if err != nil {
		return nil, fmt.Errorf("loading the empty program: %w", err)
	}
	return p, nil
}
