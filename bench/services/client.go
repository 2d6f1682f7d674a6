package services

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The helper subcommands run inside the benchmark's namespaces (svcbench serve, svcbench
// client): the parent starts them with nsenter, so every socket they make belongs to the
// namespace, and the client joins its case's cgroup before it makes any, so that the
// Service translation attached to that cgroup (or none) is what it meets.

// Response is the backend's whole HTTP answer body.
const Response = "ok"

// Serve answers every HTTP request on addr with 200 "ok" until ctx ends.
func Serve(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(Response)))
		io.WriteString(w, Response)
	})}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// request is a whole HTTP/1.1 request; the client writes it on a fresh connection.
var request = []byte("GET / HTTP/1.1\r\nHost: svc\r\nUser-Agent: svcbench\r\n\r\n")

// exchange connects to addr, sends one request, reads the whole response and closes the
// connection with a reset (SO_LINGER 0), so that thousands of fresh connections a second
// leave no TIME_WAIT behind to exhaust the client's ports. It returns the connect time.
func exchange(addr string, timeout time.Duration, buf []byte) (time.Duration, error) {
	began := time.Now()
	c, err := net.DialTimeout("tcp4", addr, timeout)
	if err != nil {
		return 0, err
	}
	connected := time.Since(began)
	defer closeReset(c)
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(request); err != nil {
		return 0, fmt.Errorf("writing the request: %w", err)
	}
	n := 0
	for {
		m, err := c.Read(buf[n:])
		n += m
		if r := buf[:n]; bytes.HasPrefix(r, []byte("HTTP/1.1 200")) && bytes.HasSuffix(r, []byte("\r\n\r\n"+Response)) {
			return connected, nil
		}
		if err != nil {
			return 0, fmt.Errorf("reading the response (%q): %w", buf[:n], err)
		}
		if n == len(buf) {
			return 0, fmt.Errorf("response too long: %q", buf[:n])
		}
	}
}

// connectOnly measures one TCP connect (SYN to the completed handshake) to addr.
func connectOnly(addr string, timeout time.Duration) (time.Duration, error) {
	began := time.Now()
	c, err := net.DialTimeout("tcp4", addr, timeout)
	if err != nil {
		return 0, err
	}
	d := time.Since(began)
	closeReset(c)
	return d, nil
}

func closeReset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// ClientResult is what one client run prints (JSON on stdout).
type ClientResult struct {
	// Connect: connect times in microseconds, by nearest rank.
	ConnectP50us float64 `json:"connect_p50_us,omitempty"`
	ConnectP99us float64 `json:"connect_p99_us,omitempty"`
	Connects     int     `json:"connects,omitempty"`
	// Requests: completed requests per second, each on a fresh connection.
	RPS      float64 `json:"rps,omitempty"`
	Requests int     `json:"requests,omitempty"`
	// Wait: when (Unix nanoseconds) the target first answered a request.
	AnsweredUnixNano int64 `json:"answered_unix_nano,omitempty"`
	// Check: how many targets answered (all of them, or the run fails).
	Answered int `json:"answered,omitempty"`
}

// ClientMain is the client subcommand: it joins --cgroup, then runs --mode against the
// --targets (comma-separated addr:port) and prints a ClientResult.
//
//	connect  N sequential connects (--n), cycling over the targets
//	rps      fresh-connection requests from --workers workers for --duration
//	wait     one request to the first target every --interval until it answers (--timeout)
//	check    one request to every target; each must answer (refused also counts as failure)
//	silent   one request to the first target must get no answer within --timeout
func ClientMain(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	cgroup := fs.String("cgroup", "", "cgroup v2 directory to join first")
	mode := fs.String("mode", "", "connect, rps, wait, check or silent")
	targets := fs.String("targets", "", "comma-separated addr:port")
	n := fs.Int("n", 1000, "connects (connect)")
	workers := fs.Int("workers", 4, "concurrent connections (rps)")
	duration := fs.Duration("duration", 2*time.Second, "how long (rps)")
	timeout := fs.Duration("timeout", time.Second, "per connection; for wait the whole wait")
	interval := fs.Duration("interval", 2*time.Millisecond, "between attempts (wait)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cgroup != "" {
		if err := os.WriteFile(filepath.Join(*cgroup, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return fmt.Errorf("joining cgroup %s: %w", *cgroup, err)
		}
	}
	ts := strings.Split(*targets, ",")
	if *targets == "" {
		return errors.New("--targets: none given")
	}
	var res ClientResult
	var err error
	switch *mode {
	case "connect":
		res, err = runConnects(ts, *n, *timeout)
	case "rps":
		res, err = runRequests(ts, *workers, *duration, *timeout)
	case "wait":
		res, err = waitAnswer(ts[0], *timeout, *interval)
	case "check":
		buf := make([]byte, 4096)
		for _, t := range ts {
			if _, err := exchange(t, *timeout, buf); err != nil {
				return fmt.Errorf("request to %s: %w", t, err)
			}
			res.Answered++
		}
	case "silent":
		if _, err := exchange(ts[0], *timeout, make([]byte, 4096)); err == nil {
			return fmt.Errorf("%s answered, want no answer without a translation", ts[0])
		}
	default:
		return fmt.Errorf("--mode %q: want connect, rps, wait, check or silent", *mode)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}

func runConnects(ts []string, n int, timeout time.Duration) (ClientResult, error) {
	// Warm up: the first connects pay for ARP and cold caches, in every case alike.
	for i := range min(n/10, 50) {
		if _, err := connectOnly(ts[i%len(ts)], timeout); err != nil {
			return ClientResult{}, fmt.Errorf("connect to %s: %w", ts[i%len(ts)], err)
		}
	}
	ds := make([]time.Duration, 0, n)
	for i := range n {
		d, err := connectOnly(ts[i%len(ts)], timeout)
		if err != nil {
			return ClientResult{}, fmt.Errorf("connect to %s: %w", ts[i%len(ts)], err)
		}
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ClientResult{ConnectP50us: rank(ds, 0.50), ConnectP99us: rank(ds, 0.99), Connects: n}, nil
}

// rank is the nearest-rank percentile of sorted ds, in microseconds.
func rank(ds []time.Duration, p float64) float64 {
	i := int(float64(len(ds))*p+0.5) - 1
	i = max(0, min(i, len(ds)-1))
	return float64(ds[i].Nanoseconds()) / 1e3
}

func runRequests(ts []string, workers int, duration, timeout time.Duration) (ClientResult, error) {
	var done atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	began := time.Now()
	end := began.Add(duration)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := w; time.Now().Before(end); i += workers {
				if _, err := exchange(ts[i%len(ts)], timeout, buf); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("request to %s: %w", ts[i%len(ts)], err) })
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return ClientResult{}, firstErr
	}
	n := done.Load()
	return ClientResult{RPS: float64(n) / time.Since(began).Seconds(), Requests: int(n)}, nil
}

func waitAnswer(t string, timeout, interval time.Duration) (ClientResult, error) {
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 4096)
	var err error
	for time.Now().Before(deadline) {
		// A short connect timeout: an untranslated Service address is routed to the
		// backend's link, where nobody answers ARP for it.
		if _, err = exchange(t, 50*time.Millisecond, buf); err == nil {
			return ClientResult{AnsweredUnixNano: time.Now().UnixNano()}, nil
		}
		time.Sleep(interval)
	}
	return ClientResult{}, fmt.Errorf("%s did not answer within %v: %w", t, timeout, err)
}
