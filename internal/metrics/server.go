package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Path is where the metrics are served.
const Path = "/metrics"

// Handler serves src's metrics, with the Go runtime's and the process's (memory, CPU,
// file descriptors), in Prometheus's text and protobuf formats.
func Handler(src Source, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(src, log), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
		// One scrape at a time: each reads the agent's state, and a pile of them behind a
		// long change must not pile up work.
		MaxRequestsInFlight: 1,
		Timeout:             scrapeTimeout + time.Second,
	})
}

// Server serves the metrics over HTTP on one address.
type Server struct {
	l   net.Listener
	srv *http.Server
}

// Listen takes addr (host:port; port 0 picks a free one) for the metrics of src.
func Listen(addr string, src Source, log *slog.Logger) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, Handler(src, log))
	return &Server{l: l, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.l.Addr() }

// Serve serves until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			s.srv.Close()
		case <-done:
		}
	}()
	defer close(done)
	err := s.srv.Serve(s.l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serving metrics: %w", err)
}
