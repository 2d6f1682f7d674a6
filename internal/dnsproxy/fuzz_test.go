package dnsproxy

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/rampartnet/rampart/internal/fqdn"
)

// fuzzQuestion is the query every FuzzResponse input answers.
func fuzzQuestion() *dns.Msg {
	req := new(dns.Msg)
	req.SetQuestion("www.example.com.", dns.TypeA)
	req.Id = 0x1234
	return req
}

// FuzzResponse feeds arbitrary bytes to the path a server's response takes (checkResponse,
// then extract): it must never panic, and never yield an Answer for a name that is not on
// the CNAME chain from the question, or an address that the chain's end does not own.
func FuzzResponse(f *testing.F) {
	req := fuzzQuestion()
	seed := func(truncated bool, rrs ...[]dns.RR) {
		m := new(dns.Msg)
		m.SetReply(req)
		m.Truncated = truncated
		m.Answer = rrs[0]
		if len(rrs) > 1 {
			m.Extra = rrs[1]
		}
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		if len(b) > 20 {
			f.Add(b[:len(b)-5])
		}
	}
	seed(false, []dns.RR{rrA("www.example.com", 60, "198.18.0.1")})
	seed(false, []dns.RR{
		rrCNAME("www.example.com", 300, "web.example.com"), rrCNAME("web.example.com", 60, "edge.cdn.net"),
		rrA("edge.cdn.net", 120, "198.18.0.10"), rrAAAA("edge.cdn.net", 120, "2001:db8::10"),
	})
	seed(false, []dns.RR{rrA("www.example.com", 60, "198.18.0.1"), rrA("evil.example.org", 60, "198.18.6.6")},
		[]dns.RR{rrA("www.example.com", 60, "198.18.6.7")})
	seed(false, []dns.RR{rrCNAME("www.example.com", 1, "a.example.com"), rrCNAME("a.example.com", 1, "www.example.com")})
	seed(true, []dns.RR{rrA("www.example.com", 60, "198.18.0.1")})

	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := checkResponse(req, b); err == nil {
			if m.Id != req.Id || len(m.Question) != 1 {
				t.Fatalf("accepted a response to another query: %v", m)
			}
			checkChain(t, m, extract("www.example.com", m))
		}
		// extract is reached only through checkResponse, but must hold on any message.
		m := new(dns.Msg)
		if m.Unpack(b) == nil {
			checkChain(t, m, extract("www.example.com", m))
		}
	})
}

// checkChain checks answers against m independently of extract: the first name is the
// question's, each next one the target of a CNAME (class IN, answer section) owned by the
// one before, the names distinct, and every address owned (A or AAAA, class IN, answer
// section) by the last name.
func checkChain(t *testing.T, m *dns.Msg, answers []Answer) {
	t.Helper()
	if len(answers) == 0 {
		return
	}
	if m.Rcode != dns.RcodeSuccess {
		t.Fatalf("learnt from rcode %d", m.Rcode)
	}
	if answers[0].Name != "www.example.com" {
		t.Fatalf("chain starts at %q", answers[0].Name)
	}
	if len(answers) > maxChain {
		t.Fatalf("chain of %d names", len(answers))
	}
	seen := map[string]bool{}
	for i, a := range answers {
		if seen[a.Name] {
			t.Fatalf("%q twice in the chain", a.Name)
		}
		seen[a.Name] = true
		if len(a.Addrs) == 0 {
			t.Fatalf("answer for %q without addresses", a.Name)
		}
		if i == 0 {
			continue
		}
		linked := false
		for _, rr := range m.Answer {
			if c, ok := rr.(*dns.CNAME); ok && c.Hdr.Class == dns.ClassINET &&
				fqdn.Canonical(c.Hdr.Name) == answers[i-1].Name && fqdn.Canonical(c.Target) == a.Name {
				linked = true
			}
		}
		if !linked {
			t.Fatalf("%q is not the CNAME target of %q", a.Name, answers[i-1].Name)
		}
	}
	end := answers[len(answers)-1].Name
	for _, addr := range answers[0].Addrs {
		owned := false
		for _, rr := range m.Answer {
			h := rr.Header()
			if h.Class != dns.ClassINET || fqdn.Canonical(h.Name) != end {
				continue
			}
			var a netip.Addr
			switch r := rr.(type) {
			case *dns.A:
				a, _ = netip.AddrFromSlice(r.A.To4())
			case *dns.AAAA:
				a, _ = netip.AddrFromSlice(r.AAAA)
				a = a.Unmap()
			}
			owned = owned || a == addr
		}
		if !owned {
			t.Fatalf("%v is not an address of %q", addr, end)
		}
	}
}

// FuzzQuery feeds arbitrary bytes to the path a pod's query takes before it is forwarded:
// never a panic; a query accepted has one question and is a QUERY; the proxy's own
// answers to it parse and carry its ID.
func FuzzQuery(f *testing.F) {
	q := new(dns.Msg)
	q.SetQuestion("www.example.com.", dns.TypeAAAA)
	q.SetEdns0(1232, true)
	b, _ := q.Pack()
	f.Add(b)
	f.Add(b[:12])
	f.Add([]byte{0, 1, 0x28, 0, 0, 1})

	f.Fuzz(func(t *testing.T, b []byte) {
		m, rc := parseQuery(b)
		if m == nil {
			if rc >= 0 {
				r := new(dns.Msg)
				if err := r.Unpack(headerReply(b, rc)); err != nil || !r.Response || r.Rcode != rc {
					t.Fatalf("answer to a malformed query: %v, %v", r, err)
				}
			}
			return
		}
		if len(m.Question) != 1 || m.Response || m.Opcode != dns.OpcodeQuery {
			t.Fatalf("accepted %v", m)
		}
		for _, rc := range []int{dns.RcodeRefused, dns.RcodeServerFailure} {
			r := new(dns.Msg)
			if err := r.Unpack(errorReply(m, rc)); err != nil || r.Id != m.Id || r.Rcode != rc {
				t.Fatalf("answer %d: %v, %v", rc, r, err)
			}
		}
	})
}
