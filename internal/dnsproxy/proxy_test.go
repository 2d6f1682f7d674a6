package dnsproxy

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestAllowedForwardedAndLearnt(t *testing.T) {
	pol := &testPolicy{}
	var ev events
	srv, p := startLocal(t, Config{OnEvent: ev.add}, pol)

	want := func(addrs []netip.Addr, ttl time.Duration) []Answer {
		var out []Answer
		for _, n := range []string{"www.example.com", "web.example.com", "edge.cdn.net"} {
			out = append(out, Answer{Name: n, Addrs: addrs, TTL: ttl})
		}
		return out
	}
	for i, c := range []struct {
		network string
		proto   uint8
		qtype   uint16
		want    []Answer
	}{
		{"udp", ProtoUDP, dns.TypeA, want(addrs("198.18.0.10", "198.18.0.11"), 60*time.Second)},
		{"tcp", ProtoTCP, dns.TypeA, want(addrs("198.18.0.10", "198.18.0.11"), 60*time.Second)},
		{"udp", ProtoUDP, dns.TypeAAAA, want(addrs("2001:db8::10"), 60*time.Second)},
	} {
		r := ask(t, c.network, p.Addr(), "WWW.Example.COM", c.qtype)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != len(c.want[0].Addrs)+2 {
			t.Fatalf("%s %s: answer %v", c.network, dns.TypeToString[c.qtype], r)
		}
		learns := pol.learns()
		if len(learns) != i+1 {
			t.Fatalf("%d Learn calls, want %d", len(learns), i+1)
		}
		l := learns[i]
		if !reflect.DeepEqual(l.answers, c.want) {
			t.Errorf("%s %s: learnt %+v, want %+v", c.network, dns.TypeToString[c.qtype], l.answers, c.want)
		}
		if l.q.Name != "www.example.com" || l.q.Type != c.qtype || l.q.Protocol != c.proto ||
			l.q.Server != p.Addr() || l.q.Source.Addr() != netip.MustParseAddr("127.0.0.1") {
			t.Errorf("Learn's query: %+v", l.q)
		}
	}
	if n := srv.count("www.example.com"); n != 3 {
		t.Errorf("server asked %d times, want 3", n)
	}
	// A query's slot is given back just after its answer is out.
	eventually(t, "no query in flight", func() bool { return p.Stats().InFlight == 0 })
	s := p.Stats()
	if s.Queries != 3 || s.Allowed != 3 || s.Forwarded != 3 || s.Refused != 0 || len(s.Drops) != 0 {
		t.Errorf("stats %+v", s)
	}
	eventually(t, "3 events", func() bool { return len(ev.all()) == 3 })
	e := ev.all()[0]
	if e.Verdict != VerdictAllowed || e.Rcode != dns.RcodeSuccess || e.Upstream != srv.addr ||
		e.Rule != "matchPattern:**.example.com" || len(e.Answers) != 3 || e.Err != nil || e.Latency <= 0 {
		t.Errorf("event %+v", e)
	}
}

func TestRefusedNeverReachServer(t *testing.T) {
	pol := &testPolicy{}
	var ev events
	srv, p := startLocal(t, Config{OnEvent: ev.add}, pol)
	for _, network := range []string{"udp", "tcp"} {
		for _, name := range []string{"denied.example.com", "www.example.org"} {
			r := ask(t, network, p.Addr(), name, dns.TypeA)
			if r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 || len(r.Question) != 1 {
				t.Errorf("%s over %s: %v", name, network, r)
			}
			// The client asked with EDNS: the refusal says why.
			if opt := r.IsEdns0(); opt == nil || !strings.Contains(opt.String(), "Prohibited") {
				t.Errorf("%s over %s: no EDE Prohibited in %v", name, network, r)
			}
			if n := srv.count(name); n != 0 {
				t.Errorf("%s reached the server %d times", name, n)
			}
		}
	}
	if l := pol.learns(); len(l) != 0 {
		t.Errorf("Learn called: %+v", l)
	}
	if s := p.Stats(); s.Refused != 4 || s.Allowed != 0 {
		t.Errorf("stats %+v", s)
	}
	eventually(t, "4 events", func() bool { return len(ev.all()) == 4 })
	for _, e := range ev.all() {
		if e.Verdict != VerdictRefused || e.Rcode != dns.RcodeRefused || e.Rule != "no rule" || e.Upstream.IsValid() {
			t.Errorf("event %+v", e)
		}
	}
}

func TestLearnErrorServfail(t *testing.T) {
	var ev events
	_, p := startLocal(t, Config{OnEvent: ev.add}, &failLearn{})
	for _, network := range []string{"udp", "tcp"} {
		r := ask(t, network, p.Addr(), nameDirect, dns.TypeA)
		if r.Rcode != dns.RcodeServerFailure || len(r.Answer) != 0 {
			t.Errorf("over %s: %v", network, r)
		}
	}
	if s := p.Stats(); s.LearnErrors != 2 || s.Forwarded != 0 || s.Allowed != 2 {
		t.Errorf("stats %+v", s)
	}
	eventually(t, "events", func() bool { return len(ev.all()) == 2 })
	if e := ev.all()[1]; e.Rcode != dns.RcodeServerFailure || e.Err == nil || len(e.Answers) != 1 {
		t.Errorf("event %+v", e)
	}
}

// failLearn allows as testPolicy does, and fails every Learn.
type failLearn struct{ testPolicy }

func (f *failLearn) Learn(Query, []Answer) error { return io.ErrClosedPipe }

func TestUpstreamTimeoutServfail(t *testing.T) {
	const timeout = 300 * time.Millisecond
	_, p := startLocal(t, Config{UpstreamTimeout: timeout}, &testPolicy{})
	for _, network := range []string{"udp", "tcp"} {
		start := time.Now()
		r := ask(t, network, p.Addr(), nameSilent, dns.TypeA)
		took := time.Since(start)
		if r.Rcode != dns.RcodeServerFailure {
			t.Errorf("over %s: %v", network, r)
		}
		// Not before the timeout; and soon after it, with room for a loaded machine.
		if took < timeout || took > timeout+2*time.Second {
			t.Errorf("over %s: SERVFAIL after %v, timeout %v", network, took, timeout)
		}
	}
	if s := p.Stats(); s.UpstreamErrors != 2 || s.Forwarded != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestUpstreamUnreachableServfail(t *testing.T) {
	// A port nothing listens on: UDP gets ICMP port unreachable, TCP a reset.
	l, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := addrPortOf(l.LocalAddr())
	l.Close()
	p := startProxy(t, Config{UpstreamTimeout: 5 * time.Second}, &testPolicy{}, dead)
	for _, network := range []string{"udp", "tcp"} {
		start := time.Now()
		if r := ask(t, network, p.Addr(), nameDirect, dns.TypeA); r.Rcode != dns.RcodeServerFailure {
			t.Errorf("over %s: %v", network, r)
		}
		if took := time.Since(start); took > 4*time.Second {
			t.Errorf("over %s: SERVFAIL after %v, not at once", network, took)
		}
	}
}

func TestNoLoopToItself(t *testing.T) {
	p := startProxy(t, Config{}, &testPolicy{}, netip.AddrPort{})
	if r := ask(t, "udp", p.Addr(), nameDirect, dns.TypeA); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("query to the proxy itself: %v", r)
	}
	if s := p.Stats(); s.Queries != 1 || s.UpstreamErrors != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestSpoofedRecordsLearnNothingExtra(t *testing.T) {
	pol := &testPolicy{}
	_, p := startLocal(t, Config{}, pol)
	r := ask(t, "udp", p.Addr(), nameSpoofed, dns.TypeA)
	// The pod gets the response as the server sent it ...
	if len(r.Answer) != 4 || len(r.Extra) < 2 {
		t.Fatalf("answer %v", r)
	}
	// ... but only the asked name's own address is learnt.
	want := []Answer{{Name: nameSpoofed, Addrs: addrs("198.18.0.30"), TTL: 45 * time.Second}}
	pol.checkLearntOnce(t, want)
}

func TestResponseMismatchDropped(t *testing.T) {
	pol := &testPolicy{}
	_, p := startLocal(t, Config{}, pol)
	r := ask(t, "udp", p.Addr(), nameMismatch, dns.TypeA)
	if got := answerAddrs(r); !slices.Equal(got, addrs("198.18.0.50")) {
		t.Errorf("answer %v", r)
	}
	want := []Answer{{Name: nameMismatch, Addrs: addrs("198.18.0.50"), TTL: 5 * time.Second}}
	pol.checkLearntOnce(t, want)
	if d := p.Stats().Drops; d[DropResponseMismatch] != 2 {
		t.Errorf("drops %v, want 2 %s", d, DropResponseMismatch)
	}
}

func TestTruncatedPassedAndLearnt(t *testing.T) {
	pol := &testPolicy{}
	_, p := startLocal(t, Config{}, pol)
	r := ask(t, "udp", p.Addr(), nameTrunc, dns.TypeA)
	if !r.Truncated || len(r.Answer) != 1 {
		t.Fatalf("UDP answer %v", r)
	}
	r = ask(t, "tcp", p.Addr(), nameTrunc, dns.TypeA)
	if r.Truncated || len(r.Answer) != 3 {
		t.Fatalf("TCP answer %v", r)
	}
	l := pol.learns()
	if len(l) != 2 || !slices.Equal(l[0].answers[0].Addrs, addrs("198.18.0.40")) ||
		!slices.Equal(l[1].answers[0].Addrs, addrs("198.18.0.40", "198.18.0.41", "198.18.0.42")) {
		t.Errorf("learnt %+v", l)
	}
}

func TestNXDomainLearnsNothing(t *testing.T) {
	pol := &testPolicy{}
	_, p := startLocal(t, Config{}, pol)
	if r := ask(t, "udp", p.Addr(), nameNX, dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("answer %v", r)
	}
	if l := pol.learns(); len(l) != 0 {
		t.Errorf("learnt %+v", l)
	}
	if s := p.Stats(); s.Forwarded != 1 {
		t.Errorf("stats %+v", s)
	}
}

// sendRaw sends b to the proxy over UDP and returns its answer, or nil if none came within
// wait.
func sendRaw(t *testing.T, to netip.AddrPort, b []byte, wait time.Duration) []byte {
	t.Helper()
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

func TestMalformedQueries(t *testing.T) {
	var ev events
	srv, p := startLocal(t, Config{OnEvent: ev.add}, &testPolicy{})
	q := new(dns.Msg)
	q.SetQuestion(nameDirect+".", dns.TypeA)
	good, _ := q.Pack()
	mod := func(f func([]byte)) []byte {
		b := slices.Clone(good)
		f(b)
		return b
	}
	// Those answered: FORMERR or NOTIMP with the query's ID.
	for _, c := range []struct {
		name  string
		b     []byte
		rcode int
	}{
		{"two questions", mod(func(b []byte) { binary.BigEndian.PutUint16(b[4:], 2) }), dns.RcodeFormatError},
		{"cut name", good[:len(good)-6], dns.RcodeFormatError},
		{"opcode update", mod(func(b []byte) { b[2] |= dns.OpcodeUpdate << 3 }), dns.RcodeNotImplemented},
	} {
		out := sendRaw(t, p.Addr(), c.b, waitFor)
		r := new(dns.Msg)
		if err := r.Unpack(out); err != nil || r.Id != q.Id || r.Rcode != c.rcode || !r.Response {
			t.Errorf("%s: answer %v (%v)", c.name, r, err)
		}
	}
	// Those not answered: no header, or a response. To know they were handled without
	// waiting for an answer that does not come, poll the counter.
	for i, b := range [][]byte{{1, 2, 3}, mod(func(b []byte) { b[2] |= 0x80 })} {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(p.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		c.Write(b)
		c.Close()
		eventually(t, "malformed drop", func() bool { return p.Stats().Drops[DropMalformed] == uint64(4+i) })
	}
	// Over TCP: a zero-length message, then a good query on the same connection.
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{0, 0})
	eventually(t, "malformed TCP drop", func() bool { return p.Stats().Drops[DropMalformed] == 6 })
	co := &dns.Conn{Conn: c}
	c.SetDeadline(time.Now().Add(waitFor))
	if err := co.WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	if r, err := co.ReadMsg(); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Errorf("good query after a malformed one: %v, %v", r, err)
	}
	if s := p.Stats(); s.Queries != 7 || s.Allowed != 1 || srv.count(nameDirect) != 1 {
		t.Errorf("stats %+v", s)
	}
	eventually(t, "events", func() bool { return len(ev.all()) == 7 })
	for _, e := range ev.all()[:6] {
		if e.Verdict != VerdictDropped || e.Reason != DropMalformed {
			t.Errorf("event %+v", e)
		}
	}
}

func TestOversizedQueries(t *testing.T) {
	p := startProxy(t, Config{}, &testPolicy{}, netip.MustParseAddrPort("127.0.0.1:1"))
	big := make([]byte, MaxQuerySize+1)
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(p.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(big)
	eventually(t, "oversized UDP drop", func() bool { return p.Stats().Drops[DropOversized] == 1 })

	tc, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	var l [2]byte
	binary.BigEndian.PutUint16(l[:], MaxQuerySize+1)
	tc.Write(l[:])
	// The proxy closes the connection without reading the message.
	tc.SetReadDeadline(time.Now().Add(waitFor))
	if n, err := tc.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("connection open after an oversized message: %d, %v", n, err)
	}
	if d := p.Stats().Drops; d[DropOversized] != 2 {
		t.Errorf("drops %v", d)
	}
}

func TestInFlightLimit(t *testing.T) {
	pol := &testPolicy{gate: make(chan struct{}), entered: make(chan Query, 8)}
	srv, p := startLocal(t, Config{MaxInFlight: 2}, pol)
	results := make(chan *dns.Msg, 4)
	query := func(network string) {
		r, _ := tryAsk(network, p.Addr(), nameDirect, dns.TypeA, waitFor)
		results <- r
	}
	go query("udp")
	go query("tcp")
	for range 2 {
		select {
		case <-pol.entered:
		case <-time.After(waitFor):
			t.Fatal("queries did not reach Allow")
		}
	}
	if n := p.Stats().InFlight; n != 2 {
		t.Fatalf("in flight %d, want 2", n)
	}
	// A third query, over each protocol, is dropped while both slots are taken.
	for i, network := range []string{"udp", "tcp"} {
		go query(network)
		eventually(t, "in-flight drop", func() bool { return p.Stats().Drops[DropInFlightLimit] == uint64(i+1) })
	}
	select {
	case q := <-pol.entered:
		t.Fatalf("query beyond the limit reached Allow: %+v", q)
	default:
	}
	close(pol.gate)
	for range 2 {
		if r := <-results; r == nil || r.Rcode != dns.RcodeSuccess {
			t.Errorf("answer %v", r)
		}
	}
	eventually(t, "slots released", func() bool { return p.Stats().InFlight == 0 })
	if n := srv.count(nameDirect); n != 2 {
		t.Errorf("server asked %d times, want 2", n)
	}
}

func TestTCPPipelined(t *testing.T) {
	pol := &testPolicy{}
	_, p := startLocal(t, Config{UpstreamTimeout: 5 * time.Second}, pol)
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitFor))
	co := &dns.Conn{Conn: c}
	// Several queries at once on one connection, a refused one among them; each answer
	// carries its query's ID.
	names := []string{nameChain, nameDirect, "denied.example.com", nameSpoofed, nameNX}
	ids := map[uint16]string{}
	for i, n := range names {
		m := new(dns.Msg)
		m.SetQuestion(n+".", dns.TypeA)
		m.Id = uint16(100 + i)
		ids[m.Id] = n
		if err := co.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	for range names {
		r, err := co.ReadMsg()
		if err != nil {
			t.Fatal(err)
		}
		n, ok := ids[r.Id]
		if !ok || r.Question[0].Name != n+"." {
			t.Fatalf("answer %v to no query", r)
		}
		delete(ids, r.Id)
		if want := map[string]int{"denied.example.com": dns.RcodeRefused, nameNX: dns.RcodeNameError}[n]; r.Rcode != want {
			t.Errorf("%s: rcode %d, want %d", n, r.Rcode, want)
		}
	}
	if s := p.Stats(); s.Queries != 5 || s.Refused != 1 || s.Forwarded != 4 || s.TCPConns != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestTCPTimeouts(t *testing.T) {
	p := startProxy(t, Config{TCPIdleTimeout: 500 * time.Millisecond}, &testPolicy{}, netip.MustParseAddrPort("127.0.0.1:1"))
	closed := func(c net.Conn) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(waitFor))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Errorf("connection still open: %v", err)
		}
	}
	// Idle: closed, no drop (no query was under way).
	idle, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	closed(idle)
	// A message that does not come whole: closed, and the query counted as dropped.
	slow, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	slow.Write([]byte{0, 40, 1, 2, 3})
	closed(slow)
	eventually(t, "connections closed", func() bool { return p.Stats().TCPConns == 0 })
	if d := p.Stats().Drops; d[DropTCPTimeout] != 1 || len(d) != 1 {
		t.Errorf("drops %v", d)
	}
}

func TestTCPConnLimit(t *testing.T) {
	p := startProxy(t, Config{MaxTCPConns: 2}, &testPolicy{}, netip.MustParseAddrPort("127.0.0.1:1"))
	var conns []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", p.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	eventually(t, "2 connections", func() bool { return p.Stats().TCPConns == 2 })
	extra, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	extra.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := extra.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("connection beyond the limit open: %v", err)
	}
	if s := p.Stats(); s.Drops[DropTCPConnLimit] != 1 || s.TCPConns != 2 {
		t.Errorf("stats %+v", s)
	}
	// Once one goes, a new one is served.
	conns[0].Close()
	eventually(t, "1 connection", func() bool { return p.Stats().TCPConns == 1 })
	if r := ask(t, "tcp", p.Addr(), "denied.example.com", dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Errorf("answer %v", r)
	}
}

func TestIPv6(t *testing.T) {
	if l, err := net.ListenPacket("udp6", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		l.Close()
	}
	srv := startServer(t, "", netip.MustParseAddrPort("[::1]:0"))
	pol := &testPolicy{}
	p := startProxy(t, Config{ListenAddr: netip.MustParseAddrPort("[::1]:0")}, pol, srv.addr)
	for _, network := range []string{"udp", "tcp"} {
		r := ask(t, network, p.Addr(), nameChain, dns.TypeAAAA)
		if got := answerAddrs(r); !slices.Equal(got, addrs("2001:db8::10")) {
			t.Errorf("over %s: %v", network, r)
		}
	}
	l := pol.learns()
	if len(l) != 2 || l[0].q.Server != p.Addr() || !l[0].q.Source.Addr().Is6() {
		t.Errorf("learnt %+v", l)
	}
}

func TestCloseEndsQueriesInFlight(t *testing.T) {
	srv := startServer(t, "", netip.MustParseAddrPort("127.0.0.1:0"))
	p, err := New(Config{ListenAddr: netip.MustParseAddrPort("127.0.0.1:0"), UpstreamTimeout: time.Minute,
		Upstream: func(netip.AddrPort) netip.AddrPort { return srv.addr }}, &testPolicy{})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(t.Context()) }()
	go tryAsk("udp", p.Addr(), nameSilent, dns.TypeA, waitFor)
	eventually(t, "query in flight", func() bool { return srv.count(nameSilent) == 1 })
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if took := time.Since(start); took > waitFor/2 {
		t.Errorf("Close took %v", took)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if err := p.Serve(t.Context()); err == nil {
		t.Errorf("Serve after Close: no error")
	}
}
