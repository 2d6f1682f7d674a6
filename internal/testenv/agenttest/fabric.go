package agenttest

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
)

// LinkFabric joins the node namespaces of two agents with a veth, the fabric between
// nodes: addrA on a's side and addrB on b's, both in one /24. It returns once both ends
// are up. The veth is deleted when the test ends.
func LinkFabric(t testing.TB, a, b *Env, addrA, addrB netip.Addr) {
	t.Helper()
	pathA, pathB := endpoint.NetnsPath(a.Config.NodeNetns), endpoint.NetnsPath(b.Config.NodeNetns)
	nsA, err := netns.GetFromPath(pathA)
	if err != nil {
		t.Fatal(err)
	}
	defer nsA.Close()
	nsB, err := netns.GetFromPath(pathB)
	if err != nil {
		t.Fatal(err)
	}
	defer nsB.Close()
	hA, err := netlink.NewHandleAt(nsA)
	if err != nil {
		t.Fatal(err)
	}
	defer hA.Close()
	hB, err := netlink.NewHandleAt(nsB)
	if err != nil {
		t.Fatal(err)
	}
	defer hB.Close()
	suffix := testenv.Suffix(6)
	nameA, nameB := "rpf"+suffix, "rpg"+suffix
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nameA}, PeerName: nameB, PeerNamespace: netlink.NsFd(int(nsB))}
	if err := hA.LinkAdd(veth); err != nil {
		t.Fatalf("creating fabric veth: %v", err)
	}
	t.Cleanup(func() {
		// Runs before the agents' own clean-up (registered earlier), which deletes the
		// node namespaces and with them the veth; deleting it here covers namespaces
		// that outlive the agents.
		ns, err := netns.GetFromPath(pathA)
		if err != nil {
			return
		}
		defer ns.Close()
		h, err := netlink.NewHandleAt(ns)
		if err != nil {
			return
		}
		defer h.Close()
		if l, err := h.LinkByName(nameA); err == nil {
			h.LinkDel(l)
		}
	})
	sides := []struct {
		h    *netlink.Handle
		name string
		addr netip.Addr
	}{{hA, nameA, addrA}, {hB, nameB, addrB}}
	for _, side := range sides {
		l, err := side.h.LinkByName(side.name)
		if err != nil {
			t.Fatal(err)
		}
		if err := side.h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: side.addr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
			t.Fatalf("fabric address %v: %v", side.addr, err)
		}
		if err := side.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	// A veth end is operationally up only once its peer is up too.
	for _, side := range sides {
		if err := endpoint.WaitOperUp(side.h, side.name, 5*time.Second); err != nil {
			t.Fatal(fmt.Errorf("fabric: %w", err))
		}
	}
}
