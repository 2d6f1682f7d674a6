package agenttest

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
)

// Helpers for L7 tests against an agent (StartAgent with NoServers, so that an HTTP server
// can take port 80).

// ServeHTTP starts h on port in endpoint key (ns/name); it stops when the test ends.
func (e *Env) ServeHTTP(key string, port uint16, h http.Handler) *testenv.HTTPServer {
	e.T.Helper()
	s, err := testenv.ServeHTTP(e.Endpoint(key).Netns, port, h)
	if err != nil {
		e.T.Fatalf("serving HTTP in %s: %v", key, err)
	}
	e.T.Cleanup(s.Close)
	return s
}

// HTTPClient returns an HTTP/1.1 client whose connections start in endpoint from (ns/name).
func (e *Env) HTTPClient(from string, timeout time.Duration) *http.Client {
	e.T.Helper()
	c := testenv.HTTPClient(e.nsPath(from), timeout)
	e.T.Cleanup(c.CloseIdleConnections)
	return c
}

// H2CClient is HTTPClient speaking HTTP/2 with prior knowledge (gRPC's h2c).
func (e *Env) H2CClient(from string, timeout time.Duration) *http.Client {
	e.T.Helper()
	c := testenv.H2CClient(e.nsPath(from), timeout)
	e.T.Cleanup(c.CloseIdleConnections)
	return c
}

func (e *Env) nsPath(key string) string {
	ns, name, _ := strings.Cut(key, "/")
	return NetnsPathOf(e.Config.Instance, ns, name)
}

// ProxyStatus returns the agent's L7 proxy status.
func (e *Env) ProxyStatus() api.ProxyStatus {
	e.T.Helper()
	st, err := e.Client.Status(context.Background())
	if err != nil {
		e.T.Fatalf("status: %v", err)
	}
	return st.Proxy
}

// WaitProxy waits until the L7 proxy runs and has applied the latest configuration.
func (e *Env) WaitProxy(timeout time.Duration) api.ProxyStatus {
	e.T.Helper()
	var p api.ProxyStatus
	if !testenv.Eventually(timeout, func() bool {
		p = e.ProxyStatus()
		return p.State == "running" && p.AckedVersion == p.Version && p.Version > 0
	}) {
		e.T.Fatalf("L7 proxy not ready after %v: %+v", timeout, p)
	}
	return p
}
