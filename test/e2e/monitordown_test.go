package e2e

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// A monitor is up while something reads its receive interface. a's egress to b:80 is
// mirrored to monitor s, and c's redirected through it (fail closed). While a reader has
// a packet socket on s's tap-rx, a's copies count as mirrored; once the reader is gone
// (its socket closed, as when its process dies) status and both contracts say s is down,
// a's copies count as lost (not mirrored) and c's packets as dropped with the monitor
// unavailable (not redirected into an interface nothing reads); with a reader again, s
// is up and copies count as mirrored again.
func TestTapMonitorNotReading(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{})
	e.AddEndpoint("app", "a", map[string]string{"pod": "a"})
	b := e.AddEndpoint("app", "b", map[string]string{"pod": "b"})
	e.AddEndpoint("app", "c", map[string]string{"pod": "c"})
	s := e.AddEndpoint("sec", "s", nil, "--monitor")
	bIP := netip.MustParseAddr(b.IP)
	stop := readMonitor(t, s.Netns)
	e.MustCLI("tap", "add", "a-copy", "--endpoint", "app/a", "--monitor", "sec/s",
		"--action", "mirror", "--direction", "egress", "--protocol", "TCP", "--peer-port", "80")
	e.MustCLI("tap", "add", "c-inline", "--endpoint", "app/c", "--monitor", "sec/s",
		"--action", "redirect", "--direction", "egress", "--protocol", "TCP", "--peer-port", "80")

	if !e.Probe("app/a", bIP, 80, "tcp", 3*time.Second) {
		t.Fatal("a -> b:80 with a reading monitor")
	}
	up := tapOf(t, e, "a-copy")
	if up.MonitorProblem != "" || up.Counters.MirroredPackets == 0 || up.Counters.CopiesLost != 0 {
		t.Fatalf("reading monitor: problem %q, counters %+v: want none, copies mirrored, none lost", up.MonitorProblem, up.Counters)
	}

	stop()
	if !testenv.Eventually(10*time.Second, func() bool {
		return strings.Contains(tapOf(t, e, "a-copy").MonitorProblem, endpoint.NotReadingProblem)
	}) {
		t.Fatalf("monitor without a reader: contract a-copy says %q, want %q", tapOf(t, e, "a-copy").MonitorProblem, endpoint.NotReadingProblem)
	}
	if p := tapOf(t, e, "c-inline").MonitorProblem; !strings.Contains(p, endpoint.NotReadingProblem) {
		t.Errorf("monitor without a reader: contract c-inline says %q", p)
	}
	st, err := e.Client.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if m := st.Monitors; m == nil || len(m.Down) != 1 || !strings.HasPrefix(m.Down[0], "sec/s: ") {
		t.Errorf("status of a monitor without a reader: %+v, want sec/s down", m)
	}
	// Read now: the first connection's last packets may have been copied after up.
	before := tapOf(t, e, "a-copy")
	if !e.Probe("app/a", bIP, 80, "tcp", 3*time.Second) {
		t.Fatal("a -> b:80: a mirror's dead monitor must not stop the original")
	}
	down := tapOf(t, e, "a-copy")
	if down.Counters.MirroredPackets != before.Counters.MirroredPackets || down.Counters.CopiesLost <= before.Counters.CopiesLost {
		t.Errorf("copies to a monitor without a reader: counters %+v after %+v: want them lost, not mirrored", down.Counters, before.Counters)
	}
	if e.Probe("app/c", bIP, 80, "tcp", time.Second) {
		t.Errorf("c -> b:80 passed a redirect whose monitor does not read")
	}
	if in := tapOf(t, e, "c-inline"); in.Counters.RedirectedPackets != 0 || in.Counters.DroppedUnavailable == 0 {
		t.Errorf("redirect to a monitor without a reader: counters %+v: want dropped (unavailable), none redirected", in.Counters)
	}

	readMonitor(t, s.Netns)
	if !testenv.Eventually(10*time.Second, func() bool { return tapOf(t, e, "a-copy").MonitorProblem == "" }) {
		t.Fatalf("monitor reading again: contract says %q", tapOf(t, e, "a-copy").MonitorProblem)
	}
	if !e.Probe("app/a", bIP, 80, "tcp", 3*time.Second) {
		t.Fatal("a -> b:80 with the monitor reading again")
	}
	if again := tapOf(t, e, "a-copy"); again.Counters.MirroredPackets <= down.Counters.MirroredPackets {
		t.Errorf("monitor reading again: counters %+v after %+v: want copies mirrored again", again.Counters, down.Counters)
	}
	if st, err := e.Client.Status(t.Context()); err != nil || st.Monitors == nil || len(st.Monitors.Down) != 0 {
		t.Errorf("status with the monitor reading again: %+v, %v", st.Monitors, err)
	}
}

// readMonitor opens a packet socket on tap-rx in the monitor's namespace at nsPath, as an
// IDS capturing there does; the function it returns closes it (as the IDS's death would),
// and so does the test's end.
func readMonitor(t *testing.T, nsPath string) (stop func()) {
	t.Helper()
	proto := uint16(unix.ETH_P_ALL<<8&0xff00 | unix.ETH_P_ALL>>8)
	fd := -1
	err := testenv.InNetns(nsPath, func() error {
		l, err := netlink.LinkByName(endpoint.MonitorRxIfName)
		if err != nil {
			return err
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto)); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Protocol: proto})
	})
	closed := false
	stop = func() {
		if !closed && fd >= 0 {
			unix.Close(fd)
		}
		closed = true
	}
	t.Cleanup(stop)
	if err != nil {
		stop()
		t.Fatalf("reading %s in %s: %v", endpoint.MonitorRxIfName, nsPath, err)
	}
	return stop
}

// A monitor on another node is checked by its own node: while nothing reads it there, the
// copies a's node sends it are refused on arrival and counted lost by the monitor's node
// (copiesFromOtherNodesLost), not handed to an interface nothing reads; with a reader
// again they are delivered.
func TestTapRemoteMonitorNotReading(t *testing.T) {
	c := startThreeNodes(t, overlay.VXLAN, overlay.UnderlayIPv4)
	c.add(t, 0, "app", "a")
	b := c.add(t, 0, "app", "b")
	s := c.add(t, 2, "sec", "s", "--monitor")
	bIP := netip.MustParseAddr(b.IP)
	stop := readMonitor(t, s.Netns)
	c.n[0].MustCLI("tap", "add", "a-copy", "--endpoint", "app/a", "--monitor", "sec/s",
		"--action", "mirror", "--direction", "egress", "--protocol", "TCP", "--peer-port", "80")
	remote := func() (delivered, lost uint64) {
		t.Helper()
		st, err := c.n[2].Client.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if st.Monitors == nil {
			return 0, 0
		}
		return st.Monitors.CopiesFromOtherNodes, st.Monitors.CopiesFromOtherNodesLost
	}
	probe := func(what string) (delivered, lost uint64) {
		t.Helper()
		d0, l0 := remote()
		if !c.n[0].Probe("app/a", bIP, 80, "tcp", 3*time.Second) {
			t.Fatalf("%s: a -> b:80", what)
		}
		// The copies cross the tunnel after the probe's packets: wait for them to count.
		testenv.Eventually(3*time.Second, func() bool { d, l := remote(); return d+l > d0+l0 })
		d, l := remote()
		return d - d0, l - l0
	}
	if d, l := probe("reading"); d == 0 || l != 0 {
		t.Fatalf("remote monitor reading: %d copies delivered, %d lost; want delivered, none lost", d, l)
	}
	stop()
	if !testenv.Eventually(10*time.Second, func() bool {
		st, err := c.n[2].Client.Status(t.Context())
		return err == nil && st.Monitors != nil && len(st.Monitors.Down) == 1
	}) {
		t.Fatal("node 3 does not show sec/s down without a reader")
	}
	if d, l := probe("not reading"); d != 0 || l == 0 {
		t.Errorf("remote monitor not reading: %d copies delivered, %d lost; want none delivered, lost counted", d, l)
	}
	readMonitor(t, s.Netns)
	if !testenv.Eventually(10*time.Second, func() bool {
		st, err := c.n[2].Client.Status(t.Context())
		return err == nil && st.Monitors != nil && len(st.Monitors.Down) == 0
	}) {
		t.Fatal("node 3 still shows sec/s down with a reader")
	}
	if d, l := probe("reading again"); d == 0 || l != 0 {
		t.Errorf("remote monitor reading again: %d copies delivered, %d lost; want delivered, none lost", d, l)
	}
}
