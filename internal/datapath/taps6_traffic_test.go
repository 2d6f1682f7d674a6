package datapath

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/testenv"
)

// tapCIDR6 is the IPv6 pod range of the dual-stack tap world.
var tapCIDR6 = netip.MustParsePrefix("2001:2:60::/64")

// rules6 is rules with the peer b by its IPv6 address: the same taps, for IPv6 packets only.
func (w *tapWorld) rules6(action TapAction, up, failOpen bool) []TapRule {
	rs := w.rules(action, up, failOpen)
	for i := range rs {
		if rs[i].Destination.IsValid() {
			rs[i].Destination = netip.PrefixFrom(w.b.IP6, 128)
		}
		if rs[i].Source.IsValid() {
			rs[i].Source = netip.PrefixFrom(w.b.IP6, 128)
		}
	}
	return rs
}

// TestTapIPv6Traffic: on a dual-stack node, taps work for IPv6 as for IPv4. A mirror with no
// address copies a's connections to b's port over both families; one by b's IPv6 address
// copies only the IPv6 one, every copy the flow's own. A redirect sends a's IPv6 connection
// through an inline monitor (tc mirred) and b sees it come from a with a's identity; when
// the monitor drops, or is marked down, the connection fails (closed), with its drop event;
// a packet the monitor injects is dropped as not diverted.
func TestTapIPv6Traffic(t *testing.T) {
	w := newTapWorldOf(t, Config{}, tapCIDR6)

	// By b's IPv6 address: only the IPv6 connection, every copy of it.
	w.replace(w.rules6(TapMirror, true, false))
	capt := testenv.NewSniffer(t, w.s.NetnsPath, endpoint.MonitorRxIfName)
	if err := w.converseAt(w.b.IP, tapPort, 3, 5*time.Second); err != nil {
		t.Fatalf("IPv4 connection: %v", err)
	}
	if err := w.converseAt(w.b.IP6, tapPort, 10, 5*time.Second); err != nil {
		t.Fatalf("mirrored IPv6 connection: %v", err)
	}
	if err := w.converseAt(w.b.IP6, tapPort+1, 3, 5*time.Second); err != nil {
		t.Fatalf("untapped IPv6 connection: %v", err)
	}
	var c TapCounters
	var frames [][]byte
	eventually(t, 5*time.Second, "monitor read every IPv6 copy", func() bool {
		frames = append(frames, capt.Frames(t)...)
		c = w.counters()
		return c.MirroredPackets > 0 && uint64(len(frames)) >= c.MirroredPackets
	})
	frames = append(frames, capt.Frames(t)...)
	if uint64(len(frames)) != c.MirroredPackets || c.CopiesLost != 0 || len(frames) < 12 {
		t.Errorf("monitor read %d frames; counters %+v: want every copy, at least 12", len(frames), c)
	}
	for i, f := range frames {
		src, dst, proto, _, dport, ok := frameTuple(f)
		if !ok || src != w.a.IP6 || dst != w.b.IP6 || proto != unix.IPPROTO_TCP || dport != tapPort {
			t.Errorf("frame %d: %v -> %v proto %d port %d: not the tapped flow", i, src, dst, proto, dport)
		}
	}
	nf := waitEvent(t, w.ev, "IPv6 new flow at a", func(e flow.Event) bool {
		return e.Type == flow.EventNew && e.EpID == tapEpA && e.Destination == w.b.IP6 && e.DestinationPort == tapPort
	})
	if !nf.Flags.Has(flow.FlagTapped) {
		t.Errorf("new flow event of the mirrored IPv6 flow: %+v, want flag tapped", nf)
	}

	// A mirror with no address: both families.
	all := w.rules(TapMirror, true, false)
	all[0].Destination = netip.Prefix{}
	w.replace(all)
	if err := w.converseAt(w.b.IP, tapPort, 3, 5*time.Second); err != nil {
		t.Fatalf("IPv4 connection: %v", err)
	}
	if err := w.converseAt(w.b.IP6, tapPort, 3, 5*time.Second); err != nil {
		t.Fatalf("IPv6 connection: %v", err)
	}
	eventually(t, 5*time.Second, "monitor read copies of both families", func() bool {
		var v4, v6 bool
		for _, f := range capt.Frames(t) {
			if src, _, _, _, _, ok := frameTuple(f); ok {
				v4, v6 = v4 || src == w.a.IP, v6 || src == w.a.IP6
			}
		}
		return v4 && v6
	})

	// Redirect through an inline monitor.
	sh, _, _, ips := w.inlineMonitor()
	w.replace(w.rules6(TapRedirect, true, false))
	if err := w.converseAt(w.b.IP6, tapPort, 10, 5*time.Second); err != nil {
		t.Fatalf("IPv6 connection through the monitor: %v", err)
	}
	eventually(t, 5*time.Second, "diverted IPv6 packets returned", func() bool {
		c = w.counters()
		return c.RedirectedPackets >= 20 && c.ReturnedPackets == c.RedirectedPackets
	})
	// b has no taps: only a flow back from the monitor is flagged tapped at b.
	nb := waitEvent(t, w.ev, "IPv6 new flow at b, back from the monitor", func(e flow.Event) bool {
		return e.Type == flow.EventNew && e.EpID == tapEpB && e.Source == w.a.IP6 && e.DestinationPort == tapPort && e.Flags.Has(flow.FlagTapped)
	})
	if nb.SrcIdentity != tapIDA {
		t.Errorf("new flow at b: %+v, want identity %d", nb, tapIDA)
	}
	// The IPv4 connection to the same port is not diverted by the IPv6 rules: none of its
	// packets enters the monitor (a diverted one would have before the connection was
	// made; the counters still take the IPv6 connection's last packets).
	capt.Frames(t)
	if err := w.converseAt(w.b.IP, tapPort, 3, 5*time.Second); err != nil {
		t.Fatalf("IPv4 connection: %v", err)
	}
	for _, f := range capt.Frames(t) {
		if src, _, _, _, _, ok := frameTuple(f); ok && src.Is4() {
			t.Errorf("IPv4 packet from %v entered the monitor under IPv6 rules", src)
		}
	}

	// A packet the monitor injects: dropped at its return interface.
	r0, err := w.d.Taps.TapCounters(0)
	if err != nil {
		t.Fatal(err)
	}
	syn := packet6{src: w.a.IP6, dst: w.b.IP6, proto: unix.IPPROTO_TCP, sport: 40999, dport: tapPort + 1, tcpFlags: 0x02}
	sendRaw(t, w.s.NetnsPath, endpoint.MonitorTxIfName, unix.ETH_P_IPV6, syn.ip6())
	inj := waitEvent(t, w.ev, "injected IPv6 packet dropped", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.Reason == flow.ReasonTapNotDiverted && e.Source == w.a.IP6
	})
	if inj.DestinationPort != tapPort+1 || inj.EpID != tapEpS {
		t.Errorf("injected packet's drop event: %+v", inj)
	}
	if r1, err := w.d.Taps.TapCounters(0); err != nil || r1[0].Rejected != r0[0].Rejected+1 {
		t.Errorf("rejected: %+v, before %+v (%v)", r1[0], r0[0], err)
	}

	// The monitor drops everything: the connection cannot be made.
	if err := sh.FilterDel(ips); err != nil {
		t.Fatal(err)
	}
	if err := w.converseAt(w.b.IP6, tapPort, 1, time.Second); err == nil {
		t.Fatal("IPv6 connection made while the monitor drops everything")
	}
	// The monitor is marked down: fail closed, with the event.
	w.replace(w.rules6(TapRedirect, false, false))
	if err := w.converseAt(w.b.IP6, tapPort, 1, time.Second); err == nil {
		t.Error("IPv6 connection made with the monitor down")
	}
	drop := waitEvent(t, w.ev, "IPv6 tap-monitor-unavailable drop", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.Reason == flow.ReasonTapMonitorUnavailable && e.Source == w.a.IP6
	})
	if drop.EpID != tapEpA || drop.SrcIdentity != tapIDA || drop.DstIdentity != tapIDB || !drop.Flags.Has(flow.FlagTapped) {
		t.Errorf("fail-closed drop event: %+v", drop)
	}
	// Fail open: it passes untapped.
	w.replace(w.rules6(TapRedirect, false, true))
	if err := w.converseAt(w.b.IP6, tapPort, 2, 5*time.Second); err != nil {
		t.Errorf("fail-open IPv6 connection: %v", err)
	}
}
