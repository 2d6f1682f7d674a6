package taps

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/monitor/suricata"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

const udpPort = 5353

// bigDatagram is a UDP payload larger than the endpoints' MTU (so it travels in IP
// fragments) with mark far enough in to be in a later fragment.
func bigDatagram(mark string) []byte {
	b := bytes.Repeat([]byte("x"), 4000)
	copy(b[3000:], mark)
	return b
}

// serveUDP starts an echo server on web's udpPort.
func (s *shop) serveUDP(t *testing.T) {
	t.Helper()
	srv, err := testenv.Serve(agenttest.NetnsPathOf(s.e.Config.Instance, "shop", "web"), nil, []uint16{udpPort})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
}

// sendUDP sends payload from the client to web's echo server and reports whether the
// whole datagram came back within timeout.
func (s *shop) sendUDP(t *testing.T, payload []byte, timeout time.Duration) bool {
	t.Helper()
	to := netip.AddrPortFrom(netip.MustParseAddr(s.web.IP), udpPort)
	c, err := testenv.Dial(agenttest.NetnsPathOf(s.e.Config.Instance, "shop", "client"), "udp", to, timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(payload); err != nil {
		t.Fatalf("sending a datagram: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 8192)
	n, err := c.Read(buf)
	return err == nil && bytes.Equal(buf[:n], payload)
}

// A datagram larger than the MTU travels in fragments; every fragment of a tapped one goes
// to the monitor, which reassembles it: a passive Suricata alerts on a mark in a later
// fragment, and an inline one keeps a datagram with the mark from web while a benign one
// is answered.
func TestFragmentsThroughSuricata(t *testing.T) {
	for name, mode := range map[string]suricata.Mode{"mirror": suricata.Passive, "redirect": suricata.IPS} {
		t.Run(name, func(t *testing.T) {
			s := newShop(t)
			s.serveUDP(t)
			verb, action, sid := "alert", "mirror", 1000011
			if mode == suricata.IPS {
				verb, action, sid = "drop", "redirect", 1000012
			}
			m := s.monitor(t, mode, fmt.Sprintf(`%s udp any any -> any %d (msg:"%s"; content:"%s"; sid:%d; rev:1;)`, verb, udpPort, attack, attack, sid))
			s.e.MustCLI("tap", "add", "web-udp", "--endpoint", "shop/web", "--monitor", "sec/ids", "--action", action,
				"--direction", "ingress", "--protocol", "UDP", "--port", fmt.Sprint(udpPort))

			if !testenv.Eventually(10*time.Second, func() bool { return s.sendUDP(t, bigDatagram("benign"), time.Second) }) {
				t.Fatalf("a benign fragmented datagram is not answered through the %s tap", action)
			}
			answered := s.sendUDP(t, bigDatagram(attack), 2*time.Second)
			if mode == suricata.IPS && answered {
				t.Error("a fragmented datagram with the mark passed the inline monitor")
			}
			if mode == suricata.Passive && !answered {
				t.Error("a fragmented datagram was not answered through the mirror")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, _, err := m.WaitEvent(ctx, func(e suricata.Event) bool {
				return e.Alert != nil && e.Alert.SignatureID == sid
			}); err != nil {
				t.Fatalf("no alert for the mark in a later fragment: %v", err)
			}
			tp := s.tap(t, "web-udp")
			got := tp.Counters.MirroredPackets + tp.Counters.RedirectedPackets
			// Two datagrams of three fragments each (4,008 bytes at a 1,500-byte MTU), at least.
			if got < 6 || tp.Counters.CopiesLost != 0 {
				t.Errorf("counters %+v: want every fragment tapped", tp.Counters)
			}
		})
	}
}
