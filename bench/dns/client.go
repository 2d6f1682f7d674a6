package dns

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// ClientResult is what `dnsbench client` prints (JSON), per mode.
type ClientResult struct {
	Mode string `json:"mode"`
	// Answered queries and failed ones (no answer within the timeout, or a failed
	// exchange); latency and learn samples of failed queries are left out of the
	// percentiles.
	Answered int `json:"answered"`
	Failed   int `json:"failed"`
	// Latency mode: nearest-rank percentiles of the answered queries.
	P50us float64 `json:"p50_us,omitempty"`
	P99us float64 `json:"p99_us,omitempty"`
	// Rate mode: answered queries per second of the sample.
	QPS float64 `json:"qps,omitempty"`
	// Query mode: the answer.
	Rcode string   `json:"rcode,omitempty"`
	Addrs []string `json:"addrs,omitempty"`
	// Learn mode: one record per name, in order.
	Learn []LearnRecord `json:"learn,omitempty"`
}

// Outcomes of a learn record's connection.
const (
	// Connected: within the SYN retransmission time, so the first SYN passed.
	Connected = "connected"
	// Retransmitted: connected, but only after the SYN retransmission time: the first
	// SYN was dropped.
	Retransmitted = "retransmitted"
	// Failed: no connection within the timeout.
	Failed = "failed"
	// NoAnswer: the name got no usable answer (no connection tried).
	NoAnswer = "no-answer"
)

// synRetransmit is Linux's initial SYN retransmission timeout (TCP_TIMEOUT_INIT): a
// connection that took longer lost its first SYN.
const synRetransmit = time.Second

// LearnRecord is one name of learn mode: its resolution and the connection to its address
// right after.
type LearnRecord struct {
	Name      string  `json:"name"`
	ResolveUs float64 `json:"resolve_us"`
	ConnectUs float64 `json:"connect_us"`
	Outcome   string  `json:"outcome"`
}

// FirstPacketDropped says whether the record's first packet to the address did not pass.
func (r LearnRecord) FirstPacketDropped() bool {
	return r.Outcome == Retransmitted || r.Outcome == Failed
}

// ClientMain runs `dnsbench client` with args and prints its result to stdout.
func ClientMain(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	var (
		mode     = fs.String("mode", "latency", "query, latency, rate or learn")
		server   = fs.String("server", "", "DNS server address (port 53)")
		proto    = fs.String("proto", "udp", "udp or tcp (tcp: a connection per query)")
		name     = fs.String("name", "", "query mode: the name")
		names    = fs.Int("names", 16, "latency and rate modes: how many cached names the queries cycle over")
		n        = fs.Int("n", 2000, "latency mode: queries measured; learn mode: names")
		warmup   = fs.Int("warmup", 100, "latency mode: queries before measuring")
		workers  = fs.Int("workers", 8, "rate mode: concurrent clients, each with its own socket")
		duration = fs.Duration("duration", 3*time.Second, "rate mode: sample length")
		first    = fs.Int("first", 0, "learn mode: index of the first name")
		timeout  = fs.Duration("timeout", time.Second, "how long to wait for an answer")
		connTO   = fs.Duration("connect-timeout", 1500*time.Millisecond, "learn mode: how long a connection may take")
		retryFor = fs.Duration("retry-for", 0, "query mode: keep asking until an answer comes or this passes")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	addr, err := netip.ParseAddr(*server)
	if err != nil {
		return fmt.Errorf("--server: %w", err)
	}
	if *proto != "udp" && *proto != "tcp" {
		return fmt.Errorf("--proto %q: udp or tcp", *proto)
	}
	target := netip.AddrPortFrom(addr, 53).String()
	ctx := context.Background()
	var res ClientResult
	switch *mode {
	case "query":
		res, err = queryOnce(ctx, *proto, target, *name, *timeout, *retryFor)
	case "latency":
		res, err = latency(*proto, target, *names, *warmup, *n, *timeout)
	case "rate":
		res, err = rate(*proto, target, *names, *workers, *duration, *timeout)
	case "learn":
		res, err = learn(*proto, target, *first, *n, *timeout, *connTO)
	default:
		return fmt.Errorf("--mode %q: query, latency, rate or learn", *mode)
	}
	if err != nil {
		return err
	}
	res.Mode = *mode
	return json.NewEncoder(stdout).Encode(res)
}

// asker sends queries to one server: over UDP on one connected socket of its own, over
// TCP on a new connection per query (as a stub resolver falling back to TCP does), closed
// with a reset so that no TIME_WAIT piles up on the client.
type asker struct {
	proto, target string
	timeout       time.Duration
	udp           *dns.Conn
	id            uint16
}

func newAsker(proto, target string, timeout time.Duration) (*asker, error) {
	a := &asker{proto: proto, target: target, timeout: timeout, id: uint16(rand.Uint32())}
	if proto == "udp" {
		c, err := net.Dial("udp", target)
		if err != nil {
			return nil, err
		}
		a.udp = &dns.Conn{Conn: c, UDPSize: dns.DefaultMsgSize}
	}
	return a, nil
}

func (a *asker) Close() {
	if a.udp != nil {
		a.udp.Close()
	}
}

// ask sends one A query for name and returns the response and how long it took.
func (a *asker) ask(name string) (*dns.Msg, time.Duration, error) {
	a.id++
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Id = a.id
	start := time.Now()
	c := a.udp
	if c == nil {
		tc, err := net.DialTimeout("tcp", a.target, a.timeout)
		if err != nil {
			return nil, 0, err
		}
		tc.(*net.TCPConn).SetLinger(0)
		defer tc.Close()
		c = &dns.Conn{Conn: tc}
	}
	deadline := start.Add(a.timeout)
	c.SetDeadline(deadline)
	if err := c.WriteMsg(m); err != nil {
		return nil, 0, err
	}
	for {
		r, err := c.ReadMsg()
		if err != nil {
			// A late answer to an earlier query is skipped; anything else ends the query.
			if errors.Is(err, dns.ErrId) && time.Now().Before(deadline) {
				continue
			}
			return nil, 0, err
		}
		if r.Id != m.Id {
			continue
		}
		return r, time.Since(start), nil
	}
}

func addrsOf(r *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				out = append(out, ip)
			}
		}
	}
	return out
}

// queryOnce asks name once, or until an answer comes within retryFor.
func queryOnce(ctx context.Context, proto, target, name string, timeout, retryFor time.Duration) (ClientResult, error) {
	a, err := newAsker(proto, target, timeout)
	if err != nil {
		return ClientResult{}, err
	}
	defer a.Close()
	end := time.Now().Add(retryFor)
	for {
		r, _, err := a.ask(dns.Fqdn(name))
		if err == nil {
			res := ClientResult{Answered: 1, Rcode: dns.RcodeToString[r.Rcode]}
			for _, ip := range addrsOf(r) {
				res.Addrs = append(res.Addrs, ip.String())
			}
			return res, nil
		}
		if time.Now().After(end) {
			return ClientResult{}, fmt.Errorf("asking %s for %s: %w", target, name, err)
		}
		select {
		case <-ctx.Done():
			return ClientResult{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// latency asks warmup and then n queries one after another, cycling over names cached
// names, and gives the percentiles of the answered ones.
func latency(proto, target string, names, warmup, n int, timeout time.Duration) (ClientResult, error) {
	a, err := newAsker(proto, target, timeout)
	if err != nil {
		return ClientResult{}, err
	}
	defer a.Close()
	var res ClientResult
	lat := make([]time.Duration, 0, n)
	for i := range warmup + n {
		r, d, err := a.ask(CachedName(i % names))
		if i < warmup {
			continue
		}
		if err != nil || r.Rcode != dns.RcodeSuccess {
			res.Failed++
			continue
		}
		lat = append(lat, d)
	}
	res.Answered = len(lat)
	if len(lat) == 0 {
		return res, fmt.Errorf("no query of %d answered", n)
	}
	slices.Sort(lat)
	res.P50us = us(benchkit.Percentile(lat, 50))
	res.P99us = us(benchkit.Percentile(lat, 99))
	return res, nil
}

// rate runs workers clients, each with its own socket asking one query after another,
// for duration, and gives the answered queries per second.
func rate(proto, target string, names, workers int, duration, timeout time.Duration) (ClientResult, error) {
	askers := make([]*asker, workers)
	for i := range askers {
		a, err := newAsker(proto, target, timeout)
		if err != nil {
			return ClientResult{}, err
		}
		defer a.Close()
		askers[i] = a
	}
	var (
		mu       sync.Mutex
		res      ClientResult
		wg       sync.WaitGroup
		start    = time.Now()
		deadline = start.Add(duration)
	)
	for w, a := range askers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, failed := 0, 0
			for i := w; time.Now().Before(deadline); i++ {
				r, _, err := a.ask(CachedName(i % names))
				if err != nil || r.Rcode != dns.RcodeSuccess {
					failed++
					continue
				}
				ok++
			}
			mu.Lock()
			res.Answered += ok
			res.Failed += failed
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.QPS = float64(res.Answered) / time.Since(start).Seconds()
	return res, nil
}

// learn resolves names first..first+n-1 one after another and right after each answer
// connects to the answered address on TCP 80, recording both times and whether the first
// SYN passed.
func learn(proto, target string, first, n int, timeout, connTimeout time.Duration) (ClientResult, error) {
	a, err := newAsker(proto, target, timeout)
	if err != nil {
		return ClientResult{}, err
	}
	defer a.Close()
	var res ClientResult
	d := net.Dialer{Timeout: connTimeout}
	for i := first; i < first+n; i++ {
		rec := LearnRecord{Name: LearnName(i), Outcome: NoAnswer}
		r, took, err := a.ask(rec.Name)
		var addrs []netip.Addr
		if err == nil && r.Rcode == dns.RcodeSuccess {
			addrs = addrsOf(r)
		}
		if len(addrs) == 0 {
			res.Failed++
			res.Learn = append(res.Learn, rec)
			continue
		}
		res.Answered++
		rec.ResolveUs = us(took)
		start := time.Now()
		c, err := d.Dial("tcp", netip.AddrPortFrom(addrs[0], 80).String())
		rec.ConnectUs = us(time.Since(start))
		switch {
		case err != nil:
			rec.Outcome = Failed
			if !errors.Is(err, syscall.ECONNREFUSED) && !isTimeout(err) {
				return res, fmt.Errorf("connecting to %v: %w", addrs[0], err)
			}
		case time.Since(start) >= synRetransmit:
			rec.Outcome = Retransmitted
		default:
			rec.Outcome = Connected
		}
		if c != nil {
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
		res.Learn = append(res.Learn, rec)
	}
	return res, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
