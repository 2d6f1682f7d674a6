package datapath

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/testenv"
)

// TestProgRunIfindex shows how fixtures choose skb->ifindex: BPF_PROG_RUN takes it from the
// ifindex field of the __sk_buff context, looked up in the caller's network namespace (so
// the device must exist there); without a context the packet is on loopback (ifindex 1).
func TestProgRunIfindex(t *testing.T) {
	d := openTest(t, Config{})
	suffix := testenv.Suffix(8)
	nsPath := testenv.NewNetns(t, "rpt-"+suffix+"-ifx")
	h := nlHandle(t, nsPath)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "v0"}, PeerName: "v1"}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	l0, err := h.LinkByName("v0")
	if err != nil {
		t.Fatal(err)
	}
	l1, err := h.LinkByName("v1")
	if err != nil {
		t.Fatal(err)
	}
	if0, if1 := uint32(l0.Attrs().Index), uint32(l1.Attrs().Index)
	if got, err := IfIndex(nsPath, "v0"); err != nil || got != if0 {
		t.Fatalf("IfIndex: %d, %v; want %d", got, err, if0)
	}
	if err := d.Endpoints.ApplyEndpoint(if0, EndpointInfo{EpID: 3, Identity: epIdent, Addr: epIP}, mapstate.EndpointPolicy{}); err != nil {
		t.Fatal(err)
	}
	ev := eventsOf(t, d)
	data := packet{src: ipA, dst: epIP, proto: uint8(tcp), sport: 1, dport: 80, tcpFlags: 0x02}.bytes()

	var r0, r1, rlo uint32
	err = testenv.InNetns(nsPath, func() error {
		r0 = run(t, d.objs.RampartToEp, data, if0)
		r1 = run(t, d.objs.RampartToEp, data, if1)
		rlo = run(t, d.objs.RampartToEp, data, 0)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if r0 != actOK {
		t.Errorf("on the endpoint's interface: verdict %d, want pass", r0)
	}
	nextEvent(t, ev) // new flow on if0
	for name, r := range map[string]uint32{"peer interface": r1, "loopback": rlo} {
		if r != actShot {
			t.Errorf("%s: verdict %d, want drop", name, r)
		}
	}
	for _, want := range []uint32{if1, 1} {
		e := nextEvent(t, ev)
		if e.Reason != flow.ReasonUnknownEndpoint || e.IfIndex != want || e.EpID != 0 {
			t.Errorf("event %+v, want unknown-endpoint on ifindex %d", e, want)
		}
	}
}
