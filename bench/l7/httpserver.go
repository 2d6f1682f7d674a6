package l7

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"
)

// responseBody is what GET /v1 returns: small, like the paper's "hello world" server, so
// the benchmark measures per-request cost, not bandwidth.
const responseBody = "hello world\n"

// serverHandler answers GET /v1 with 200 and responseBody, other methods on /v1 with 405,
// and every other path with 404.
func serverHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != benchPath {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, responseBody)
	})
}

// ServeHTTP runs the benchmark's HTTP server on ln until ctx is done.
func ServeHTTP(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           serverHandler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// Connection errors under load are the load generator's to report.
		ErrorLog: nil,
	}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err := srv.Serve(ln)
	if ctx.Err() != nil && errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serving HTTP: %w", err)
}

// ProbeRequest is one HTTP request of a probe run.
type ProbeRequest struct {
	Name   string
	Method string
	URL    string
}

// ProbeAll sends each request on a fresh connection, concurrently, and returns each one's
// outcome by name: the HTTP status code ("200", "403"), or OutcomeTimeout, OutcomeRefused
// or OutcomeClosed. Other failures are errors.
func ProbeAll(ctx context.Context, reqs []ProbeRequest, timeout time.Duration) (map[string]string, error) {
	out := map[string]string{}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Go(func() {
			o, err := probeOnce(ctx, r, timeout)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", r.Name, err))
				return
			}
			out[r.Name] = o
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// probeOnce makes one request on a new connection. timeout bounds the connection attempt
// (a dropped SYN is retransmitted after 1 s, so 500 ms tells a drop from a slow answer);
// the response gets four times as long.
func probeOnce(ctx context.Context, r ProbeRequest, timeout time.Duration) (string, error) {
	tr := &http.Transport{
		DialContext:       (&net.Dialer{Timeout: timeout}).DialContext,
		DisableKeepAlives: true,
		Proxy:             nil,
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: timeout * 5}
	req, err := http.NewRequestWithContext(ctx, r.Method, r.URL, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return classify(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return fmt.Sprint(resp.StatusCode), nil
}

// classify turns a failed request into an outcome.
func classify(err error) (string, error) {
	var op *net.OpError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return OutcomeRefused, nil
	case errors.As(err, &op) && op.Op == "dial" && op.Timeout():
		return OutcomeTimeout, nil
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		strings.Contains(err.Error(), "server closed"), strings.Contains(err.Error(), "connection reset"):
		return OutcomeClosed, nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		// Connected but no response in time: neither a drop nor an answer.
		return "", fmt.Errorf("no response in time: %w", err)
	}
	return "", err
}
