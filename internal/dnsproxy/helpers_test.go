package dnsproxy

import (
	"context"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/testenv"
)

// waitFor is how long tests wait for something that should happen at once: long, so
// that a loaded machine does not fail them, and only reached when something is wrong.
const waitFor = 10 * time.Second

// testServer is a DNS server on UDP and TCP (one port) that answers from zone and counts
// what it was asked.
type testServer struct {
	addr    netip.AddrPort
	udp     *dns.Server
	tcp     *dns.Server
	mu      sync.Mutex
	asked   map[string]int // canonical name -> queries
	release chan struct{}  // closed at cleanup: unblocks handlers that never answer
}

// Names of the test zone.
const (
	nameChain    = "www.example.com"      // CNAME web.example.com (300) CNAME edge.cdn.net (60), A x2 (120), AAAA (90)
	nameDirect   = "direct.example.com"   // A (30)
	nameSpoofed  = "spoofed.example.com"  // A (45), plus records of other names in every section
	nameSilent   = "silent.example.com"   // never answered
	nameTrunc    = "big.example.com"      // UDP: TC with one of three addresses; TCP: all three
	nameMismatch = "mismatch.example.com" // UDP: a response with another ID and one with another question, then the right one
	nameNX       = "nx.example.com"       // NXDOMAIN
)

func (s *testServer) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	if len(req.Question) != 1 {
		return
	}
	q := req.Question[0]
	n := fqdn.Canonical(q.Name)
	s.mu.Lock()
	s.asked[n]++
	s.mu.Unlock()
	tcp := w.LocalAddr().Network() == "tcp"
	r := new(dns.Msg)
	r.SetReply(req)
	r.Authoritative = true
	switch n {
	case nameChain:
		r.Answer = []dns.RR{rrCNAME(q.Name, 300, "web.example.com"), rrCNAME("web.example.com", 60, "edge.cdn.net")}
		if q.Qtype == dns.TypeA {
			r.Answer = append(r.Answer, rrA("edge.cdn.net", 120, "198.18.0.10"), rrA("edge.cdn.net", 120, "198.18.0.11"))
		} else if q.Qtype == dns.TypeAAAA {
			r.Answer = append(r.Answer, rrAAAA("edge.cdn.net", 90, "2001:db8::10"))
		}
	case nameDirect:
		r.Answer = []dns.RR{rrA(q.Name, 30, "198.18.0.20")}
	case nameSpoofed:
		r.Answer = []dns.RR{
			rrA("evil.example.org", 3600, "198.18.6.1"), rrA(q.Name, 45, "198.18.0.30"),
			rrCNAME("other.example.com", 3600, "evil.example.org"), rrA("spoofed.example.com.evil.org", 3600, "198.18.6.2"),
		}
		r.Ns = []dns.RR{&dns.NS{Hdr: dns.RR_Header{Name: "example.com.", Rrtype: dns.TypeNS, Class: dns.ClassINET, Ttl: 3600}, Ns: "ns.evil.org."}}
		r.Extra = []dns.RR{rrA("ns.evil.org", 3600, "198.18.6.3"), rrA(q.Name, 3600, "198.18.6.4")}
	case nameSilent:
		<-s.release
		return
	case nameTrunc:
		r.Answer = []dns.RR{rrA(q.Name, 10, "198.18.0.40")}
		if tcp {
			r.Answer = append(r.Answer, rrA(q.Name, 10, "198.18.0.41"), rrA(q.Name, 10, "198.18.0.42"))
		} else {
			r.Truncated = true
		}
	case nameMismatch:
		if !tcp {
			other := r.Copy()
			other.Id++
			other.Answer = []dns.RR{rrA(q.Name, 5, "198.18.6.5")}
			w.WriteMsg(other)
			other = r.Copy()
			other.Question[0].Name = "evil.example.org."
			other.Answer = []dns.RR{rrA("evil.example.org", 5, "198.18.6.6")}
			w.WriteMsg(other)
		}
		r.Answer = []dns.RR{rrA(q.Name, 5, "198.18.0.50")}
	case nameNX:
		r.Rcode = dns.RcodeNameError
	default:
		r.Rcode = dns.RcodeNameError
	}
	w.WriteMsg(r)
}

func (s *testServer) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked[name]
}

// startServer starts a test server on addr (port 0: any), in the namespace at nsPath ("":
// the test's own), stopped when the test ends.
func startServer(t *testing.T, nsPath string, addr netip.AddrPort) *testServer {
	t.Helper()
	s := &testServer{asked: map[string]int{}, release: make(chan struct{})}
	var (
		pc net.PacketConn
		ln net.Listener
	)
	err := testenv.InNetns(nsPath, func() error {
		for attempt := 0; ; attempt++ {
			var err error
			if pc, err = net.ListenPacket("udp", addr.String()); err != nil {
				return err
			}
			s.addr = addrPortOf(pc.LocalAddr())
			if ln, err = net.Listen("tcp", s.addr.String()); err == nil {
				return nil
			}
			pc.Close()
			// The port UDP got may be taken for TCP.
			if addr.Port() != 0 || attempt == 10 {
				return err
			}
		}
	})
	if err != nil {
		t.Fatalf("test server: %v", err)
	}
	started := make(chan struct{}, 2)
	s.udp = &dns.Server{PacketConn: pc, Handler: s, NotifyStartedFunc: func() { started <- struct{}{} }}
	s.tcp = &dns.Server{Listener: ln, Handler: s, NotifyStartedFunc: func() { started <- struct{}{} }}
	go s.udp.ActivateAndServe()
	go s.tcp.ActivateAndServe()
	for range 2 {
		select {
		case <-started:
		case <-time.After(waitFor):
			t.Fatal("test server did not start")
		}
	}
	t.Cleanup(func() {
		close(s.release)
		s.udp.Shutdown()
		s.tcp.Shutdown()
	})
	return s
}

// testPolicy allows names under example.com and cdn.net except those starting with
// "denied", and records Learn calls.
type testPolicy struct {
	mu      sync.Mutex
	allowed []Query
	learnt  []learnCall
	// gate, if set, makes Allow wait until it is closed, after sending the query to
	// entered.
	gate    chan struct{}
	entered chan Query
}

type learnCall struct {
	q       Query
	answers []Answer
}

func (p *testPolicy) Allow(q Query) (bool, string) {
	p.mu.Lock()
	p.allowed = append(p.allowed, q)
	gate := p.gate
	p.mu.Unlock()
	if gate != nil {
		p.entered <- q
		<-gate
	}
	switch {
	case strings.HasPrefix(q.Name, "denied"):
		return false, "no rule"
	case strings.HasSuffix(q.Name, ".example.com") || strings.HasSuffix(q.Name, ".cdn.net"):
		return true, "matchPattern:**.example.com"
	}
	return false, "no rule"
}

func (p *testPolicy) Learn(q Query, answers []Answer) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.learnt = append(p.learnt, learnCall{q, answers})
	return nil
}

// checkLearntOnce fails the test unless the policy learnt once, the answers want.
func (p *testPolicy) checkLearntOnce(t *testing.T, want []Answer) {
	t.Helper()
	if l := p.learns(); len(l) != 1 || !reflect.DeepEqual(l[0].answers, want) {
		t.Errorf("learnt %+v, want %+v", l, want)
	}
}

func (p *testPolicy) learns() []learnCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.learnt)
}

// events collects a proxy's events.
type events struct {
	mu sync.Mutex
	ev []Event
}

func (e *events) add(ev Event) {
	e.mu.Lock()
	e.ev = append(e.ev, ev)
	e.mu.Unlock()
}

func (e *events) all() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.ev)
}

// startProxy makes a proxy with cfg (listening on 127.0.0.1:0 unless set, sending every
// query to upstream if set) and serves it until the test ends, when Serve must return nil.
// startLocal starts a test server and a proxy with cfg and pol in front of it, both on
// loopback.
func startLocal(t *testing.T, cfg Config, pol Policy) (*testServer, *Proxy) {
	t.Helper()
	srv := startServer(t, "", netip.MustParseAddrPort("127.0.0.1:0"))
	return srv, startProxy(t, cfg, pol, srv.addr)
}

func startProxy(t *testing.T, cfg Config, pol Policy, upstream netip.AddrPort) *Proxy {
	t.Helper()
	if !cfg.ListenAddr.IsValid() {
		cfg.ListenAddr = netip.MustParseAddrPort("127.0.0.1:0")
	}
	if upstream.IsValid() && cfg.Upstream == nil {
		cfg.Upstream = func(netip.AddrPort) netip.AddrPort { return upstream }
	}
	p, err := New(cfg, pol)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(context.Background()) }()
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(waitFor):
			t.Errorf("Serve did not return after Close")
		}
	})
	return p
}

// ask sends one query to the proxy over network ("udp" or "tcp") and returns the answer.
func ask(t *testing.T, network string, to netip.AddrPort, name string, qtype uint16) *dns.Msg {
	t.Helper()
	r, err := tryAsk(network, to, name, qtype, waitFor)
	if err != nil {
		t.Fatalf("asking %s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	return r
}

func tryAsk(network string, to netip.AddrPort, name string, qtype uint16, timeout time.Duration) (*dns.Msg, error) {
	c := dns.Client{Net: network, Timeout: timeout}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(1232, false)
	r, _, err := c.Exchange(m, to.String())
	return r, err
}

// eventually polls cond until it holds, or fails the test.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !testenv.Eventually(waitFor, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func answerAddrs(m *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range m.Answer {
		switch r := rr.(type) {
		case *dns.A:
			a, _ := netip.AddrFromSlice(r.A.To4())
			out = append(out, a)
		case *dns.AAAA:
			a, _ := netip.AddrFromSlice(r.AAAA)
			out = append(out, a)
		}
	}
	return out
}
