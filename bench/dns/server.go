package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Zone is the domain the benchmark's DNS server answers for.
const Zone = "bench.example."

// WorldRange is the range the world namespace serves TCP 80 on, every address of it.
var WorldRange = netip.MustParsePrefix("198.19.0.0/16")

// MaxNames is how many learn names (n<i>) have an address of their own in WorldRange;
// the last /24 is for the cached names (c<i>).
const MaxNames = 65000

// TTL of every answer: longer than a run, so that nothing learnt expires during it.
const TTL = 3600

// CachedName is the i-th of the small set of names part one asks again and again.
func CachedName(i int) string { return fmt.Sprintf("c%d.%s", i, Zone) }

// LearnName is the i-th of the names part two asks once each.
func LearnName(i int) string { return fmt.Sprintf("n%d.%s", i, Zone) }

// AddrOf is the address the server answers for name, or false for a name it does not
// know (answered NXDOMAIN): c<i> is 198.19.255.(1+i mod 250), n<i> the (1+i)-th address
// of 198.19.0.0/16, so that every learn name has an address no other name has.
func AddrOf(name string) (netip.Addr, bool) {
	name = strings.ToLower(dns.Fqdn(name))
	label, ok := strings.CutSuffix(name, "."+Zone)
	if !ok || len(label) < 2 {
		return netip.Addr{}, false
	}
	i, err := strconv.Atoi(label[1:])
	if err != nil || i < 0 {
		return netip.Addr{}, false
	}
	base := WorldRange.Addr().As4()
	switch label[0] {
	case 'c':
		return netip.AddrFrom4([4]byte{base[0], base[1], 255, byte(1 + i%250)}), true
	case 'n':
		if i >= MaxNames {
			return netip.Addr{}, false
		}
		v := binary.BigEndian.Uint32(base[:]) + 1 + uint32(i)
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], v)
		return netip.AddrFrom4(b), true
	}
	return netip.Addr{}, false
}

// handler answers A queries for the zone from AddrOf: no state, so that the server costs
// the same whatever was asked before.
type handler struct{}

func (handler) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Authoritative = true
	if len(req.Question) != 1 {
		resp.Rcode = dns.RcodeFormatError
	} else if q := req.Question[0]; q.Qclass != dns.ClassINET {
		resp.Rcode = dns.RcodeRefused
	} else if a, ok := AddrOf(q.Name); !ok {
		resp.Rcode = dns.RcodeNameError
	} else if q.Qtype == dns.TypeA {
		resp.Answer = []dns.RR{&dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: TTL},
			A:   a.AsSlice(),
		}}
	}
	w.WriteMsg(resp)
}

// ServeDNS answers on UDP and TCP at addr until ctx ends. started, if not nil, is called
// with the bound addresses once both serve.
func ServeDNS(ctx context.Context, addr string, started func(udp, tcp net.Addr)) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		pc.Close()
		return err
	}
	servers := []*dns.Server{
		{PacketConn: pc, Handler: handler{}},
		{Listener: l, Handler: handler{}, ReadTimeout: 5 * time.Second, IdleTimeout: func() time.Duration { return 5 * time.Second }},
	}
	errc := make(chan error, len(servers))
	var ready sync.WaitGroup
	for _, s := range servers {
		ready.Add(1)
		s.NotifyStartedFunc = ready.Done
		go func() { errc <- s.ActivateAndServe() }()
	}
	ready.Wait()
	if started != nil {
		started(pc.LocalAddr(), l.Addr())
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	for _, s := range servers {
		s.Shutdown()
	}
	if err != nil {
		return err
	}
	return nil
}

// ServeWorld accepts TCP connections on addr (the world namespace's port 80, on every
// address of its range) and holds each until the client closes it, until ctx ends.
func ServeWorld(ctx context.Context, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go func() {
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.Copy(io.Discard, c)
			c.Close()
		}()
	}
}
