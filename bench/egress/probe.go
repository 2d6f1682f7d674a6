package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/endpoint"
)

// Prober sends ICMP echo requests from a network namespace to one address at a fixed
// interval and records which were answered. It times set-up: the filter is in place from
// the first request after which no request is answered any more.
//
// Every request carries an echo identifier of its own, so that each one is a new flow to
// every stateful filter (Rampart's conntrack keys ICMP echo by identifier, and a filter
// must not be judged by a flow it admitted before the rule existed). The original
// benchmark polled with one ping at a time and a 1 ms pause; a steady stream at the same
// interval has the same resolution without a per-probe timeout.
type Prober struct {
	fd       int
	target   netip.Addr
	interval time.Duration
	idBase   uint16
	stop     chan struct{}
	done     sync.WaitGroup

	mu       sync.Mutex
	sent     []time.Time // by probe number
	answered []bool
	lastAns  int // highest answered probe number, -1 for none
	maxRTT   time.Duration
	sendErrs int
}

// StartProber opens a raw ICMP (or, for an IPv6 target, ICMPv6) socket inside the network
// namespace at nsPath and starts probing target every interval.
func StartProber(nsPath string, target netip.Addr, interval time.Duration) (*Prober, error) {
	if !target.IsValid() || target.Is4In6() {
		return nil, fmt.Errorf("probe target %v is not an IPv4 or IPv6 address", target)
	}
	if interval <= 0 {
		return nil, errors.New("probe interval must be positive")
	}
	p := &Prober{target: target, interval: interval, stop: make(chan struct{}), lastAns: -1}
	domain, proto := unix.AF_INET, unix.IPPROTO_ICMP
	if target.Is6() {
		domain, proto = unix.AF_INET6, unix.IPPROTO_ICMPV6
	}
	var seed [2]byte
	if _, err := unix.Getrandom(seed[:], 0); err == nil {
		p.idBase = binary.BigEndian.Uint16(seed[:])
	}
	// A socket belongs to the namespace it was created in, whatever thread uses it later.
	err := endpoint.Do(nsPath, func() error {
		fd, err := unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		p.fd = fd
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("opening ICMP socket in %s: %w", nsPath, err)
	}
	// Reads wake up every 50 ms so that Stop does not wait for a packet.
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(p.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(p.fd)
		return nil, fmt.Errorf("setting ICMP socket timeout: %w", err)
	}
	p.done.Add(2)
	go p.sendLoop()
	go p.recvLoop()
	return p, nil
}

// Stop ends probing and closes the socket.
func (p *Prober) Stop() {
	select {
	case <-p.stop:
		return
	default:
	}
	close(p.stop)
	p.done.Wait()
	unix.Close(p.fd)
}

func (p *Prober) sendLoop() {
	defer p.done.Done()
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	var to unix.Sockaddr = &unix.SockaddrInet6{Addr: p.target.As16()}
	if p.target.Is4() {
		to = &unix.SockaddrInet4{Addr: p.target.As4()}
	}
	for k := 0; ; k++ {
		pkt := echoRequest(p.target.Is6(), p.idBase+uint16(k), uint16(k), uint64(k))
		p.mu.Lock()
		p.sent = append(p.sent, time.Now())
		p.answered = append(p.answered, false)
		p.mu.Unlock()
		// A filter in the sender's own stack (iptables, nftables) makes sendto fail with
		// EPERM; one at tc may report ENOBUFS. Either way the probe is unanswered.
		if err := unix.Sendto(p.fd, pkt, 0, to); err != nil {
			p.mu.Lock()
			p.sendErrs++
			p.mu.Unlock()
		}
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
	}
}

func (p *Prober) recvLoop() {
	defer p.done.Done()
	buf := make([]byte, 1500)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		n, from, err := unix.Recvfrom(p.fd, buf, 0)
		if err != nil {
			continue // timeout (EAGAIN) or interrupted: check stop and read again
		}
		k, ok := p.parseReply(buf[:n], from)
		if !ok {
			continue
		}
		now := time.Now()
		p.mu.Lock()
		if k < len(p.answered) && !p.answered[k] {
			p.answered[k] = true
			p.lastAns = max(p.lastAns, k)
			p.maxRTT = max(p.maxRTT, now.Sub(p.sent[k]))
		}
		p.mu.Unlock()
	}
}

// ICMP and ICMPv6 echo types.
const (
	icmpEchoRequest, icmpEchoReply   = 8, 0
	icmp6EchoRequest, icmp6EchoReply = 128, 129
)

// echoRequest builds an ICMP (ipv6: ICMPv6) echo request whose payload is the probe
// number. An ICMPv6 checksum covers a pseudo-header with the addresses: the kernel fills
// it in on a raw ICMPv6 socket.
func echoRequest(ipv6 bool, id, seq uint16, k uint64) []byte {
	b := make([]byte, 16)
	b[0] = icmpEchoRequest
	if ipv6 {
		b[0] = icmp6EchoRequest
	}
	binary.BigEndian.PutUint16(b[4:], id)
	binary.BigEndian.PutUint16(b[6:], seq)
	binary.BigEndian.PutUint64(b[8:], k)
	if !ipv6 {
		binary.BigEndian.PutUint16(b[2:], checksum(b))
	}
	return b
}

// parseReply reads what a raw socket received (an IPv4 packet; on an ICMPv6 socket the
// ICMPv6 message alone, the sender in from) and returns the probe number of an echo reply
// from the target to one of this prober's requests.
func (p *Prober) parseReply(b []byte, from unix.Sockaddr) (int, bool) {
	if p.target.Is6() {
		sa, ok := from.(*unix.SockaddrInet6)
		if !ok || sa.Addr != p.target.As16() {
			return 0, false
		}
		return p.parseEcho(b, icmp6EchoReply)
	}
	if len(b) < 20 || b[0]>>4 != 4 {
		return 0, false
	}
	ihl := int(b[0]&0x0f) * 4
	if len(b) < ihl || [4]byte(b[12:16]) != p.target.As4() {
		return 0, false
	}
	return p.parseEcho(b[ihl:], icmpEchoReply)
}

// parseEcho reads an ICMP message: an echo reply (of type reply) to one of this prober's
// requests gives its probe number.
func (p *Prober) parseEcho(icmp []byte, reply byte) (int, bool) {
	if len(icmp) < 16 || icmp[0] != reply || icmp[1] != 0 {
		return 0, false
	}
	k := binary.BigEndian.Uint64(icmp[8:16])
	if k > 1<<40 || binary.BigEndian.Uint16(icmp[4:6]) != p.idBase+uint16(k) {
		return 0, false
	}
	return int(k), true
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// WaitAnswered waits until a probe sent after the call is answered: the target is
// reachable now.
func (p *Prober) WaitAnswered(timeout time.Duration) error {
	p.mu.Lock()
	from := len(p.sent)
	p.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		ok := p.lastAns >= from
		p.mu.Unlock()
		if ok {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("no echo reply from %v within %v", p.target, timeout)
}

// quietFor is how long no probe may have been answered before the target counts as
// blocked: well above any round trip through these namespaces, also under load.
const quietFor = 300 * time.Millisecond

// WaitBlocked waits until the target has stopped answering and returns when that started,
// relative to t0 (when the set-up command was started): the send time of the first probe
// after the last answered one. It requires that no probe has been answered for quietFor
// (or for ten times the slowest round trip seen, if longer) and that the first
// unanswered probe was sent after t0 (a target that was unreachable before the command
// ran says nothing about the filter).
func (p *Prober) WaitBlocked(t0 time.Time, timeout time.Duration, abort func() error) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		p.mu.Lock()
		first := p.lastAns + 1
		var at time.Time
		if first < len(p.sent) {
			at = p.sent[first]
		}
		quiet := max(quietFor, 10*p.maxRTT)
		p.mu.Unlock()
		if !at.IsZero() && time.Since(at) >= quiet {
			if at.Before(t0) {
				return 0, fmt.Errorf("the probe target stopped answering %v before the set-up command started", t0.Sub(at))
			}
			return at.Sub(t0), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("probes to %v still answered %v after the set-up command started", p.target, time.Since(t0).Round(time.Millisecond))
		}
		if abort != nil {
			if err := abort(); err != nil {
				return 0, err
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Counts returns how many probes were sent, answered, and failed to send.
func (p *Prober) Counts() (sent, answered, sendErrs int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.answered {
		if a {
			answered++
		}
	}
	return len(p.sent), answered, p.sendErrs
}
