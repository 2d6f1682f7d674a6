package datapath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/testenv"
)

// testProxy is a stand-in for Envoy in the node namespace: a transparent TCP proxy that
// does what the dataplane expects of the real one. It listens with IP_TRANSPARENT, takes
// the original destination from the accepted socket's local address (bpf_sk_assign keeps
// it), connects upstream with IP_TRANSPARENT from the client's own address (a new port) and
// with the socket mark ProxyUpstreamMark (Envoy's original_src listener filter), and relays
// bytes both ways.
type testProxy struct {
	t    *testing.T
	node string
	ln   net.Listener

	mu    sync.Mutex
	seen  []proxiedConn
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// proxiedConn is what the proxy saw of one connection.
type proxiedConn struct {
	Client   netip.AddrPort // the accepted connection's remote address
	Original netip.AddrPort // its local address: the destination the client asked for
	Upstream netip.AddrPort // local address of the upstream connection (client IP, new port)
	Err      error          // upstream connection failure
}

func transparentControl(mark int) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		level, opt := unix.SOL_IP, unix.IP_TRANSPARENT
		if strings.HasSuffix(network, "6") {
			level, opt = unix.SOL_IPV6, unix.IPV6_TRANSPARENT
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), level, opt, 1); serr != nil {
				serr = fmt.Errorf("IP_TRANSPARENT: %w", serr)
				return
			}
			if mark != 0 {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark); serr != nil {
					serr = fmt.Errorf("SO_MARK: %w", serr)
				}
			}
		})
		if err != nil {
			return err
		}
		return serr
	}
}

// startTestProxy starts the proxy listening on addr in the node namespace; it is stopped
// at cleanup (and may be stopped earlier).
func startTestProxy(t *testing.T, node string, addr netip.AddrPort) *testProxy {
	t.Helper()
	p := &testProxy{t: t, node: node, conns: make(map[net.Conn]struct{})}
	err := testenv.InNetns(node, func() error {
		lc := net.ListenConfig{Control: transparentControl(0)}
		var err error
		p.ln, err = lc.Listen(context.Background(), tcpNetwork(addr.Addr()), addr.String())
		return err
	})
	if err != nil {
		t.Fatalf("starting test proxy: %v", err)
	}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.stop)
	return p
}

func (p *testProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// track registers c for stop; false once the proxy is stopping.
func (p *testProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *testProxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *testProxy) serve(down net.Conn) {
	defer p.wg.Done()
	defer p.untrack(down)
	defer down.Close()
	pc := proxiedConn{
		Client:   down.RemoteAddr().(*net.TCPAddr).AddrPort(),
		Original: down.LocalAddr().(*net.TCPAddr).AddrPort(),
	}
	var up net.Conn
	// The upstream socket must be created in the node namespace.
	pc.Err = testenv.InNetns(p.node, func() error {
		d := net.Dialer{
			LocalAddr: &net.TCPAddr{IP: net.IP(pc.Client.Addr().AsSlice())},
			Timeout:   5 * time.Second,
			Control:   transparentControl(ProxyUpstreamMark),
		}
		var err error
		up, err = d.Dial(tcpNetwork(pc.Original.Addr()), pc.Original.String())
		return err
	})
	if pc.Err == nil {
		pc.Upstream = up.LocalAddr().(*net.TCPAddr).AddrPort()
	}
	p.mu.Lock()
	p.seen = append(p.seen, pc)
	p.mu.Unlock()
	if pc.Err != nil {
		return
	}
	if !p.track(up) {
		up.Close()
		return
	}
	defer p.untrack(up)
	defer up.Close()
	done := make(chan struct{}, 2)
	relay := func(dst, src net.Conn) {
		io.Copy(dst, src)
		dst.(*net.TCPConn).CloseWrite()
		done <- struct{}{}
	}
	go relay(up, down)
	go relay(down, up)
	<-done
	<-done
}

// stop closes the listener and every connection, and waits for the goroutines.
func (p *testProxy) stop() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// connections returns what the proxy has seen so far.
func (p *testProxy) connections() []proxiedConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]proxiedConn(nil), p.seen...)
}

// saw returns the proxy's record of the connection from client, if any.
func (p *testProxy) saw(client netip.AddrPort) (proxiedConn, bool) {
	for _, c := range p.connections() {
		if c.Client == client {
			return c, true
		}
	}
	return proxiedConn{}, false
}

// testServer is an echo server in an endpoint namespace that records the peer address of
// every connection it accepts (what the destination "sees").
type testServer struct {
	mu    sync.Mutex
	peers []netip.AddrPort
}

func startTestServer(t *testing.T, ns string, addrs ...netip.AddrPort) *testServer {
	t.Helper()
	s := &testServer{}
	for _, a := range addrs {
		var ln net.Listener
		if err := testenv.InNetns(ns, func() error {
			var err error
			ln, err = net.Listen(tcpNetwork(a.Addr()), a.String())
			return err
		}); err != nil {
			t.Fatalf("server on %v: %v", a, err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		conns := map[net.Conn]struct{}{}
		closed := false
		t.Cleanup(func() {
			ln.Close()
			mu.Lock()
			closed = true
			for c := range conns {
				c.Close()
			}
			mu.Unlock()
			wg.Wait()
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				if closed {
					mu.Unlock()
					c.Close()
					return
				}
				conns[c] = struct{}{}
				mu.Unlock()
				s.mu.Lock()
				s.peers = append(s.peers, c.RemoteAddr().(*net.TCPAddr).AddrPort())
				s.mu.Unlock()
				wg.Add(1)
				go func() {
					defer wg.Done()
					io.Copy(c, c)
					c.Close()
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
				}()
			}
		}()
	}
	return s
}

// sawPeer reports whether the server accepted a connection from peer.
func (s *testServer) sawPeer(peer netip.AddrPort) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.peers {
		if p == peer {
			return true
		}
	}
	return false
}

// eventLog collects flow events in the background so tests can wait for any of them.
type eventLog struct {
	mu     sync.Mutex
	events []flow.Event
	err    error
}

func collectEvents(t *testing.T, d *Datapath) *eventLog {
	t.Helper()
	r, err := d.Events.Reader()
	if err != nil {
		t.Fatal(err)
	}
	l := &eventLog{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			e, err := r.Read()
			if err != nil {
				if !errors.Is(err, os.ErrClosed) {
					l.mu.Lock()
					l.err = err
					l.mu.Unlock()
				}
				return
			}
			l.mu.Lock()
			l.events = append(l.events, e)
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		r.Close()
		<-done
	})
	return l
}

// wait returns the first event matching match, waiting up to 5s for it.
func (l *eventLog) wait(t *testing.T, what string, match func(flow.Event) bool) flow.Event {
	t.Helper()
	return l.waitFrom(t, 0, what, match)
}

// count returns the number of events seen so far (a start for waitFrom and noneFrom).
func (l *eventLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events)
}

// waitFrom is wait for events after the first from.
func (l *eventLog) waitFrom(t *testing.T, from int, what string, match func(flow.Event) bool) flow.Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		for _, e := range l.events[from:] {
			if match(e) {
				l.mu.Unlock()
				return e
			}
		}
		n := len(l.events)
		l.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no event for %s among %d events", what, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// none fails if an event matching match has been seen.
func (l *eventLog) none(t *testing.T, what string, match func(flow.Event) bool) {
	t.Helper()
	l.noneFrom(t, 0, what, match)
}

// noneFrom is none for events after the first from.
func (l *eventLog) noneFrom(t *testing.T, from int, what string, match func(flow.Event) bool) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events[from:] {
		if match(e) {
			t.Errorf("unexpected event (%s): %+v", what, e)
		}
	}
}

// tcpNetwork is the TCP network of a's family: tcp4 or tcp6.
func tcpNetwork(a netip.Addr) string {
	if a.Is4() {
		return "tcp4"
	}
	return "tcp6"
}
