package testenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"time"
)

// HTTPServer is an HTTP server listening inside a network namespace. It speaks HTTP/1.1 and
// HTTP/2 with prior knowledge (h2c, as gRPC clients do) on the same port.
type HTTPServer struct {
	Addr netip.AddrPort
	srv  *http.Server
	done chan struct{}
}

// ServeHTTP starts h on port (all IPv4 addresses) in the namespace at nsPath.
func ServeHTTP(nsPath string, port uint16, h http.Handler) (*HTTPServer, error) {
	return serveHTTP(nsPath, "tcp4", fmt.Sprintf(":%d", port), h)
}

// ServeHTTPOn starts h on addr (IPv4 or IPv6) in the namespace at nsPath.
func ServeHTTPOn(nsPath string, addr netip.AddrPort, h http.Handler) (*HTTPServer, error) {
	return serveHTTP(nsPath, "tcp", addr.String(), h)
}

func serveHTTP(nsPath, network, addr string, h http.Handler) (*HTTPServer, error) {
	var l net.Listener
	err := InNetns(nsPath, func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s in %s: %w", addr, nsPath, err)
	}
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	s := &HTTPServer{
		Addr: netip.MustParseAddrPort(l.Addr().String()),
		srv:  &http.Server{Handler: h, Protocols: &p, ReadHeaderTimeout: 10 * time.Second},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		s.srv.Serve(l)
	}()
	return s, nil
}

// Close stops the server and its connections.
func (s *HTTPServer) Close() {
	s.srv.Close()
	<-s.done
}

// EchoHTTP answers every request with 200 and a body "<method> <path> from <remote addr>\n"
// (the path with its query), and the header X-Remote-Addr: what the server saw, so tests
// can check that the proxy kept the client's address. It reads and discards the body.
func EchoHTTP() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Remote-Addr", r.RemoteAddr)
		fmt.Fprintf(w, "%s %s from %s\n", r.Method, r.URL.RequestURI(), r.RemoteAddr)
	})
}

// HTTPClient returns a client whose connections are opened inside the namespace at nsPath
// (HTTP/1.1; keep-alive as usual, so requests may share a connection).
func HTTPClient(nsPath string, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				ap, err := netip.ParseAddrPort(addr)
				if err != nil {
					return nil, err
				}
				return Dial(nsPath, "tcp", ap, timeout)
			},
			DisableCompression: true,
		},
	}
}

// H2CClient is HTTPClient speaking HTTP/2 with prior knowledge (h2c).
func H2CClient(nsPath string, timeout time.Duration) *http.Client {
	c := HTTPClient(nsPath, timeout)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	c.Transport.(*http.Transport).Protocols = &p
	return c
}

// RawHTTP is one client connection for hand-written requests (smuggling, pipelining,
// malformed input): write bytes, read responses one by one.
type RawHTTP struct {
	Conn net.Conn
	r    *bufio.Reader
}

// DialRawHTTP connects from the namespace at nsPath.
func DialRawHTTP(nsPath string, to netip.AddrPort, timeout time.Duration) (*RawHTTP, error) {
	c, err := Dial(nsPath, "tcp", to, timeout)
	if err != nil {
		return nil, err
	}
	return NewRawHTTP(c, timeout), nil
}

// NewRawHTTP wraps a connection the caller opened; its deadline is set timeout from now.
func NewRawHTTP(c net.Conn, timeout time.Duration) *RawHTTP {
	c.SetDeadline(time.Now().Add(timeout))
	return &RawHTTP{Conn: c, r: bufio.NewReader(c)}
}

// Send writes raw bytes.
func (c *RawHTTP) Send(s string) error {
	_, err := io.WriteString(c.Conn, s)
	return err
}

// Response reads the next response (its body in full). req may be nil; a HEAD request
// needs it to know there is no body.
func (c *RawHTTP) Response(req *http.Request) (*http.Response, string, error) {
	resp, err := http.ReadResponse(c.r, req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// Close closes the connection.
func (c *RawHTTP) Close() error { return c.Conn.Close() }

// Shell runs a command inside the network namespace at nsPath (nsenter --net: the mount
// namespace, and with it /sys/fs/bpf, stays the caller's) and returns its combined output.
func Shell(nsPath string, args ...string) (string, error) {
	out, err := exec.Command("nsenter", append([]string{"--net=" + nsPath, "--"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// TPROXY steers TCP connections to port that arrive on clientIf (a host-side veth in the
// node namespace at nodePath) to a transparent listener at listen, with iptables TPROXY,
// and brings the replies of upstream connections arriving on serverIfs back to the
// listener's process (socket match). It adds the policy route fwmark 0x1 -> local table
// 101 if missing. This is the iptables stand-in for the BPF steering (see
// ../../ENVOY-FACTS), for testing the proxy on its own. The rules go when the node
// namespace does.
func TPROXY(nodePath, clientIf string, serverIfs []string, port uint16, listen netip.AddrPort) error {
	if out, _ := Shell(nodePath, "ip", "rule", "show"); !strings.Contains(out, "lookup 101") {
		if _, err := Shell(nodePath, "ip", "rule", "add", "fwmark", "0x1/0x1", "lookup", "101"); err != nil {
			return err
		}
		if _, err := Shell(nodePath, "ip", "route", "replace", "local", "0.0.0.0/0", "dev", "lo", "table", "101"); err != nil {
			return err
		}
	}
	if _, err := Shell(nodePath, "iptables", "-w", "-t", "mangle", "-A", "PREROUTING", "-i", clientIf, "-p", "tcp",
		"--dport", fmt.Sprint(port), "-j", "TPROXY", "--on-ip", listen.Addr().String(),
		"--on-port", fmt.Sprint(listen.Port()), "--tproxy-mark", "0x1/0x1"); err != nil {
		return err
	}
	for _, s := range serverIfs {
		if _, err := Shell(nodePath, "iptables", "-w", "-t", "mangle", "-A", "PREROUTING", "-i", s, "-p", "tcp",
			"-m", "socket", "--transparent", "-j", "MARK", "--set-mark", "0x1/0x1"); err != nil {
			return err
		}
	}
	return nil
}
