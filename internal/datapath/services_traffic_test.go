package datapath

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/service"
	"github.com/rampartnet/rampart/internal/testenv"
)

// svcAddr is the Service address of the tests: no namespace has it and the node has no
// route to it, so only translation can make a connection to it reach anything.
var svcAddr = addr("198.18.99.10")

// serviceWorld is a node with a client endpoint a and a backend endpoint b, the test
// process in a cgroup of its own with the translation attached there. b serves TCP on
// 8080 and 8081 and UDP on 5353, each answering with its port and the peer's address.
type serviceWorld struct {
	node   string
	a, b   *trafficEndpoint
	cgroup string
	suffix string
}

func newServiceWorld(t testing.TB, prefix string) *serviceWorld {
	t.Helper()
	w := &serviceWorld{cgroup: testenv.JoinNewCgroup(t)}
	w.node, w.suffix = newNode(t, prefix)
	w.a = addEndpoint(t, w.node, prefix+"-"+w.suffix+"-a", prefix+"a"+w.suffix, addr("198.18.10.2"), addr("198.18.10.1"))
	w.b = addEndpoint(t, w.node, prefix+"-"+w.suffix+"-b", prefix+"b"+w.suffix, addr("198.18.20.2"), addr("198.18.20.1"))
	for _, port := range []uint16{8080, 8081} {
		whoServer(t, w.b.ns, port)
	}
	whoUDPServer(t, w.b.ns, 5353)
	return w
}

func openTestServices(t testing.TB, cgroup string, backendsMax uint32) *Services {
	t.Helper()
	s, err := openServices(cgroup, backendsMax)
	if err != nil {
		t.Fatalf("opening service translation: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing service translation: %v", err)
		}
	})
	return s
}

// whoServer answers each TCP connection on port with "<port> <peer address>\n".
func whoServer(t testing.TB, ns string, port uint16) {
	t.Helper()
	serveTCP(t, ns, fmt.Sprintf(":%d", port), func(c net.Conn) { fmt.Fprintf(c, "%d %s\n", port, c.RemoteAddr()) })
}

// whoUDPServer answers each datagram on port with "<port> <peer address>" (IPv4).
func whoUDPServer(t testing.TB, ns string, port uint16) { whoUDPServerOn(t, ns, "udp4", port) }

// whoUDPServerOn is whoUDPServer on network (udp4, udp6).
func whoUDPServerOn(t testing.TB, ns, network string, port uint16) {
	t.Helper()
	var pc net.PacketConn
	if err := testenv.InNetns(ns, func() (err error) {
		pc, err = net.ListenPacket(network, fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(fmt.Appendf(nil, "%d %s", port, from), from)
		}
	}()
}

// askTCP connects from ns to to and returns the server's answer and the socket's peer as
// getpeername reports it.
func askTCP(ns string, to netip.AddrPort, timeout time.Duration) (answer string, peer netip.AddrPort, err error) {
	c, err := dial(ns, to, timeout)
	if err != nil {
		return "", peer, err
	}
	return readAnswer(c)
}

// readAnswer returns the first line the server sends on c and getpeername's answer, and
// closes c.
func readAnswer(c net.Conn) (answer string, peer netip.AddrPort, err error) {
	defer c.Close()
	if peer, err = peerName(c.(syscall.Conn)); err != nil {
		return "", peer, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), peer, err
}

func peerName(c syscall.Conn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa unix.Sockaddr
	var serr error
	if err := rc.Control(func(fd uintptr) { sa, serr = unix.Getpeername(int(fd)) }); err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("getpeername: %w", serr)
	}
	switch in := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port)), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(in.Addr), uint16(in.Port)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("getpeername: %T", sa)
}

// askUDP sends one datagram from an unconnected socket in ns to to and returns the answer
// and the address recvfrom reports it from.
func askUDP(ns string, to netip.AddrPort) (answer string, from netip.AddrPort, err error) {
	var pc *net.UDPConn
	network := "udp4"
	if to.Addr().Is6() {
		network = "udp6"
	}
	if err := testenv.InNetns(ns, func() (err error) {
		pc, err = net.ListenUDP(network, nil)
		return err
	}); err != nil {
		return "", from, err
	}
	defer pc.Close()
	if _, err := pc.WriteToUDPAddrPort([]byte("who"), to); err != nil {
		return "", from, err
	}
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := pc.ReadFromUDPAddrPort(buf)
	return string(buf[:n]), from, err
}

func TestServiceTranslation(t *testing.T) {
	w := newServiceWorld(t, "rsl")
	s := openTestServices(t, w.cgroup, 0)
	web := service.Frontend{Addr: svcAddr, Port: 80, Protocol: service.TCP}
	dns := service.Frontend{Addr: svcAddr, Port: 53, Protocol: service.UDP}
	webAt := netip.AddrPortFrom(svcAddr, 80)
	dnsAt := netip.AddrPortFrom(svcAddr, 53)

	// Before any Service: the address leads nowhere.
	if ans, _, err := askTCP(w.a.ns, webAt, time.Second); err == nil {
		t.Fatalf("connection to %s before the Service exists reached %q", webAt, ans)
	}

	if err := s.Replace(service.Table{
		web: {{Addr: w.b.ip, Port: 8080}},
		dns: {{Addr: w.b.ip, Port: 5353}},
	}); err != nil {
		t.Fatal(err)
	}
	// TCP reaches the backend, which sees the client's own address; the client's peer is
	// the Service.
	ans, peer, err := askTCP(w.a.ns, webAt, 5*time.Second)
	if err != nil {
		t.Fatalf("TCP to the Service: %v", err)
	}
	if !strings.HasPrefix(ans, fmt.Sprintf("8080 %s:", w.a.ip)) {
		t.Errorf("TCP to the Service: backend answered %q, want 8080 and the client's address %s", ans, w.a.ip)
	}
	if peer != webAt {
		t.Errorf("getpeername of a TCP socket to the Service = %s, want %s", peer, webAt)
	}

	// Unconnected UDP: the reply comes from the Service's address (recvmsg4).
	ans, from, err := askUDP(w.a.ns, dnsAt)
	if err != nil {
		t.Fatalf("UDP to the Service: %v", err)
	}
	if !strings.HasPrefix(ans, fmt.Sprintf("5353 %s:", w.a.ip)) || from != dnsAt {
		t.Errorf("UDP to the Service: %q from %s, want 5353 and the client's address from %s", ans, from, dnsAt)
	}

	// Connected UDP: connect4 translates, getpeername shows the Service.
	c, err := testenv.Dial(w.a.ns, "udp", dnsAt, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("who")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	n, err := c.Read(buf)
	if err != nil || !strings.HasPrefix(string(buf[:n]), "5353 ") {
		t.Errorf("connected UDP to the Service: %q, %v", buf[:n], err)
	}
	if peer, err := peerName(c.(syscall.Conn)); err != nil || peer != dnsAt {
		t.Errorf("getpeername of a connected UDP socket = %s, %v; want %s", peer, err, dnsAt)
	}

	// A new backend set: new connections go to it.
	if err := s.Replace(service.Table{web: {{Addr: w.b.ip, Port: 8081}}, dns: {{Addr: w.b.ip, Port: 5353}}}); err != nil {
		t.Fatal(err)
	}
	if ans, _, err := askTCP(w.a.ns, webAt, 5*time.Second); err != nil || !strings.HasPrefix(ans, "8081 ") {
		t.Errorf("after the backends changed: %q, %v; want the backend on 8081", ans, err)
	}

	// No backend: refused, TCP and UDP.
	if err := s.Replace(service.Table{web: {}, dns: {}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := askTCP(w.a.ns, webAt, 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("TCP to a Service with no backend: %v, want ECONNREFUSED", err)
	}
	if _, _, err := askUDP(w.a.ns, dnsAt); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("UDP to a Service with no backend: %v, want ECONNREFUSED", err)
	}

	// Deleted: no longer translated.
	if err := s.Replace(service.Table{}); err != nil {
		t.Fatal(err)
	}
	if n := s.Frontends(); n != 0 {
		t.Errorf("%d frontends after deleting all", n)
	}
	if ans, _, err := askTCP(w.a.ns, webAt, time.Second); err == nil || errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("TCP to a deleted Service: %q, %v; want it untranslated (unreachable)", ans, err)
	}
}

// TestServiceTranslationIPv6: an IPv6 frontend goes to its IPv6 backend (TCP, and UDP with
// the reply from the frontend), and an IPv4 frontend is translated for an IPv6 socket that
// addresses it IPv4-mapped (a dual-stack socket, which the IPv4 hooks never see).
func TestServiceTranslationIPv6(t *testing.T) {
	w := newServiceWorld(t, "rs6")
	if err := writeSysctl(w.node, "net/ipv6/conf/all/forwarding", "1"); err != nil {
		t.Fatal(err)
	}
	a6, b6 := addr("2001:2:10::2"), addr("2001:2:20::2")
	addEndpoint6(t, w.node, w.a, a6)
	addEndpoint6(t, w.node, w.b, b6)
	serveTCP(t, w.b.ns, "[::]:8080", func(c net.Conn) { fmt.Fprintf(c, "8080 %s\n", c.RemoteAddr()) })
	whoUDPServerOn(t, w.b.ns, "udp6", 5353)
	s := openTestServices(t, w.cgroup, 0)
	svc6 := addr("2001:2:99::10")
	webAt, dnsAt := netip.AddrPortFrom(svc6, 80), netip.AddrPortFrom(svc6, 53)
	if ans, _, err := askTCP(w.a.ns, webAt, time.Second); err == nil {
		t.Fatalf("connection to %s before the Service exists reached %q", webAt, ans)
	}
	web6 := service.Frontend{Addr: svc6, Port: 80, Protocol: service.TCP}
	if err := s.Replace(service.Table{
		web6: {{Addr: b6, Port: 8080}},
		{Addr: svc6, Port: 53, Protocol: service.UDP}:    {{Addr: b6, Port: 5353}},
		{Addr: svcAddr, Port: 80, Protocol: service.TCP}: {{Addr: w.b.ip, Port: 8080}},
	}); err != nil {
		t.Fatal(err)
	}
	ans, peer, err := askTCP(w.a.ns, webAt, 5*time.Second)
	if err != nil {
		t.Fatalf("TCP to the IPv6 Service: %v", err)
	}
	if !strings.HasPrefix(ans, fmt.Sprintf("8080 [%s]:", a6)) || peer != webAt {
		t.Errorf("TCP to the IPv6 Service: %q, peer %s; want 8080 and the client's address %s, peer %s", ans, peer, a6, webAt)
	}
	ans, from, err := askUDP(w.a.ns, dnsAt)
	if err != nil || !strings.HasPrefix(ans, fmt.Sprintf("5353 [%s]:", a6)) || from != dnsAt {
		t.Errorf("UDP to the IPv6 Service: %q from %s, %v; want 5353 and the client's address from %s", ans, from, err, dnsAt)
	}

	// A dual-stack socket addressing the IPv4 frontend IPv4-mapped.
	mapped := netip.AddrPortFrom(netip.AddrFrom16(svcAddr.As16()), 80)
	ans, peer, err = askMapped(w.a.ns, mapped)
	if err != nil || !strings.HasPrefix(ans, fmt.Sprintf("8080 %s:", w.a.ip)) || peer != mapped {
		t.Errorf("IPv4-mapped connect to the IPv4 Service: %q, peer %s, %v; want 8080 and %s, peer %s", ans, peer, err, w.a.ip, mapped)
	}

	if err := s.Replace(service.Table{web6: {}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := askTCP(w.a.ns, webAt, 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("TCP to an IPv6 Service with no backend: %v, want ECONNREFUSED", err)
	}
}

// askMapped connects an IPv6 TCP socket in ns to the IPv4-mapped to (Go's dialer would
// use an IPv4 socket) and returns the first line it reads and getpeername's answer.
func askMapped(ns string, to netip.AddrPort) (answer string, peer netip.AddrPort, err error) {
	var c net.Conn
	err = testenv.InNetns(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		tv := unix.Timeval{Sec: 5}
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
		if err := unix.Connect(fd, &unix.SockaddrInet6{Port: int(to.Port()), Addr: to.Addr().As16()}); err != nil {
			unix.Close(fd)
			return err
		}
		f := os.NewFile(uintptr(fd), "mapped")
		defer f.Close()
		c, err = net.FileConn(f)
		return err
	})
	if err != nil {
		return "", peer, err
	}
	return readAnswer(c)
}

// Two agents on one host (simulated nodes) attach to the same cgroup: translation is
// idempotent, and one agent leaving does not stop the other's.
func TestServiceTwoAgents(t *testing.T) {
	w := newServiceWorld(t, "rs2")
	table := service.Table{{Addr: svcAddr, Port: 80, Protocol: service.TCP}: {{Addr: w.b.ip, Port: 8080}}}
	first := openTestServices(t, w.cgroup, 0)
	second, err := OpenServices(w.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Services{first, second} {
		if err := s.Replace(table); err != nil {
			t.Fatal(err)
		}
	}
	webAt := netip.AddrPortFrom(svcAddr, 80)
	if ans, peer, err := askTCP(w.a.ns, webAt, 5*time.Second); err != nil || !strings.HasPrefix(ans, "8080 ") || peer != webAt {
		t.Fatalf("with two agents: %q from %s, %v", ans, peer, err)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if ans, _, err := askTCP(w.a.ns, webAt, 5*time.Second); err != nil || !strings.HasPrefix(ans, "8080 ") {
		t.Fatalf("after one agent closed: %q, %v", ans, err)
	}
}

// A backend set that cannot be written leaves the Service refusing, not translating to
// its old backends (whose addresses may be other pods' by now).
func TestServiceWriteFailureRefuses(t *testing.T) {
	w := newServiceWorld(t, "rsf")
	s := openTestServices(t, w.cgroup, 2)
	web := service.Frontend{Addr: svcAddr, Port: 80, Protocol: service.TCP}
	webAt := netip.AddrPortFrom(svcAddr, 80)
	if err := s.Replace(service.Table{web: {{Addr: w.b.ip, Port: 8080}}}); err != nil {
		t.Fatal(err)
	}
	if ans, _, err := askTCP(w.a.ns, webAt, 5*time.Second); err != nil || !strings.HasPrefix(ans, "8080 ") {
		t.Fatalf("before the failure: %q, %v", ans, err)
	}
	three := []service.Backend{{Addr: w.b.ip, Port: 8081}, {Addr: addr("198.18.20.3"), Port: 8081}, {Addr: addr("198.18.20.4"), Port: 8081}}
	if err := s.Replace(service.Table{web: three}); err == nil {
		t.Fatal("writing 3 backends into a map of 2 succeeded")
	}
	if ans, _, err := askTCP(w.a.ns, webAt, 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("after a failed write: %q, %v; want ECONNREFUSED", ans, err)
	}
	// The next successful write translates again.
	if err := s.Replace(service.Table{web: three[:1]}); err != nil {
		t.Fatal(err)
	}
	if ans, _, err := askTCP(w.a.ns, webAt, 5*time.Second); err != nil || !strings.HasPrefix(ans, "8081 ") {
		t.Fatalf("after a good write: %q, %v", ans, err)
	}
}

// Policy is judged on the backend: the tc programs on the client's veth see the backend's
// address, so an egress rule allowing the backend admits the Service and none denies it.
func TestServicePolicyJudgesBackend(t *testing.T) {
	w := newServiceWorld(t, "rsp")
	d := openTest(t, Config{})
	attachAll(t, d, w.node, w.a, w.b)
	const idA, idB = identity.Identity(1001), identity.Identity(1002)
	twoEndpointIPCache(t, d, w.a, w.b, idA, idB)
	infoA := EndpointInfo{EpID: 1, Identity: idA, Addr: w.a.ip}
	if err := d.Endpoints.ApplyEndpoint(w.b.ifindex, EndpointInfo{EpID: 2, Identity: idB, Addr: w.b.ip}, mapstate.EndpointPolicy{}); err != nil {
		t.Fatal(err)
	}
	s := openTestServices(t, w.cgroup, 0)
	if err := s.Replace(service.Table{{Addr: svcAddr, Port: 80, Protocol: service.TCP}: {{Addr: w.b.ip, Port: 8080}}}); err != nil {
		t.Fatal(err)
	}
	webAt := netip.AddrPortFrom(svcAddr, 80)

	// a may send to b's identity on 8080 only: the Service (port 80 on an address of
	// the world) is admitted because what leaves a is addressed to b:8080.
	allowB := mapstate.EndpointPolicy{EnforceEgress: true, Entries: entries(e(allow(idB, out, tcp, 8080, 16, 1)))}
	if err := d.Endpoints.ApplyEndpoint(w.a.ifindex, infoA, allowB); err != nil {
		t.Fatal(err)
	}
	if ans, _, err := askTCP(w.a.ns, webAt, 5*time.Second); err != nil || !strings.HasPrefix(ans, "8080 ") {
		t.Fatalf("Service whose backend policy allows: %q, %v", ans, err)
	}
	// Egress enforced with nothing allowed: the Service is denied.
	if err := d.Endpoints.ApplyEndpoint(w.a.ifindex, infoA, mapstate.EndpointPolicy{EnforceEgress: true}); err != nil {
		t.Fatal(err)
	}
	if ans, _, err := askTCP(w.a.ns, webAt, time.Second); err == nil {
		t.Fatalf("Service whose backend policy denies answered %q", ans)
	}
}

// BenchmarkServiceConnect measures a TCP connect (and an RST close) from a client
// namespace to a backend in another: directly without the programs attached, directly
// with them attached (the frontend lookup misses), and through a Service (translated).
func BenchmarkServiceConnect(b *testing.B) {
	w := newServiceWorld(b, "rsb")
	backend := netip.AddrPortFrom(w.b.ip, 8080)
	webAt := netip.AddrPortFrom(svcAddr, 80)
	connect := func(b *testing.B, to netip.AddrPort) {
		err := testenv.InNetns(w.a.ns, func() error {
			b.ResetTimer()
			for range b.N {
				c, err := net.Dial("tcp4", to.String())
				if err != nil {
					return err
				}
				c.(*net.TCPConn).SetLinger(0) // no TIME_WAIT: the ports do not run out
				c.Close()
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Run("direct", func(b *testing.B) { connect(b, backend) })
	s := openTestServices(b, w.cgroup, 0)
	if err := s.Replace(service.Table{{Addr: svcAddr, Port: 80, Protocol: service.TCP}: {{Addr: w.b.ip, Port: 8080}}}); err != nil {
		b.Fatal(err)
	}
	b.Run("direct-programs-attached", func(b *testing.B) { connect(b, backend) })
	b.Run("service", func(b *testing.B) { connect(b, webAt) })
}
