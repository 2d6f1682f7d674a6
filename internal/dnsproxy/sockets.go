package dnsproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/netns"
)

// udpReadBuffer is the listening socket's one read buffer: the largest datagram, so that
// an oversized query is seen whole and dropped as such rather than cut short.
const udpReadBuffer = 65535

// open binds the UDP socket and the TCP listener to one port (trying a few ports if the
// configured one is 0 and the port UDP got is taken for TCP), and in transparent mode
// opens the raw socket for UDP answers.
func (p *Proxy) open() error {
	v6 := p.cfg.ListenAddr.Addr().Is6()
	udpNet, tcpNet, rawNet, rawAddr := "udp4", "tcp4", "ip4:udp", "0.0.0.0"
	level, transparent, recvOrigDst := unix.SOL_IP, unix.IP_TRANSPARENT, unix.IP_RECVORIGDSTADDR
	if v6 {
		udpNet, tcpNet, rawNet, rawAddr = "udp6", "tcp6", "ip6:udp", "::"
		level, transparent, recvOrigDst = unix.SOL_IPV6, unix.IPV6_TRANSPARENT, unix.IPV6_RECVORIGDSTADDR
	}
	// Every datagram says where it was sent (its original destination: with sk_assign or
	// TPROXY the packet keeps it), transparent or not.
	udpOpts := []sockopt{{level, recvOrigDst, 1}}
	var tcpOpts []sockopt
	if p.cfg.Transparent {
		udpOpts = append(udpOpts, sockopt{level, transparent, 1})
		tcpOpts = append(tcpOpts, sockopt{level, transparent, 1})
	}
	listenUDP := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error { return setsockopts(c, udpOpts...) }}
	listenTCP := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error { return setsockopts(c, tcpOpts...) }}
	ctx := context.Background()

	return netns.Do(p.cfg.Netns, func() error {
		for attempt := 0; ; attempt++ {
			pc, err := listenUDP.ListenPacket(ctx, udpNet, p.cfg.ListenAddr.String())
			if err != nil {
				return fmt.Errorf("udp socket: %w", err)
			}
			udp := pc.(*net.UDPConn)
			addr := addrPortOf(udp.LocalAddr())
			ln, err := listenTCP.Listen(ctx, tcpNet, addr.String())
			if err != nil {
				udp.Close()
				if p.cfg.ListenAddr.Port() == 0 && attempt < 10 && errors.Is(err, syscall.EADDRINUSE) {
					continue
				}
				return fmt.Errorf("tcp listener: %w", err)
			}
			p.udp, p.tcp, p.addr = udp, ln.(*net.TCPListener), addr
			break
		}
		if !p.cfg.Transparent {
			return nil
		}
		listenRaw := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			if err := setsockopts(c, sockopt{level, transparent, 1}); err != nil {
				return err
			}
			return dropAllReceived(c)
		}}
		pc, err := listenRaw.ListenPacket(ctx, rawNet, rawAddr)
		if err != nil {
			p.udp.Close()
			p.tcp.Close()
			return fmt.Errorf("raw socket for answers: %w", err)
		}
		p.raw = pc.(*net.IPConn)
		return nil
	})
}

// dropAllReceived attaches a socket filter that lets nothing in: the raw socket only
// sends, and would otherwise get a copy of every UDP packet of the namespace.
func dropAllReceived(c syscall.RawConn) error {
	filter := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog)
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("attaching a drop-all filter: %w", serr)
	}
	return nil
}

// serveUDP reads queries into one reused buffer, copies each (at most MaxQuerySize) and
// hands it to a goroutine of its own, if MaxInFlight allows.
func (p *Proxy) serveUDP() error {
	buf := make([]byte, udpReadBuffer)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofSockaddrInet6)*2)
	for {
		n, oobn, flags, src, err := p.udp.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("reading a query: %w", err)
		}
		start := time.Now()
		p.queries.Add(1)
		q := Query{Source: netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), Protocol: ProtoUDP}
		server, ok := origDst(oob[:oobn])
		if !ok {
			p.dropped(start, q, DropNoDestination)
			continue
		}
		q.Server = server
		if n > MaxQuerySize || flags&unix.MSG_TRUNC != 0 {
			p.dropped(start, q, DropOversized)
			continue
		}
		if !p.acquire() {
			p.dropped(start, q, DropInFlightLimit)
			continue
		}
		msg := bytes.Clone(buf[:n])
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.release()
			p.handle(start, q, msg, func(b []byte) error { return p.sendUDP(b, q.Server, q.Source) })
		}()
	}
}

// origDst is the destination address and port of a datagram (IP_ORIGDSTADDR or
// IPV6_ORIGDSTADDR: a sockaddr_in or sockaddr_in6, port and address in network order).
func origDst(oob []byte) (netip.AddrPort, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.AddrPort{}, false
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.SOL_IP && m.Header.Type == unix.IP_ORIGDSTADDR && len(m.Data) >= 8:
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Data[4:8])), binary.BigEndian.Uint16(m.Data[2:])), true
		case m.Header.Level == unix.SOL_IPV6 && m.Header.Type == unix.IPV6_ORIGDSTADDR && len(m.Data) >= 24:
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte(m.Data[8:24])), binary.BigEndian.Uint16(m.Data[2:])), true
		}
	}
	return netip.AddrPort{}, false
}

// sendUDP sends an answer to the pod at to from from, the query's original destination,
// which the pod's resolver expects it from. IP_PKTINFO (IPV6_PKTINFO) sets the source
// address; the port is the listener's own, so when from's port is another (a query
// steered from port 53) the answer is built as a UDP packet and sent on the raw socket,
// with the source address set the same way.
func (p *Proxy) sendUDP(b []byte, from, to netip.AddrPort) error {
	oob := pktinfo(from.Addr())
	if from.Port() == p.addr.Port() || p.raw == nil {
		_, _, err := p.udp.WriteMsgUDPAddrPort(b, oob, to)
		return err
	}
	if len(b) > 0xffff-8 {
		return errors.New("answer too long for a datagram")
	}
	pkt := make([]byte, 8+len(b))
	binary.BigEndian.PutUint16(pkt[0:], from.Port())
	binary.BigEndian.PutUint16(pkt[2:], to.Port())
	binary.BigEndian.PutUint16(pkt[4:], uint16(len(pkt)))
	copy(pkt[8:], b)
	binary.BigEndian.PutUint16(pkt[6:], udpChecksum(from.Addr(), to.Addr(), pkt))
	_, _, err := p.raw.WriteMsgIP(pkt, oob, &net.IPAddr{IP: to.Addr().AsSlice()})
	return err
}

// pktinfo is the control message that sets a datagram's source address.
func pktinfo(src netip.Addr) []byte {
	if src.Is4() {
		return unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: src.As4()})
	}
	return unix.PktInfo6(&unix.Inet6Pktinfo{Addr: src.As16()})
}

// udpChecksum is the UDP checksum of pkt (header with a zero checksum, then payload) from
// src to dst (RFC 768; RFC 8200 8.1 for IPv6, where it is mandatory). The pseudo-header's
// protocol and length words sum the same in both families.
func udpChecksum(src, dst netip.Addr, pkt []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for len(b) >= 2 {
			sum += uint32(b[0])<<8 | uint32(b[1])
			b = b[2:]
		}
		if len(b) == 1 {
			sum += uint32(b[0]) << 8
		}
	}
	add(src.AsSlice())
	add(dst.AsSlice())
	sum += uint32(unix.IPPROTO_UDP) + uint32(len(pkt))
	add(pkt)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	if cs := ^uint16(sum); cs != 0 {
		return cs
	}
	return 0xffff
}

// serveTCP accepts pods' connections, at most MaxTCPConns at once.
func (p *Proxy) serveTCP() error {
	var backoff time.Duration
	for {
		c, err := p.tcp.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of descriptors or memory, a connection gone before it was accepted:
			// wait a little and go on, as net/http does, rather than stop answering.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			select {
			case <-p.ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		if p.tcpConns.Add(1) > int64(p.cfg.MaxTCPConns) {
			p.tcpConns.Add(-1)
			p.countDrop(DropTCPConnLimit)
			c.Close()
			continue
		}
		if !p.track(c) {
			p.tcpConns.Add(-1)
			c.Close()
			return nil
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			p.serveConn(c)
		}()
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	p.tcpConns.Add(-1)
}

// serveConn reads length-prefixed queries (RFC 1035 4.2.2) from one connection, whose
// local address is the original destination, and answers each as it is done (RFC 7766
// 6.2.1.1: out of order), at most maxPipelined at once. Each message must arrive within
// TCPIdleTimeout of the previous one's end, each answer be taken within it; a connection
// that does not keep to that is closed.
func (p *Proxy) serveConn(c *net.TCPConn) {
	src, server := addrPortOf(c.RemoteAddr()), addrPortOf(c.LocalAddr())
	idle := p.cfg.TCPIdleTimeout
	var (
		wmu     sync.Mutex
		pending sync.WaitGroup
	)
	slots := make(chan struct{}, maxPipelined)
	reply := func(b []byte) error {
		if len(b) > 0xffff {
			return errors.New("answer longer than 65535 octets")
		}
		var l [2]byte
		binary.BigEndian.PutUint16(l[:], uint16(len(b)))
		wmu.Lock()
		defer wmu.Unlock()
		c.SetWriteDeadline(time.Now().Add(idle))
		bufs := net.Buffers{l[:], b}
		_, err := bufs.WriteTo(c)
		if err != nil {
			// A part of the answer may be out: the stream cannot go on.
			c.Close()
		}
		return err
	}
	// Queries already read are answered before the connection closes: a client may shut
	// down its sending side after its last query.
	defer pending.Wait()
	var l [2]byte
	for {
		c.SetReadDeadline(time.Now().Add(idle))
		q := Query{Source: src, Server: server, Protocol: ProtoTCP}
		if n, err := io.ReadFull(c, l[:]); err != nil {
			if n > 0 && isTimeout(err) {
				p.queries.Add(1)
				p.dropped(time.Now(), q, DropTCPTimeout)
			}
			return
		}
		start := time.Now()
		p.queries.Add(1)
		size := int(binary.BigEndian.Uint16(l[:]))
		if size > MaxQuerySize {
			p.dropped(start, q, DropOversized)
			return
		}
		msg := make([]byte, size)
		if _, err := io.ReadFull(c, msg); err != nil {
			if isTimeout(err) {
				p.dropped(start, q, DropTCPTimeout)
			}
			return
		}
		select {
		case slots <- struct{}{}:
		case <-p.ctx.Done():
			return
		}
		if !p.acquire() {
			<-slots
			p.dropped(start, q, DropInFlightLimit)
			continue
		}
		pending.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer pending.Done()
			defer func() { <-slots }()
			defer p.release()
			p.handle(start, q, msg, reply)
		}()
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// addrPortOf is a socket address as a netip.AddrPort, IPv4 unmapped.
func addrPortOf(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.UDPAddr:
		ap = a.AddrPort()
	case *net.TCPAddr:
		ap = a.AddrPort()
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
