package testenv

import (
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
)

// BPFFilterNames returns the names of the tc BPF filters on the ingress and egress of the
// interface ifname (h's namespace), sorted; none when it has no clsact qdisc.
func BPFFilterNames(t testing.TB, h *netlink.Handle, ifname string) []string {
	t.Helper()
	l, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatalf("finding %s: %v", ifname, err)
	}
	var names []string
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, _ := h.FilterList(l, parent) // an error: no clsact qdisc, so no filter
		for _, f := range fs {
			if bf, ok := f.(*netlink.BpfFilter); ok {
				names = append(names, bf.Name)
			}
		}
	}
	slices.Sort(names)
	return names
}
