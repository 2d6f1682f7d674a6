package dnsproxy

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func rrA(name string, ttl uint32, addr string) dns.RR {
	return &dns.A{Hdr: dns.RR_Header{Name: dns.Fqdn(name), Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl}, A: net.ParseIP(addr).To4()}
}

func rrAAAA(name string, ttl uint32, addr string) dns.RR {
	return &dns.AAAA{Hdr: dns.RR_Header{Name: dns.Fqdn(name), Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: ttl}, AAAA: net.ParseIP(addr)}
}

func rrCNAME(name string, ttl uint32, target string) dns.RR {
	return &dns.CNAME{Hdr: dns.RR_Header{Name: dns.Fqdn(name), Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: ttl}, Target: dns.Fqdn(target)}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestExtract(t *testing.T) {
	const q = "www.example.com"
	chain := func(ttl time.Duration, as []netip.Addr, names ...string) []Answer {
		var out []Answer
		for _, n := range names {
			out = append(out, Answer{Name: n, Addrs: as, TTL: ttl})
		}
		return out
	}
	cases := []struct {
		name   string
		rcode  int
		answer []dns.RR
		ns     []dns.RR
		extra  []dns.RR
		want   []Answer
	}{
		{name: "direct", answer: []dns.RR{rrA(q, 30, "198.18.0.1"), rrA(q, 20, "198.18.0.2")},
			want: chain(20*time.Second, addrs("198.18.0.1", "198.18.0.2"), q)},
		{name: "chain, any order, any case", answer: []dns.RR{
			rrA("EDGE.cdn.net", 120, "198.18.0.10"), rrCNAME("web.example.com", 60, "Edge.CDN.net"),
			rrCNAME("WWW.Example.com", 300, "web.example.com"), rrAAAA("edge.cdn.net", 90, "2001:db8::1"),
		}, want: chain(60*time.Second, addrs("198.18.0.10", "2001:db8::1"), q, "web.example.com", "edge.cdn.net")},
		{name: "duplicates collapse", answer: []dns.RR{rrA(q, 30, "198.18.0.1"), rrA(q, 30, "198.18.0.1")},
			want: chain(30*time.Second, addrs("198.18.0.1"), q)},
		{name: "mapped AAAA is IPv4", answer: []dns.RR{rrAAAA(q, 30, "::ffff:198.18.0.1")},
			want: chain(30*time.Second, addrs("198.18.0.1"), q)},
		{name: "records off the chain ignored", answer: []dns.RR{
			rrA("evil.example.org", 1, "198.18.6.6"), rrCNAME("other.example.com", 1, "evil.example.org"),
			rrCNAME(q, 50, "web.example.com"), rrA("web.example.com", 40, "198.18.0.5"),
			rrA("www.example.com.evil.org", 1, "198.18.6.7"),
		}, ns: []dns.RR{rrA(q, 1, "198.18.6.8")}, extra: []dns.RR{rrA(q, 1, "198.18.6.9"), rrA("web.example.com", 1, "198.18.6.10")},
			want: chain(40*time.Second, addrs("198.18.0.5"), q, "web.example.com")},
		{name: "addresses only in additional", extra: []dns.RR{rrA(q, 1, "198.18.6.9")}},
		{name: "nxdomain with records", rcode: dns.RcodeNameError, answer: []dns.RR{rrA(q, 1, "198.18.0.1")}},
		{name: "chain without end", answer: []dns.RR{rrCNAME(q, 1, "web.example.com")}},
		{name: "loop", answer: []dns.RR{rrCNAME(q, 1, "a.example.com"), rrCNAME("a.example.com", 1, q), rrA("b.example.com", 1, "198.18.0.1")}},
		{name: "two CNAMEs for one name", answer: []dns.RR{
			rrCNAME(q, 1, "a.example.com"), rrCNAME(q, 1, "b.example.com"), rrA("a.example.com", 1, "198.18.0.1"), rrA("b.example.com", 1, "198.18.0.2"),
		}},
		{name: "same CNAME twice", answer: []dns.RR{rrCNAME(q, 9, "a.example.com"), rrCNAME(q, 5, "a.example.com"), rrA("a.example.com", 7, "198.18.0.1")},
			want: chain(5*time.Second, addrs("198.18.0.1"), q, "a.example.com")},
		{name: "class CH ignored", answer: []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q + ".", Rrtype: dns.TypeA, Class: dns.ClassCHAOS, Ttl: 1}, A: net.IPv4(198, 18, 0, 1)}}},
		{name: "addresses end the chain", answer: []dns.RR{rrA(q, 9, "198.18.0.1"), rrCNAME(q, 9, "a.example.com"), rrA("a.example.com", 9, "198.18.0.2")},
			want: chain(9*time.Second, addrs("198.18.0.1"), q)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := new(dns.Msg)
			m.SetQuestion(q+".", dns.TypeA)
			m.Response, m.Rcode = true, c.rcode
			m.Answer, m.Ns, m.Extra = c.answer, c.ns, c.extra
			if got := extract(q, m); !reflect.DeepEqual(got, c.want) {
				t.Errorf("extract = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestExtractChainLimit(t *testing.T) {
	build := func(hops int) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion("n0.example.com.", dns.TypeA)
		m.Response = true
		for i := range hops {
			m.Answer = append(m.Answer, rrCNAME(name(i), 60, name(i+1)))
		}
		m.Answer = append(m.Answer, rrA(name(hops), 60, "198.18.0.1"))
		return m
	}
	if got := extract("n0.example.com", build(maxChain-1)); len(got) != maxChain {
		t.Errorf("chain of %d names: %d answers, want all", maxChain, len(got))
	}
	if got := extract("n0.example.com", build(maxChain)); got != nil {
		t.Errorf("chain of %d names: %d answers, want none", maxChain+1, len(got))
	}
}

func name(i int) string { return fmt.Sprintf("n%d.example.com", i) }

func TestParseQuery(t *testing.T) {
	good := new(dns.Msg)
	good.SetQuestion("a.example.com.", dns.TypeA)
	b, _ := good.Pack()
	if m, rc := parseQuery(b); m == nil || rc != 0 {
		t.Fatalf("good query: %v, %d", m, rc)
	}
	with := func(f func([]byte)) []byte {
		c := append([]byte(nil), b...)
		f(c)
		return c
	}
	cases := []struct {
		name string
		b    []byte
		want int
	}{
		{"short", b[:11], -1},
		{"response", with(func(c []byte) { c[2] |= 0x80 }), -1},
		{"notify", with(func(c []byte) { c[2] |= dns.OpcodeNotify << 3 }), dns.RcodeNotImplemented},
		{"two questions", with(func(c []byte) { binary.BigEndian.PutUint16(c[4:], 2) }), dns.RcodeFormatError},
		{"no question", with(func(c []byte) { binary.BigEndian.PutUint16(c[4:], 0) }), dns.RcodeFormatError},
		{"cut", b[:len(b)-3], dns.RcodeFormatError},
	}
	for _, c := range cases {
		m, rc := parseQuery(c.b)
		if m != nil || rc != c.want {
			t.Errorf("%s: parseQuery = %v, %d; want nil, %d", c.name, m, rc, c.want)
		}
		if rc >= 0 {
			r := new(dns.Msg)
			if err := r.Unpack(headerReply(c.b, rc)); err != nil || r.Id != good.Id || !r.Response || r.Rcode != rc {
				t.Errorf("%s: answer %v (%v)", c.name, r, err)
			}
		}
	}
}

func TestCheckResponse(t *testing.T) {
	req := new(dns.Msg)
	req.SetQuestion("www.example.com.", dns.TypeA)
	pack := func(f func(*dns.Msg)) []byte {
		m := new(dns.Msg)
		m.SetReply(req)
		m.Answer = []dns.RR{rrA("www.example.com", 1, "198.18.0.1")}
		f(m)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := checkResponse(req, pack(func(m *dns.Msg) { m.Question[0].Name = "WwW.ExAmple.COM." })); err != nil {
		t.Errorf("0x20 name: %v", err)
	}
	for name, c := range map[string]struct {
		b    []byte
		want error
	}{
		"other id":       {pack(func(m *dns.Msg) { m.Id++ }), errResponseMismatch},
		"other name":     {pack(func(m *dns.Msg) { m.Question[0].Name = "evil.example.com." }), errResponseMismatch},
		"other type":     {pack(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAAAA }), errResponseMismatch},
		"no question":    {pack(func(m *dns.Msg) { m.Question = nil }), errResponseMismatch},
		"not a response": {pack(func(m *dns.Msg) { m.Response = false }), errResponseMalformed},
		"short":          {[]byte{1, 2, 3}, errResponseMalformed},
	} {
		if _, err := checkResponse(req, c.b); err != c.want {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	// A truncated response cut in its records still passes, without them; an untruncated
	// one does not.
	full := pack(func(m *dns.Msg) { m.Truncated = true })
	m, err := checkResponse(req, full[:len(full)-2])
	if err != nil || len(m.Answer) != 0 || !m.Truncated {
		t.Errorf("cut truncated response: %v, %v", m, err)
	}
	plain := pack(func(*dns.Msg) {})
	if _, err := checkResponse(req, plain[:len(plain)-2]); err != errResponseMalformed {
		t.Errorf("cut response: %v", err)
	}
}

func TestErrorReply(t *testing.T) {
	req := new(dns.Msg)
	req.SetQuestion("www.example.com.", dns.TypeA)
	req.SetEdns0(1232, false)
	r := new(dns.Msg)
	if err := r.Unpack(errorReply(req, dns.RcodeRefused)); err != nil {
		t.Fatal(err)
	}
	if r.Id != req.Id || r.Rcode != dns.RcodeRefused || len(r.Question) != 1 || r.IsEdns0() == nil {
		t.Fatalf("refusal: %v", r)
	}
	if !strings.Contains(r.IsEdns0().String(), "Prohibited") {
		t.Errorf("refusal without EDE Prohibited: %v", r.IsEdns0())
	}
}
