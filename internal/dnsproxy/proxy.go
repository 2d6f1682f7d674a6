package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/rampartnet/rampart/internal/fqdn"
)

// Protocol numbers of Query.Protocol.
const (
	ProtoTCP uint8 = 6
	ProtoUDP uint8 = 17
)

// MaxQuerySize is the largest query the proxy reads (UDP datagram or TCP message). A
// query holds one question (a name of at most 255 octets) and perhaps an OPT record;
// 4096 octets leave room for any EDNS options and TSIG a stub sends, and keep what a pod
// can make the proxy hold per query small.
const MaxQuerySize = 4096

// Defaults of Config.
const (
	DefaultUpstreamTimeout = 2 * time.Second
	DefaultMaxInFlight     = 1024
	DefaultMaxTCPConns     = 256
	DefaultTCPIdleTimeout  = 10 * time.Second
)

// maxPipelined is how many queries of one TCP connection are answered at once (RFC 7766
// asks servers to work on pipelined queries concurrently); beyond it the proxy stops
// reading that connection until one is answered.
const maxPipelined = 16

// Query is one DNS question a pod asked, as the proxy saw it.
type Query struct {
	Source   netip.AddrPort // the pod's address and port
	Server   netip.AddrPort // the original destination: the DNS server the pod asked
	Protocol uint8          // 17 (UDP) or 6 (TCP)
	Name     string         // the question's name, canonical (fqdn.Canonical)
	Type     uint16         // qtype
}

// Answer is what an allowed answer taught: each name of the answer's chain (the
// question's name and every CNAME target leading to the addresses) with the A/AAAA
// addresses at its end and the smallest TTL along the chain. The Answers of one response
// share one Addrs slice (sorted, without duplicates); Learn must not modify it.
type Answer struct {
	Name  string
	Addrs []netip.Addr
	TTL   time.Duration
}

// Policy is what the proxy asks the agent (the agent implements it). Both methods are
// called concurrently, from the goroutine that handles the query.
type Policy interface {
	// Allow says whether the query may go to its server (rules.dns of the pod's egress
	// policy for that server and port); rule describes the rule that decided, for logs
	// and flows.
	Allow(q Query) (allowed bool, rule string)
	// Learn is called with the answers of an allowed response before the response is
	// sent to the pod; it returns once the dataplane admits the learnt addresses (so the
	// pod's first packet to them passes), or an error (then the pod gets SERVFAIL: fail
	// closed, and the client may retry). It is not called when the response teaches
	// nothing (an rcode other than NOERROR, no address at the end of the chain).
	Learn(q Query, answers []Answer) error
}

// Config configures a Proxy.
type Config struct {
	// ListenAddr is where the UDP socket and the TCP listener bind (e.g. 127.0.0.1:15053);
	// port 0 picks one free for both (tests). Its family is the proxy's: one Proxy serves
	// IPv4 or IPv6.
	ListenAddr netip.AddrPort
	// Transparent sets IP_TRANSPARENT on the sockets (and opens the raw socket UDP answers
	// from another port need), so that packets steered with their original destination
	// are received and answered from that destination; it needs CAP_NET_ADMIN and
	// CAP_NET_RAW. Tests without steering set false.
	Transparent bool
	// UpstreamTimeout bounds each exchange with a server (DefaultUpstreamTimeout).
	UpstreamTimeout time.Duration
	// MaxInFlight is how many queries are handled at once at most (DefaultMaxInFlight);
	// beyond it a query is dropped and counted (DropInFlightLimit).
	MaxInFlight int
	// MaxTCPConns is how many TCP connections of pods are open at once at most
	// (DefaultMaxTCPConns); beyond it a new connection is closed and counted.
	MaxTCPConns int
	// TCPIdleTimeout is how long a pod's TCP connection may stay without a complete query
	// (DefaultTCPIdleTimeout); it also bounds reading one message and writing one answer.
	TCPIdleTimeout time.Duration
	// UpstreamMark is the SO_MARK of upstream sockets (0: none; else CAP_NET_ADMIN).
	UpstreamMark uint32
	// Upstream, if set, maps a query's original destination to the address actually asked
	// (tests without steering use it; nil: the original destination).
	Upstream func(server netip.AddrPort) netip.AddrPort
	// Netns, if set, is the path of the network namespace all the proxy's sockets are made
	// in, upstream ones included ("" = the caller's, where an agent in the node namespace
	// leaves it). Each upstream socket is then opened on a thread switched into it.
	Netns string
	// OnEvent, if set, gets one record per query (allowed, refused or dropped with its
	// reason, rcode, latency, answers) for flows and logs. It is called on the query's
	// goroutine and must not block.
	OnEvent func(Event)
}

// Verdict is what became of a query.
type Verdict uint8

const (
	VerdictDropped Verdict = iota // not answered, or answered FORMERR/NOTIMP; Event.Reason says why
	VerdictAllowed                // forwarded (answered with the response, or SERVFAIL)
	VerdictRefused                // answered REFUSED
)

func (v Verdict) String() string {
	switch v {
	case VerdictAllowed:
		return "allowed"
	case VerdictRefused:
		return "refused"
	default:
		return "dropped"
	}
}

// DropReason names why something a pod or a server sent was dropped.
type DropReason string

const (
	// DropMalformed: a query that does not parse, is not a query (QR set), has a QDCOUNT
	// other than 1 or an opcode other than QUERY. Answered FORMERR (NOTIMP for the
	// opcode) when its header is readable and it is not a response, else not answered.
	DropMalformed DropReason = "malformed"
	// DropOversized: a query longer than MaxQuerySize. Over TCP the connection is closed.
	DropOversized DropReason = "oversized"
	// DropInFlightLimit: a query beyond Config.MaxInFlight, not answered.
	DropInFlightLimit DropReason = "in-flight-limit"
	// DropNoDestination: a datagram without its original destination (no
	// IP_ORIGDSTADDR), which cannot be forwarded or answered.
	DropNoDestination DropReason = "no-destination"
	// DropTCPTimeout: a TCP connection that timed out in the middle of a message.
	DropTCPTimeout DropReason = "tcp-timeout"
	// DropTCPConnLimit: a TCP connection beyond Config.MaxTCPConns, closed at once.
	DropTCPConnLimit DropReason = "tcp-conn-limit"
	// DropReplyFailed: an answer that could not be sent to the pod.
	DropReplyFailed DropReason = "reply-failed"
	// DropResponseMalformed: a message from a server that does not parse (and is not a
	// truncated response with a readable question), is not a response, or is larger than
	// the buffer. The query waits on for a valid response until its timeout.
	DropResponseMalformed DropReason = "response-malformed"
	// DropResponseMismatch: a response from a server whose ID or question is not the
	// query's. The query waits on for a valid response until its timeout.
	DropResponseMismatch DropReason = "response-mismatch"
)

// dropReasons fixes the order of the counters.
var dropReasons = [...]DropReason{
	DropMalformed, DropOversized, DropInFlightLimit, DropNoDestination, DropTCPTimeout,
	DropTCPConnLimit, DropReplyFailed, DropResponseMalformed, DropResponseMismatch,
}

// Event is the record of one query.
type Event struct {
	Time     time.Time      // when the query was read
	Query    Query          // Name and Type are empty when the query did not parse
	Verdict  Verdict        //
	Rule     string         // the rule that decided (Policy.Allow)
	Reason   DropReason     // VerdictDropped: why
	Upstream netip.AddrPort // VerdictAllowed: the server asked
	Rcode    int            // the rcode the pod was answered with; -1 if it was not answered
	Latency  time.Duration  // from Time until the answer was sent or the query dropped
	Answers  []Answer       // what Learn was given
	Err      error          // why an allowed query got SERVFAIL, or the answer was not sent
}

// Stats are the proxy's counters since New.
type Stats struct {
	Queries        uint64 `json:"queries"`        // messages read from pods, well-formed or not
	Allowed        uint64 `json:"allowed"`        // queries Policy allowed
	Refused        uint64 `json:"refused"`        // queries answered REFUSED
	Forwarded      uint64 `json:"forwarded"`      // allowed queries answered with the server's response
	UpstreamErrors uint64 `json:"upstreamErrors"` // allowed queries answered SERVFAIL: no valid response in time
	LearnErrors    uint64 `json:"learnErrors"`    // allowed queries answered SERVFAIL: Learn failed
	// Drops counts by reason what was dropped: queries (malformed, oversized, ...), TCP
	// connections (tcp-conn-limit) and servers' messages (response-*). Zero counts are
	// left out.
	Drops    map[DropReason]uint64 `json:"drops"`
	InFlight int                   `json:"inFlight"` // queries being handled now
	TCPConns int                   `json:"tcpConns"` // pods' TCP connections open now
}

// Proxy is the DNS proxy: a UDP socket and a TCP listener on one port.
type Proxy struct {
	cfg    Config
	policy Policy
	addr   netip.AddrPort
	udp    *net.UDPConn
	tcp    *net.TCPListener
	raw    *net.IPConn // Transparent: answers from a port other than the listener's

	ctx    context.Context // cancelled by Close: upstream exchanges end
	cancel context.CancelFunc

	mu      sync.Mutex
	closed  bool
	serving bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup // Serve's loops, connections, queries

	closeOnce sync.Once
	closeErr  error

	inFlight, tcpConns atomic.Int64
	queries, allowed, refused, forwarded,
	upstreamErrors, learnErrors atomic.Uint64
	drops [len(dropReasons)]atomic.Uint64
}

// New opens the proxy's sockets in Config.Netns (the caller's namespace if empty); Serve
// then serves them.
func New(cfg Config, p Policy) (*Proxy, error) {
	if p == nil {
		return nil, errors.New("dnsproxy: no policy")
	}
	if !cfg.ListenAddr.IsValid() {
		return nil, errors.New("dnsproxy: no listen address")
	}
	cfg.ListenAddr = netip.AddrPortFrom(cfg.ListenAddr.Addr().Unmap(), cfg.ListenAddr.Port())
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxTCPConns <= 0 {
		cfg.MaxTCPConns = DefaultMaxTCPConns
	}
	if cfg.TCPIdleTimeout <= 0 {
		cfg.TCPIdleTimeout = DefaultTCPIdleTimeout
	}
	px := &Proxy{cfg: cfg, policy: p, conns: map[net.Conn]struct{}{}}
	px.ctx, px.cancel = context.WithCancel(context.Background())
	if err := px.open(); err != nil {
		px.cancel()
		return nil, fmt.Errorf("dnsproxy on %s: %w", cfg.ListenAddr, err)
	}
	return px, nil
}

// Addr is the bound address (UDP and TCP on the same port).
func (p *Proxy) Addr() netip.AddrPort { return p.addr }

// Serve serves queries until ctx is done or Close is called (then it returns nil), or a
// socket fails (then it closes the proxy and returns the error). It returns when every
// query it started has been handled.
func (p *Proxy) Serve(ctx context.Context) error {
	p.mu.Lock()
	switch {
	case p.closed:
		p.mu.Unlock()
		return fmt.Errorf("dnsproxy: serve: %w", net.ErrClosed)
	case p.serving:
		p.mu.Unlock()
		return errors.New("dnsproxy: already serving")
	}
	p.serving = true
	p.wg.Add(2)
	p.mu.Unlock()

	stop := context.AfterFunc(ctx, func() { p.Close() })
	defer stop()
	errc := make(chan error, 2)
	go func() { defer p.wg.Done(); errc <- p.serveUDP() }()
	go func() { defer p.wg.Done(); errc <- p.serveTCP() }()
	err := <-errc
	// Either loop ends only when its socket is closed or fails; the other goes with it.
	p.Close()
	return errors.Join(err, <-errc)
}

// Close closes the sockets, ends the upstream exchanges of queries in flight and waits
// for them (and for Learn calls under way) to finish.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.cancel()
		p.mu.Lock()
		p.closed = true
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		var errs []error
		if p.udp != nil {
			errs = append(errs, p.udp.Close())
		}
		if p.tcp != nil {
			errs = append(errs, p.tcp.Close())
		}
		if p.raw != nil {
			errs = append(errs, p.raw.Close())
		}
		p.closeErr = errors.Join(errs...)
	})
	p.wg.Wait()
	return p.closeErr
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	s := Stats{
		Queries:        p.queries.Load(),
		Allowed:        p.allowed.Load(),
		Refused:        p.refused.Load(),
		Forwarded:      p.forwarded.Load(),
		UpstreamErrors: p.upstreamErrors.Load(),
		LearnErrors:    p.learnErrors.Load(),
		Drops:          map[DropReason]uint64{},
		InFlight:       int(p.inFlight.Load()),
		TCPConns:       int(p.tcpConns.Load()),
	}
	for i, r := range dropReasons {
		if n := p.drops[i].Load(); n > 0 {
			s.Drops[r] = n
		}
	}
	return s
}

func (p *Proxy) countDrop(r DropReason) {
	for i, d := range dropReasons {
		if d == r {
			p.drops[i].Add(1)
			return
		}
	}
}

// acquire takes a slot of MaxInFlight, or says there is none.
func (p *Proxy) acquire() bool {
	if p.inFlight.Add(1) > int64(p.cfg.MaxInFlight) {
		p.inFlight.Add(-1)
		return false
	}
	return true
}

func (p *Proxy) release() { p.inFlight.Add(-1) }

// dropped counts and reports a query dropped before it was handled.
func (p *Proxy) dropped(start time.Time, q Query, r DropReason) {
	p.countDrop(r)
	p.emit(Event{Time: start, Query: q, Verdict: VerdictDropped, Reason: r, Rcode: -1, Latency: time.Since(start)})
}

func (p *Proxy) emit(ev Event) {
	if p.cfg.OnEvent != nil {
		p.cfg.OnEvent(ev)
	}
}

// handle answers one query: b is the query as the pod sent it (the proxy's own copy),
// reply sends an answer to the pod.
func (p *Proxy) handle(start time.Time, q Query, b []byte, reply func([]byte) error) {
	ev := Event{Time: start, Query: q, Rcode: -1}
	defer func() {
		ev.Latency = time.Since(start)
		p.emit(ev)
	}()
	send := func(out []byte, rcode int) {
		if err := reply(out); err != nil {
			p.countDrop(DropReplyFailed)
			ev.Err = errors.Join(ev.Err, fmt.Errorf("sending the answer to %s: %w", q.Source, err))
			return
		}
		ev.Rcode = rcode
	}

	req, rcode := parseQuery(b)
	if req == nil {
		p.countDrop(DropMalformed)
		ev.Verdict, ev.Reason = VerdictDropped, DropMalformed
		if rcode >= 0 {
			send(headerReply(b, rcode), rcode)
		}
		return
	}
	question := req.Question[0]
	q.Name, q.Type = fqdn.Canonical(question.Name), question.Qtype
	ev.Query = q

	allowed, rule := p.policy.Allow(q)
	ev.Rule = rule
	if !allowed {
		p.refused.Add(1)
		ev.Verdict = VerdictRefused
		send(errorReply(req, dns.RcodeRefused), dns.RcodeRefused)
		return
	}
	p.allowed.Add(1)
	ev.Verdict = VerdictAllowed

	target := q.Server
	if p.cfg.Upstream != nil {
		target = p.cfg.Upstream(q.Server)
	}
	ev.Upstream = target
	raw, resp, err := p.exchange(q.Protocol, target, b, req)
	if err != nil {
		p.upstreamErrors.Add(1)
		ev.Err = fmt.Errorf("asking %s: %w", target, err)
		send(errorReply(req, dns.RcodeServerFailure), dns.RcodeServerFailure)
		return
	}
	if answers := extract(q.Name, resp); len(answers) > 0 {
		ev.Answers = answers
		if err := p.policy.Learn(q, answers); err != nil {
			p.learnErrors.Add(1)
			ev.Err = fmt.Errorf("learning the answer: %w", err)
			send(errorReply(req, dns.RcodeServerFailure), dns.RcodeServerFailure)
			return
		}
	}
	p.forwarded.Add(1)
	send(raw, resp.Rcode)
}
