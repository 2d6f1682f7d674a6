package egress

import (
	"context"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
)

// TestEmptyTCXFilter: the empty-hook filter attaches one program on each TCX hook of the
// client's host-side veth, where Rampart attaches its own, and removes both.
func TestEmptyTCXFilter(t *testing.T) {
	testenv.RequireRoot(t)
	cidrs := benchkit.PodCIDRs(2)
	world := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, cidrs[1].Addr().As4()[2], 0}), 24)
	topo, err := buildPlain("peers", "et"+benchkit.Suffix(), cidrs[0], world, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Error(err)
		}
	})
	f := &emptyTCXFilter{topo: topo}
	if _, err := f.Install(context.Background()); err != nil {
		t.Fatal(err)
	}
	info, err := f.prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	progID, _ := info.ID()
	// Links of this filter's program, on which interface (indexes are per namespace, so
	// the program tells them from other tests' links).
	attached := func() (n int, ifindexes []uint32) {
		t.Helper()
		it := link.Iterator{}
		defer it.Close()
		for it.Next() {
			l := it.Take() // a file descriptor of our own: closed at once, or it would keep the link
			li, err := l.Info()
			l.Close()
			if err != nil || li.Program != progID {
				continue
			}
			if tcx := li.TCX(); tcx != nil {
				n++
				ifindexes = append(ifindexes, tcx.Ifindex)
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return n, ifindexes
	}
	var veth int
	if err := endpoint.Do(topo.NodeNetns, func() error {
		l, err := netlink.LinkByName(topo.Client.HostIf)
		if err == nil {
			veth = l.Attrs().Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n, idx := attached(); n != 2 || idx[0] != uint32(veth) || idx[1] != uint32(veth) {
		t.Errorf("TCX links of the empty program: %d on %v, want 2 on the client's host-side veth (%d)", n, idx, veth)
	}
	if err := f.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, _ := attached(); n != 0 {
		t.Errorf("%d TCX links left after Remove", n)
	}
}
