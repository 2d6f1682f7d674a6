package testenv

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Sniffer captures every frame that arrives on an interface of a namespace (an AF_PACKET
// socket, as a passive monitor such as Suricata reads one).
type Sniffer struct{ fd int }

// NewSniffer starts capturing on ifname in the namespace at nsPath; the socket closes
// when the test ends.
func NewSniffer(t testing.TB, nsPath, ifname string) *Sniffer {
	t.Helper()
	s := &Sniffer{fd: -1}
	all := int(ethPAll())
	err := InNetns(nsPath, func() error {
		link, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, all)
		if err != nil {
			return err
		}
		s.fd = fd
		// Room for a burst of GSO frames (up to 64 KiB each) between two reads.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: link.Attrs().Index, Protocol: ethPAll()})
	})
	if s.fd >= 0 {
		fd := s.fd
		t.Cleanup(func() { unix.Close(fd) })
	}
	if err != nil {
		t.Fatalf("sniffer on %s: %v", ifname, err)
	}
	return s
}

// ethPAll is ETH_P_ALL in network order, as AF_PACKET wants the protocol.
func ethPAll() uint16 {
	v := uint16(unix.ETH_P_ALL)
	return v<<8 | v>>8
}

// Frames returns the frames captured since the last call.
func (s *Sniffer) Frames(t testing.TB) [][]byte {
	t.Helper()
	var out [][]byte
	for {
		buf := make([]byte, 2048)
		n, _, err := unix.Recvfrom(s.fd, buf, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			return out
		}
		if err != nil {
			t.Fatalf("sniffer: %v", err)
		}
		out = append(out, buf[:n])
	}
}

// FD is the capture socket, for a reader of its own (a benchmark's).
func (s *Sniffer) FD() int { return s.fd }
