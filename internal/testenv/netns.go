package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	rnetns "github.com/rampartnet/rampart/internal/netns"
)

// InNetns runs fn on a locked OS thread switched into the network namespace at nsPath
// (internal/netns.Do). Sockets that fn creates stay in that namespace after it returns.
func InNetns(nsPath string, fn func() error) error {
	return rnetns.Do(nsPath, fn)
}

// NewNetns creates the named network namespace (bind-mounted under /run/netns, loopback
// down as the kernel makes it) and deletes it when the test ends, which also destroys the
// interfaces inside it. It returns the namespace's path. Name it with Suffix.
func NewNetns(t testing.TB, name string) string {
	t.Helper()
	if err := os.MkdirAll("/run/netns", 0o755); err != nil {
		t.Fatalf("creating network namespace %s: %v", name, err)
	}
	path := filepath.Join("/run/netns", name)
	if err := rnetns.Create(path); err != nil {
		t.Fatalf("creating network namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if rerr := os.Remove(path); err == nil {
			err = rerr
		}
		if err != nil {
			t.Errorf("deleting network namespace %s: %v", name, err)
		}
	})
	return path
}

// NetlinkHandle returns a netlink handle into the network namespace at nsPath, closed
// when the test ends.
func NetlinkHandle(t testing.TB, nsPath string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatalf("opening network namespace %s: %v", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", nsPath, err)
	}
	t.Cleanup(h.Close)
	return h
}

// Servers are TCP and UDP echo servers listening inside one network namespace.
type Servers struct {
	listeners []net.Listener
	conns     []net.PacketConn
	wg        sync.WaitGroup
	mu        sync.Mutex
	accepted  []net.Conn
	closed    bool
}

// Serve starts echo servers in the namespace at nsPath on every port in tcp and udp
// (listening on all addresses, IPv4 and IPv6). TCP servers echo each line back; UDP servers echo each
// datagram. Close stops them.
func Serve(nsPath string, tcp, udp []uint16) (*Servers, error) {
	s := &Servers{}
	err := InNetns(nsPath, func() error {
		// A socket per family (tcp6 and udp6 are IPv6 only), so that an IPv4 peer is
		// answered from an IPv4 socket as before, and a dual-stack one on both.
		for _, p := range tcp {
			for _, network := range []string{"tcp4", "tcp6"} {
				l, err := net.Listen(network, fmt.Sprintf(":%d", p))
				if err != nil {
					return fmt.Errorf("listening on %s/%d: %w", network, p, err)
				}
				s.listeners = append(s.listeners, l)
			}
		}
		for _, p := range udp {
			for _, network := range []string{"udp4", "udp6"} {
				c, err := net.ListenPacket(network, fmt.Sprintf(":%d", p))
				if err != nil {
					return fmt.Errorf("listening on %s/%d: %w", network, p, err)
				}
				s.conns = append(s.conns, c)
			}
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	for _, l := range s.listeners {
		s.wg.Add(1)
		go s.acceptLoop(l)
	}
	for _, c := range s.conns {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			EchoUDP(c)
		}()
	}
	return s, nil
}

func (s *Servers) acceptLoop(l net.Listener) {
	defer s.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.accepted = append(s.accepted, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			EchoTCP(c)
		}()
	}
}

// Close stops the servers and closes their connections.
func (s *Servers) Close() {
	s.mu.Lock()
	s.closed = true
	for _, c := range s.accepted {
		c.Close()
	}
	s.mu.Unlock()
	for _, l := range s.listeners {
		l.Close()
	}
	for _, c := range s.conns {
		c.Close()
	}
	s.wg.Wait()
}

// EchoTCP copies everything read from c back to it until EOF or an error.
func EchoTCP(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 32*1024)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// EchoUDP answers every datagram with the same bytes until the connection is closed.
func EchoUDP(c net.PacketConn) {
	buf := make([]byte, 64*1024)
	for {
		n, addr, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		c.WriteTo(buf[:n], addr)
	}
}

// Dial opens a connection from inside the namespace at nsPath ("tcp" or "udp" network, over
// the family of the address).
// The returned connection can be used from any goroutine.
func Dial(nsPath, network string, to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := InNetns(nsPath, func() error {
		var err error
		d := net.Dialer{Timeout: timeout}
		family := "4"
		if to.Addr().Is6() && !to.Addr().Is4In6() {
			family = "6"
		}
		c, err = d.DialContext(context.Background(), network+family, to.String())
		return err
	})
	return c, err
}

// Probe reports whether a request from the namespace at nsPath to `to` gets an answer within
// timeout: a completed TCP handshake followed by an echoed message for "tcp", an echoed
// datagram for "udp".
func Probe(nsPath string, to netip.AddrPort, proto string, timeout time.Duration) bool {
	proto = strings.ToLower(proto)
	deadline := time.Now().Add(timeout)
	c, err := Dial(nsPath, proto, to, timeout)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(deadline)
	msg := []byte("rampart-probe\n")
	if proto == "udp" {
		// Datagrams can be lost for reasons other than policy (first ARP): retry a few
		// times inside the timeout.
		buf := make([]byte, 64)
		for time.Now().Before(deadline) {
			if _, err := c.Write(msg); err != nil {
				return false
			}
			step := time.Now().Add(timeout / 4)
			if step.After(deadline) {
				step = deadline
			}
			c.SetReadDeadline(step)
			n, err := c.Read(buf)
			if err == nil && string(buf[:n]) == string(msg) {
				return true
			}
			var ne net.Error
			if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
				return false
			}
		}
		return false
	}
	if _, err := c.Write(msg); err != nil {
		return false
	}
	buf := make([]byte, len(msg))
	_, err = ioReadFull(c, buf)
	return err == nil && string(buf) == string(msg)
}

func ioReadFull(c net.Conn, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
