package dnsproxy

import (
	"encoding/binary"
	"errors"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/rampartnet/rampart/internal/fqdn"
)

// Header bits (RFC 1035 4.1.1).
const (
	headerSize = 12
	bitQR      = 1 << 15
	maskOpcode = 0xf << 11
	bitRD      = 1 << 8
)

// maxChain is the longest CNAME chain the proxy follows (resolvers stop at about as many);
// a longer one teaches nothing.
const maxChain = 16

// parseQuery parses a pod's query. It returns the message if it is one the proxy handles:
// a query (QR clear) with opcode QUERY and exactly one question. Otherwise it returns nil
// and the rcode to answer with, or -1 for no answer: a message without a readable header,
// or a response, is not answered (answering responses could start a loop between two
// responders); any other is answered FORMERR (NOTIMP for an opcode other than QUERY), so
// that the client learns at once instead of waiting for its timeout. Such an answer is a
// bare header, no longer than the query, so it is no amplifier.
func parseQuery(b []byte) (*dns.Msg, int) {
	if len(b) < headerSize {
		return nil, -1
	}
	bits := binary.BigEndian.Uint16(b[2:])
	switch {
	case bits&bitQR != 0:
		return nil, -1
	case int(bits&maskOpcode>>11) != dns.OpcodeQuery:
		return nil, dns.RcodeNotImplemented
	case binary.BigEndian.Uint16(b[4:]) != 1:
		return nil, dns.RcodeFormatError
	}
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil || len(m.Question) != 1 {
		return nil, dns.RcodeFormatError
	}
	return m, 0
}

// headerReply is the answer to a query that did not parse: its header with QR set, the
// rcode, and no records.
func headerReply(query []byte, rcode int) []byte {
	out := make([]byte, headerSize)
	copy(out[:2], query[:2])
	bits := binary.BigEndian.Uint16(query[2:])
	binary.BigEndian.PutUint16(out[2:], bitQR|bits&(maskOpcode|bitRD)|uint16(rcode&0xf))
	return out
}

// errorReply is the proxy's own answer to a query: REFUSED or SERVFAIL, with the
// question, and an OPT record if the query had one (RFC 6891 6.1.1), which for REFUSED
// carries the Extended DNS Error "Prohibited" (RFC 8914) so that a client's log says
// why.
func errorReply(req *dns.Msg, rcode int) []byte {
	r := new(dns.Msg)
	r.SetRcode(req, rcode)
	r.RecursionAvailable = true
	if opt := req.IsEdns0(); opt != nil {
		r.SetEdns0(max(opt.UDPSize(), dns.MinMsgSize), false)
		if rcode == dns.RcodeRefused {
			ro := r.IsEdns0()
			ro.Option = append(ro.Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeProhibited})
		}
	}
	out, err := r.Pack()
	if err != nil {
		// The message holds only what parsed from the query, so it packs; a bare
		// header is still an answer if it ever does not.
		out = make([]byte, headerSize)
		binary.BigEndian.PutUint16(out, req.Id)
		binary.BigEndian.PutUint16(out[2:], bitQR|uint16(rcode&0xf))
	}
	return out
}

// Why a server's message is not the response to a query.
var (
	errResponseMalformed = errors.New("malformed response")
	errResponseMismatch  = errors.New("response to another query")
)

// checkResponse parses a server's message and checks it answers req: a response with
// opcode QUERY, req's ID and exactly req's question (the name in any case: servers may
// echo a 0x20-randomised name as they like). A truncated response whose records do not
// all parse is still accepted when its question does, without its records, so that the
// pod gets the TC bit and retries over TCP.
func checkResponse(req *dns.Msg, b []byte) (*dns.Msg, error) {
	if len(b) < headerSize {
		return nil, errResponseMalformed
	}
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		if !m.Truncated || len(m.Question) != 1 {
			return nil, errResponseMalformed
		}
		m.Answer, m.Ns, m.Extra = nil, nil, nil
	}
	if !m.Response || m.Opcode != dns.OpcodeQuery {
		return nil, errResponseMalformed
	}
	want := req.Question[0]
	if m.Id != req.Id || len(m.Question) != 1 || m.Question[0].Qtype != want.Qtype ||
		m.Question[0].Qclass != want.Qclass || !strings.EqualFold(m.Question[0].Name, want.Name) {
		return nil, errResponseMismatch
	}
	return m, nil
}

// extract returns what a response teaches about qname (canonical): the chain of names
// from qname through the CNAME records of the answer section to the first name that owns
// A or AAAA records there, each with those addresses and the smallest TTL of the records
// followed. Only class IN records of the answer section count, and only those on the
// chain: records for other names (in any section) are ignored, so a server cannot make
// the proxy learn addresses of names that were not asked. A response with an rcode other
// than NOERROR, a name with two different CNAMEs, a loop, a chain longer than maxChain or
// one without addresses at its end teaches nothing.
func extract(qname string, resp *dns.Msg) []Answer {
	if resp == nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
		return nil
	}
	type cname struct {
		target string
		ttl    uint32
		ok     bool // false: the owner has CNAMEs to different targets
	}
	// One pass over the answer section: each record's owner in canonical form ("" for
	// records of other classes), the CNAMEs by owner, the names that own addresses.
	owners := make([]string, len(resp.Answer))
	cnames := map[string]cname{}
	hasAddrs := map[string]bool{}
	for i, rr := range resp.Answer {
		h := rr.Header()
		if h.Class != dns.ClassINET {
			continue
		}
		owner := fqdn.Canonical(h.Name)
		owners[i] = owner
		switch r := rr.(type) {
		case *dns.A, *dns.AAAA:
			hasAddrs[owner] = true
		case *dns.CNAME:
			target := fqdn.Canonical(r.Target)
			switch prev, seen := cnames[owner]; {
			case !seen:
				cnames[owner] = cname{target: target, ttl: h.Ttl, ok: true}
			case prev.ok && prev.target == target:
				prev.ttl = min(prev.ttl, h.Ttl)
				cnames[owner] = prev
			default:
				cnames[owner] = cname{}
			}
		}
	}

	// The chain, from the question's name to the first name that owns addresses.
	names := []string{qname}
	ttl := uint32(math.MaxUint32)
	end := qname
	for !hasAddrs[end] {
		c, ok := cnames[end]
		if !ok || !c.ok || slices.Contains(names, c.target) || len(names) == maxChain {
			return nil
		}
		ttl = min(ttl, c.ttl)
		end = c.target
		names = append(names, end)
	}

	var addrs []netip.Addr
	for i, rr := range resp.Answer {
		if owners[i] != end {
			continue
		}
		var a netip.Addr
		switch r := rr.(type) {
		case *dns.A:
			a, _ = netip.AddrFromSlice(r.A.To4())
		case *dns.AAAA:
			// An IPv4-mapped AAAA is reached as the IPv4 address it maps.
			a, _ = netip.AddrFromSlice(r.AAAA.To16())
			a = a.Unmap()
		}
		if a.IsValid() {
			addrs = append(addrs, a)
			ttl = min(ttl, rr.Header().Ttl)
		}
	}
	if len(addrs) == 0 {
		return nil
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Clip(slices.Compact(addrs))
	answers := make([]Answer, len(names))
	for i, n := range names {
		answers[i] = Answer{Name: n, Addrs: addrs, TTL: time.Duration(ttl) * time.Second}
	}
	return answers
}

// ednsSize is the UDP payload size a query advertises (512 without EDNS).
func ednsSize(req *dns.Msg) int {
	if opt := req.IsEdns0(); opt != nil && opt.UDPSize() > dns.MinMsgSize {
		return int(opt.UDPSize())
	}
	return dns.MinMsgSize
}
