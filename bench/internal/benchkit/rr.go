package benchkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"syscall"
	"time"
)

// RRResult is one request/response run on a single TCP connection: each transaction
// writes a request and waits for the whole response before sending the next, so a
// transaction is one round trip through both endpoints' policy points (netperf TCP_RR).
type RRResult struct {
	Transactions int64   `json:"transactions"`
	Seconds      float64 `json:"seconds"`
	TPS          float64 `json:"tps"`
	MeanUs       float64 `json:"mean_us"`
	P50Us        float64 `json:"p50_us"`
	P90Us        float64 `json:"p90_us"`
	P99Us        float64 `json:"p99_us"`
}

// rrWarmup transactions are run and not recorded, so the first lookups after connection
// set-up (cold caches, lazily faulted pages) do not end up in the tail.
const rrWarmup = 200

// ServeRR answers every request of reqSize bytes on each accepted connection with respSize
// bytes, until ctx is done or the listener fails.
func ServeRR(ctx context.Context, ln net.Listener, reqSize, respSize int) error {
	if reqSize < 1 || respSize < 1 {
		return fmt.Errorf("request and response sizes must be at least 1 byte")
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accepting: %w", err)
		}
		go serveConn(c, reqSize, respSize)
	}
}

// serveConn answers requests on one connection until it fails or is closed.
func serveConn(c net.Conn, reqSize, respSize int) {
	defer c.Close()
	req := make([]byte, reqSize)
	resp := make([]byte, respSize)
	for {
		if _, err := io.ReadFull(c, req); err != nil {
			return
		}
		if _, err := c.Write(resp); err != nil {
			return
		}
	}
}

// DialRetry connects to addr, retrying refused and timed-out attempts until connectTimeout
// has passed: the server may still be starting, or a policy may still be being applied.
func DialRetry(ctx context.Context, addr string, connectTimeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(connectTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		d := net.Dialer{Timeout: min(time.Second, time.Until(deadline))}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("connecting to %s within %v: %w", addr, connectTimeout, lastErr)
}

// RunRRClient runs transactions against an RR server at addr for duration and reports
// their rate and latency percentiles.
func RunRRClient(ctx context.Context, addr string, reqSize, respSize int, duration, connectTimeout time.Duration) (RRResult, error) {
	if reqSize < 1 || respSize < 1 {
		return RRResult{}, fmt.Errorf("request and response sizes must be at least 1 byte")
	}
	c, err := DialRetry(ctx, addr, connectTimeout)
	if err != nil {
		return RRResult{}, err
	}
	defer c.Close()
	// A stuck transaction (a drop the benchmark did not expect) must end the run, not hang it.
	if err := c.SetDeadline(time.Now().Add(duration + 30*time.Second)); err != nil {
		return RRResult{}, fmt.Errorf("setting deadline: %w", err)
	}
	return transact(ctx, c, reqSize, respSize, duration)
}

// transact runs the warm-up, then timed transactions on c for duration.
func transact(ctx context.Context, c net.Conn, reqSize, respSize int, duration time.Duration) (RRResult, error) {
	req := make([]byte, reqSize)
	resp := make([]byte, respSize)
	once := func() error {
		if _, err := c.Write(req); err != nil {
			return fmt.Errorf("sending request: %w", err)
		}
		if _, err := io.ReadFull(c, resp); err != nil {
			return fmt.Errorf("reading response: %w", err)
		}
		return nil
	}
	for range rrWarmup {
		if err := once(); err != nil {
			return RRResult{}, err
		}
	}
	lat := make([]time.Duration, 0, 1<<16)
	start := time.Now()
	end := start.Add(duration)
	for {
		t0 := time.Now()
		if !t0.Before(end) || ctx.Err() != nil {
			break
		}
		if err := once(); err != nil {
			return RRResult{}, err
		}
		lat = append(lat, time.Since(t0))
	}
	return summarizeRR(lat, time.Since(start)), nil
}

func summarizeRR(lat []time.Duration, elapsed time.Duration) RRResult {
	r := RRResult{Transactions: int64(len(lat)), Seconds: elapsed.Seconds()}
	if len(lat) == 0 || elapsed <= 0 {
		return r
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	r.TPS = float64(len(s)) / elapsed.Seconds()
	r.MeanUs = us(sum) / float64(len(s))
	r.P50Us = us(Percentile(s, 50))
	r.P90Us = us(Percentile(s, 90))
	r.P99Us = us(Percentile(s, 99))
	return r
}

// Probe outcomes of one TCP connection attempt.
const (
	ProbeConnected = "connected" // handshake completed
	ProbeRefused   = "refused"   // RST: reached the peer, nothing listening (not dropped)
	ProbeTimeout   = "timeout"   // no answer: the SYN (or its reply) was dropped
)

// Probe makes one connection attempt to addr and says how it ended. Telling refused from
// timeout is what shows a policy drop: an unenforced closed port answers with a reset.
func Probe(ctx context.Context, addr string, timeout time.Duration) (string, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		c.Close()
		return ProbeConnected, nil
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return ProbeRefused, nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ProbeTimeout, nil
	}
	return "", fmt.Errorf("probing %s: %w", addr, err)
}
