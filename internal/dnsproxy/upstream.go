package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/netns"
)

// minUpstreamBuffer is the least a UDP response may fill: a query may advertise less (or
// no EDNS at all) and get a response that disregards it; the pod's resolver may still
// take it, so the proxy does not drop it for that.
const minUpstreamBuffer = 4096

// exchange asks target the query b (the pod's bytes, unchanged: same ID, flags and EDNS
// options) over the query's own protocol, from a new, plain socket of the node (with
// UpstreamMark), and returns the first valid response to it (checkResponse) within
// UpstreamTimeout. Other messages are dropped and counted.
func (p *Proxy) exchange(proto uint8, target netip.AddrPort, b []byte, req *dns.Msg) ([]byte, *dns.Msg, error) {
	if p.isSelf(target) {
		return nil, nil, errors.New("the server is the proxy itself")
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.UpstreamTimeout)
	defer cancel()
	network := "udp"
	if proto == ProtoTCP {
		network = "tcp"
	}
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		if p.cfg.UpstreamMark == 0 {
			return nil
		}
		return setsockopts(c, sockopt{unix.SOL_SOCKET, unix.SO_MARK, int(p.cfg.UpstreamMark)})
	}}
	var c net.Conn
	err := netns.Do(p.cfg.Netns, func() error {
		var err error
		c, err = d.DialContext(ctx, network, target.String())
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("connecting: %w", err)
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	// Close (which cancels p.ctx) ends the exchange at once rather than at the deadline.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if proto == ProtoUDP {
		return p.exchangeUDP(c.(*net.UDPConn), b, req)
	}
	return p.exchangeTCP(c, b, req)
}

// exchangeUDP: the socket is connected, so only the server's datagrams arrive; those that
// are not the response (another ID or question, garbage, larger than the buffer) are
// dropped, and the proxy waits on, so that a stray or forged datagram cannot end the query.
func (p *Proxy) exchangeUDP(c *net.UDPConn, b []byte, req *dns.Msg) ([]byte, *dns.Msg, error) {
	if _, err := c.Write(b); err != nil {
		return nil, nil, fmt.Errorf("sending the query: %w", err)
	}
	buf := make([]byte, min(max(ednsSize(req), minUpstreamBuffer), dns.MaxMsgSize))
	for {
		n, _, flags, _, err := c.ReadMsgUDPAddrPort(buf, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("reading the response: %w", err)
		}
		if flags&unix.MSG_TRUNC != 0 {
			p.countDrop(DropResponseMalformed)
			continue
		}
		m, err := checkResponse(req, buf[:n])
		if err != nil {
			p.countDrop(responseDrop(err))
			continue
		}
		return buf[:n:n], m, nil
	}
}

// exchangeTCP: one query on a connection of its own (RFC 1035 4.2.2 framing); messages
// that are not its response are dropped as over UDP.
func (p *Proxy) exchangeTCP(c net.Conn, b []byte, req *dns.Msg) ([]byte, *dns.Msg, error) {
	var l [2]byte
	binary.BigEndian.PutUint16(l[:], uint16(len(b)))
	bufs := net.Buffers{l[:], b}
	if _, err := bufs.WriteTo(c); err != nil {
		return nil, nil, fmt.Errorf("sending the query: %w", err)
	}
	for {
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return nil, nil, fmt.Errorf("reading the response: %w", err)
		}
		msg := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, msg); err != nil {
			return nil, nil, fmt.Errorf("reading the response: %w", err)
		}
		m, err := checkResponse(req, msg)
		if err != nil {
			p.countDrop(responseDrop(err))
			continue
		}
		return msg, m, nil
	}
}

func responseDrop(err error) DropReason {
	if errors.Is(err, errResponseMismatch) {
		return DropResponseMismatch
	}
	return DropResponseMalformed
}

// isSelf says whether target is the proxy's own socket (a query to the proxy's address
// itself, without an Upstream mapping), which would loop.
func (p *Proxy) isSelf(target netip.AddrPort) bool {
	if target.Port() != p.addr.Port() {
		return false
	}
	a := target.Addr().Unmap()
	return a == p.addr.Addr() || p.addr.Addr().IsUnspecified() && a.IsLoopback()
}

// sockopt is one integer socket option: level, name, value.
type sockopt [3]int

func setsockopts(c syscall.RawConn, opts ...sockopt) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		for _, o := range opts {
			if serr = unix.SetsockoptInt(int(fd), o[0], o[1], o[2]); serr != nil {
				serr = fmt.Errorf("setsockopt(%d, %d): %w", o[0], o[1], serr)
				return
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}
