package datapath

import (
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf/link"

	"github.com/rampartnet/rampart/internal/testenv"
)

// TestMapMemory: every pinned map is listed with the kernel's figures, pins of programs
// (and links, which the kernel opens the same way) beside them are skipped rather than
// failing the listing, and the maps the programs use unpinned are listed by the
// Datapath's MapMemory.
func TestMapMemory(t *testing.T) {
	d := openTest(t, Config{Attach: AttachTCX}) // for a link to pin
	// A program pin and a link pin in the directory, as the send-side verdict pins its
	// sockops link there (the kernel refuses to open a link pin read-only). The link: the
	// programs' TCX link on the loopback of a namespace of the test's, pinned again.
	if err := d.objs.RampartFromEp.Pin(filepath.Join(d.Pins.PinDir(), "a_program")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.objs.RampartFromEp.Unpin() })
	ns := testenv.NewNetns(t, "rpt-mem-"+testenv.Suffix(8))
	if _, err := d.Endpoints.Attach(ns, "lo"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Endpoints.Detach(ns, "lo") })
	tcx, err := filepath.Glob(filepath.Join(d.Pins.PinDir(), tcxPinDir, "*"))
	if err != nil || len(tcx) == 0 {
		t.Fatalf("no TCX link pins: %v", err)
	}
	l, err := link.LoadPinnedLink(tcx[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Pin(filepath.Join(d.Pins.PinDir(), "a_link")); err != nil {
		t.Fatal(err)
	}

	pinned, err := MapMemory(d.Pins.PinDir())
	if err != nil {
		t.Fatalf("MapMemory with a program pinned beside the maps: %v", err)
	}
	all, err := d.Pins.MapMemory()
	if err != nil {
		t.Fatal(err)
	}
	byName := func(us []MapUsage) map[string]MapUsage {
		out := map[string]MapUsage{}
		for _, u := range us {
			out[u.Name] = u
		}
		return out
	}
	p, a := byName(pinned), byName(all)
	if _, ok := p["a_program"]; ok {
		t.Error("the program pin is listed as a map")
	}
	if _, ok := p["a_link"]; ok {
		t.Error("the link pin is listed as a map")
	}
	for _, m := range d.allMaps() {
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		var found bool
		for _, u := range pinned {
			if u.ID == uint32(id) {
				found = true
				if u.Bytes == 0 && u.Type != "LPMTrie" {
					t.Errorf("%s: no memlock: %+v", m, u)
				}
			}
		}
		if !found {
			t.Errorf("pinned map %s not listed", m)
		}
	}
	ct := p["conntrack4_peer"]
	if ct.Type != "LRUHash" || ct.MaxEntries != d.objs.Conntrack4Peer.MaxEntries() || ct.Bytes < uint64(ct.MaxEntries)*40 {
		t.Errorf("conntrack: %+v", ct)
	}
	if fc, ok := a["flow_cache"]; !ok || fc.Type != "Array" || fc.Bytes == 0 {
		t.Errorf("the unpinned flow cache: %+v (listed: %v)", fc, ok)
	}
	if len(all) <= len(pinned) {
		t.Errorf("%d maps with the programs' own, %d pinned", len(all), len(pinned))
	}
}
