package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/netns"
	"github.com/rampartnet/rampart/internal/proxy/http1"
)

// The fast path: the proxy listener the dataplane steers L7 connections to is served by
// the agent itself, which checks plain HTTP/1.1 requests against the plan (the same Plan,
// Authz and Grant that Envoy's RBAC filters are built from) and relays them to the server
// on an upstream connection from the client's own address, as Envoy does. Everything else
// (HTTP/2 and gRPC, chunked request bodies, upgrades, anything unusual: see http1/) is
// handed to Envoy, connection and all, with a PROXY protocol header that tells Envoy the
// client's and the original destination's addresses; from then on Envoy alone decides on
// that connection.
//
// Why: Envoy as packaged here costs about 75 us of CPU per request, as much as the whole
// request costs without a proxy (docs/internals/l7.md). The fast path
// does the same check for a few microseconds, so what is left is the kernel's work for the
// second connection.
//
// Fail closed: a connection that matches no chain is closed; a request that no grant
// admits gets 403 and never reaches the server; if Envoy cannot take a handed-over
// connection, it is closed; when the agent stops, the listener goes and the dataplane
// refuses L7 connections until it is back.

// FastPathStatus describes the fast path for `rampart status`.
type FastPathStatus struct {
	Listen     string `json:"listen"`
	Requests   uint64 `json:"requests"`   // requests it decided on
	Denied     uint64 `json:"denied"`     // of those, refused (403)
	HandedOver uint64 `json:"handedOver"` // connections handed to Envoy
	Open       int    `json:"open"`       // connections open now
}

type fastPath struct {
	m      *Manager
	log    *slog.Logger
	lns    []net.Listener // IPv4's, then IPv6's (Options.Listen6)
	listen netip.AddrPort
	envoy  netip.AddrPort // Envoy's PROXY protocol listener
	netns  string         // the namespace sockets are made in ("" = the agent's own)
	mark   uint32         // socket mark of upstream connections
	// redirect, in tests, replaces the original destination the upstream connection goes
	// to (on loopback the original destination is the listener itself).
	redirect func(netip.AddrPort) netip.AddrPort

	matchers planMatchers

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	requests, denied, handedOver atomic.Uint64
}

// planMatchers compiles each plan once, when the fast path first meets it.
type planMatchers struct {
	mu  sync.Mutex // serialises compiling
	cur atomic.Pointer[l7plan.CompiledPlan]
}

func (pm *planMatchers) get(p *l7plan.Plan) *l7plan.CompiledPlan {
	if c := pm.cur.Load(); c != nil && c.Plan() == p {
		return c
	}
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if c := pm.cur.Load(); c != nil && c.Plan() == p {
		return c
	}
	cp := l7plan.Compile(p)
	pm.cur.Store(cp)
	return cp
}

// forbiddenBody is what a refused request gets, as from Envoy's RBAC filter.
const forbiddenBody = "RBAC: access denied"

func startFastPath(m *Manager) (*fastPath, error) {
	o := m.cfg.Options
	f := &fastPath{
		m: m, log: m.log.With("part", "fastpath"), listen: o.Listen, envoy: o.EnvoyListen,
		netns: m.cfg.NetnsPath, mark: o.UpstreamMark, conns: map[net.Conn]struct{}{},
	}
	for _, at := range []netip.AddrPort{o.Listen, o.Listen6} {
		if !at.IsValid() {
			continue
		}
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			// Transparent: the dataplane hands it connections for any destination address.
			return setSockopts(c, transparent(at.Addr()))
		}}
		var ln net.Listener
		err := f.inNetns(func() error {
			var err error
			ln, err = lc.Listen(context.Background(), tcpNetwork(at.Addr()), at.String())
			return err
		})
		if err != nil {
			for _, l := range f.lns {
				l.Close()
			}
			return nil, fmt.Errorf("fast path listener on %s: %w", at, err)
		}
		f.lns = append(f.lns, ln)
	}
	f.listen = addrPortOf(f.lns[0].Addr())
	for _, ln := range f.lns {
		f.wg.Add(1)
		go f.serve(ln)
	}
	return f, nil
}

// transparent is the socket option that makes a socket of a's family transparent.
func transparent(a netip.Addr) sockopt {
	if a.Is4() {
		return sockopt{unix.SOL_IP, unix.IP_TRANSPARENT, 1}
	}
	return sockopt{unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1}
}

// tcpNetwork is the TCP network of a's family.
func tcpNetwork(a netip.Addr) string {
	if a.Is4() {
		return "tcp4"
	}
	return "tcp6"
}

func (f *fastPath) inNetns(fn func() error) error {
	return netns.Do(f.netns, fn)
}

// sockopt is one integer socket option: level, name, value.
type sockopt [3]int

func setSockopts(c syscall.RawConn, opts ...sockopt) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		for _, o := range opts {
			if serr = unix.SetsockoptInt(int(fd), o[0], o[1], o[2]); serr != nil {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

func (f *fastPath) serve(ln net.Listener) {
	defer f.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				f.log.Error("fast path accept", "error", err)
			}
			return
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(c)
			f.handle(c.(*net.TCPConn))
		}()
	}
}

func (f *fastPath) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *fastPath) untrack(c net.Conn) {
	c.Close()
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// close stops the listener and closes every connection it accepted.
func (f *fastPath) close() {
	f.mu.Lock()
	f.closed = true
	for _, ln := range f.lns {
		ln.Close()
	}
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *fastPath) status() *FastPathStatus {
	f.mu.Lock()
	open := len(f.conns)
	f.mu.Unlock()
	var listen []string
	for _, ln := range f.lns {
		listen = append(listen, ln.Addr().String())
	}
	return &FastPathStatus{
		Listen: strings.Join(listen, ","), Requests: f.requests.Load(), Denied: f.denied.Load(),
		HandedOver: f.handedOver.Load(), Open: open,
	}
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort()
	}
	return netip.AddrPort{}
}

// upstream is the connection to the server for one client connection.
type upstream struct {
	c *net.TCPConn
	r *bufio.Reader
	w *bufio.Writer
}

const idleTimeout = time.Hour // as Envoy's default for an HTTP connection

// handle serves one steered connection until it closes or is handed to Envoy.
func (f *fastPath) handle(c *net.TCPConn) {
	src, dst := addrPortOf(c.RemoteAddr()), addrPortOf(c.LocalAddr())
	src, dst = netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	if f.m.plan.Load().Chain(src.Addr(), dst.Addr(), dst.Port()) == nil {
		return // no chain: nothing may pass (as Envoy's default chain)
	}
	cr := bufio.NewReaderSize(c, 16<<10)
	cw := bufio.NewWriterSize(c, 16<<10)
	var up *upstream
	defer func() {
		if up != nil {
			up.c.Close()
		}
	}()
	raw := make([]byte, 0, 1024)
	for {
		c.SetReadDeadline(time.Now().Add(idleTimeout))
		if _, err := cr.Peek(1); err != nil {
			return
		}
		start := time.Now()
		c.SetReadDeadline(start.Add(RequestHeadersTimeout))
		h, consumed, err := http1.ReadRequestHead(cr, raw)
		raw = consumed[:0]
		if errors.Is(err, http1.ErrNotSimple) {
			if up != nil {
				up.c.Close()
				up = nil
			}
			f.handOver(c, cr, consumed, src, dst)
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				writeLocal(cw, 408, "request timeout", true, false)
			}
			return
		}
		c.SetReadDeadline(time.Time{})
		cp := f.matchers.get(f.m.plan.Load())
		chain := cp.ChainFor(src, dst)
		if chain == nil {
			return // the chain went away with the policy: as Envoy drains it
		}
		f.requests.Add(1)
		l := flow.AccessLog{
			Time: start, Chain: chain.Name, Src: src, Dst: dst, Protocol: "HTTP/1.1",
			Method: h.Method, Path: h.Target, Host: h.Host,
		}
		if !authorize(cp, chain, &l7plan.Request{Src: src.Addr(), Dst: dst.Addr(), Port: dst.Port(), Method: h.Method,
			Path: h.Path, Host: h.Host, Header: h.Header}, &l) {
			f.denied.Add(1)
			// A body the server will never see would have to be read and thrown away to
			// find the next request; closing is simpler and safe.
			closeAfter := h.Close || h.ContentLength > 0
			l.Denied, l.Status, l.Details = true, 403, "rbac_access_denied_matched_policy[none]"
			err := writeLocal(cw, 403, forbiddenBody, closeAfter, h.Method == "HEAD")
			f.logged(l, start)
			if err != nil || closeAfter {
				return
			}
			continue
		}
		if up == nil {
			if up, err = f.dial(src, dst); err != nil {
				l.Status, l.Details = 503, "upstream_reset_before_response_started{connection_failure}"
				writeLocal(cw, 503, "upstream connect error", true, h.Method == "HEAD")
				f.logged(l, start)
				return
			}
		}
		status, closeAfter, err := f.relay(h, src, cr, cw, up)
		if err != nil {
			if status == 0 {
				l.Status, l.Details = 503, "upstream_reset_before_response_started"
				writeLocal(cw, 503, "upstream reset", true, h.Method == "HEAD")
			} else {
				l.Status, l.Details, l.Upstream = uint32(status), "upstream_reset_after_response_started", true
			}
			f.logged(l, start)
			return
		}
		l.Status, l.Details, l.Upstream = uint32(status), "via_upstream", true
		f.logged(l, start)
		if closeAfter || h.Close {
			return
		}
	}
}

// authorize runs the chain's checks as Envoy's filters do (egress, then ingress; the first
// refusal ends it) and records each side's decision in l.
func authorize(cp *l7plan.CompiledPlan, c *l7plan.Chain, r *l7plan.Request, l *flow.AccessLog) bool {
	for _, side := range []struct {
		z   *l7plan.Authz
		out **flow.Decision
	}{{c.Egress, &l.Egress}, {c.Ingress, &l.Ingress}} {
		if side.z == nil {
			continue
		}
		ok, g := cp.Authz(side.z).Allows(r)
		d := &flow.Decision{EndpointID: side.z.EndpointID, Direction: side.z.Direction, Allowed: ok}
		if g != nil {
			d.Grant, d.RuleID = g.Name, g.RuleID
		}
		*side.out = d
		if !ok {
			return false
		}
	}
	return c.Egress != nil || c.Ingress != nil
}

// relay sends an admitted request to the server and its response back. status is 0 when
// no response head came back.
func (f *fastPath) relay(h http1.RequestHead, src netip.AddrPort, cr *bufio.Reader, cw *bufio.Writer, up *upstream) (status int, closeAfter bool, err error) {
	// The head as received, plus what Envoy adds (the client's address, as seen on the
	// connection; requests that bring their own were handed to Envoy).
	up.w.Write(h.Raw[:len(h.Raw)-2])
	up.w.WriteString("x-forwarded-for: ")
	up.w.WriteString(src.Addr().String())
	up.w.WriteString("\r\nx-forwarded-proto: http\r\n\r\n")
	if h.ContentLength > 0 {
		if _, err := io.CopyN(up.w, cr, h.ContentLength); err != nil {
			return 0, true, err
		}
	}
	if err := up.w.Flush(); err != nil {
		return 0, true, err
	}
	for {
		rh, err := http1.CopyResponseHead(up.r, cw)
		if err != nil {
			return 0, true, err
		}
		if rh.Status < 200 {
			if rh.Status == 101 {
				return rh.Status, true, http1.ErrBadResponse // no upgrade was asked for
			}
			if err := cw.Flush(); err != nil {
				return rh.Status, true, err
			}
			continue // an interim response; the final one follows
		}
		switch {
		case h.Method == "HEAD" || rh.Status == 204 || rh.Status == 304:
		case rh.Chunked:
			err = http1.CopyChunked(up.r, cw)
		case rh.Length >= 0:
			_, err = io.CopyN(cw, up.r, rh.Length)
		default:
			_, err = io.Copy(cw, up.r)
			rh.Close = true
		}
		if err == nil {
			err = cw.Flush()
		}
		return rh.Status, rh.Close, err
	}
}

// writeLocal sends a response of the proxy's own (to a HEAD request: without the body).
func writeLocal(w *bufio.Writer, status int, body string, closeAfter, head bool) error {
	w.WriteString("HTTP/1.1 ")
	w.WriteString(strconv.Itoa(status))
	w.WriteString(" ")
	w.WriteString(statusText(status))
	w.WriteString("\r\ncontent-length: ")
	w.WriteString(strconv.Itoa(len(body)))
	w.WriteString("\r\ncontent-type: text/plain\r\n")
	if closeAfter {
		w.WriteString("connection: close\r\n")
	}
	w.WriteString("\r\n")
	if !head {
		w.WriteString(body)
	}
	return w.Flush()
}

func statusText(code int) string {
	switch code {
	case 403:
		return "Forbidden"
	case 408:
		return "Request Timeout"
	case 503:
		return "Service Unavailable"
	}
	return "Error"
}

func (f *fastPath) logged(l flow.AccessLog, start time.Time) {
	l.Latency = time.Since(start)
	if cb := f.m.cfg.OnAccessLog; cb != nil {
		cb(l)
	}
}

// upstreamConnectTimeout is Envoy's cluster connect timeout here (bootstrap ConnectLimit).
const upstreamConnectTimeout = 2 * time.Second

// dial opens the upstream connection from the client's own address (a transparent socket
// in the node namespace) with the mark by which the dataplane admits it.
func (f *fastPath) dial(src, dst netip.AddrPort) (*upstream, error) {
	d := net.Dialer{
		Timeout:   upstreamConnectTimeout,
		LocalAddr: &net.TCPAddr{IP: src.Addr().AsSlice()},
		Control: func(_, _ string, c syscall.RawConn) error {
			return setSockopts(c, transparent(src.Addr()), sockopt{unix.SOL_SOCKET, unix.SO_MARK, int(f.mark)})
		},
	}
	if f.redirect != nil {
		dst = f.redirect(dst)
	}
	var c net.Conn
	err := f.inNetns(func() error {
		var err error
		c, err = d.Dial(tcpNetwork(dst.Addr()), dst.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	return &upstream{c: tc, r: bufio.NewReaderSize(tc, 16<<10), w: bufio.NewWriterSize(tc, 16<<10)}, nil
}

// handOver gives the connection to Envoy: a PROXY protocol (v1) header with the client's
// and the original destination's addresses, the bytes the fast path already read, then
// both directions relayed until either side is done. If Envoy cannot be reached the
// connection is closed (fail closed).
func (f *fastPath) handOver(c *net.TCPConn, cr *bufio.Reader, consumed []byte, src, dst netip.AddrPort) {
	f.handedOver.Add(1)
	c.SetReadDeadline(time.Time{})
	var e net.Conn
	err := f.inNetns(func() error {
		var err error
		e, err = net.DialTimeout("tcp4", f.envoy.String(), upstreamConnectTimeout)
		return err
	})
	if err != nil {
		f.log.Debug("handing a connection to envoy", "error", err)
		return
	}
	defer e.Close()
	buffered, _ := cr.Peek(cr.Buffered())
	msg := make([]byte, 0, 64+len(consumed)+len(buffered))
	family := "TCP4"
	if src.Addr().Is6() {
		family = "TCP6"
	}
	msg = fmt.Appendf(msg, "PROXY %s %s %s %d %d\r\n", family, src.Addr(), dst.Addr(), src.Port(), dst.Port())
	msg = append(append(msg, consumed...), buffered...)
	if _, err := e.Write(msg); err != nil {
		return
	}
	// Client to Envoy until the client is done sending (then Envoy sees the half-close);
	// Envoy to client until Envoy is done, which ends the connection.
	go func() {
		io.Copy(e, c)
		e.(*net.TCPConn).CloseWrite()
	}()
	io.Copy(c, e)
}
