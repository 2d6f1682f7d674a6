package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestRefusalWithSendfile asks whether a client can send a refused request past the
// send-side verdict by writing it with sendfile(2) or splice(2) instead of write(2): each
// way, a refused request must be answered 403 by the verdict and never reach the server,
// and an allowed one must reach it and get its answer.
func TestRefusalWithSendfile(t *testing.T) {
	r := startVerdictRig(t, "request_or_refuse")
	ways := map[string]func(c *net.TCPConn, req string) error{
		// io.Copy from a file to a TCP connection uses sendfile(2).
		"sendfile": func(c *net.TCPConn, req string) error {
			file := filepath.Join(t.TempDir(), "request")
			if err := os.WriteFile(file, []byte(req), 0o600); err != nil {
				return err
			}
			f, err := os.Open(file)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = c.ReadFrom(f)
			return err
		},
		// From a unix socket (a stream the kernel can splice from) it uses splice(2).
		"splice": func(c *net.TCPConn, req string) error {
			a, b, err := unixPair()
			if err != nil {
				return err
			}
			defer a.Close()
			if _, err := io.WriteString(b, req); err != nil {
				return err
			}
			b.Close()
			_, err = c.ReadFrom(a)
			return err
		},
	}
	for name, write := range ways {
		for _, req := range []struct {
			method string
			status int
		}{{"DELETE", 403}, {"GET", 200}} {
			c, err := net.DialTimeout("tcp4", r.server.String(), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(3 * time.Second))
			if err := write(c.(*net.TCPConn), req.method+" /v1 HTTP/1.1\r\nHost: server\r\n\r\n"); err != nil {
				t.Errorf("%s %s: writing: %v", name, req.method, err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Errorf("%s %s: no response: %v", name, req.method, err)
			} else if resp.StatusCode != req.status {
				t.Errorf("%s %s: %d, want %d", name, req.method, resp.StatusCode, req.status)
			}
			c.Close()
		}
	}
	if got, want := r.requests(), []string{"GET /v1", "GET /v1"}; !slices.Equal(got, want) {
		t.Errorf("the server saw %q, want %q (the allowed requests only)", got, want)
	}
}

// unixPair returns two connected unix stream sockets.
func unixPair() (*net.UnixConn, *net.UnixConn, error) {
	dir, err := os.MkdirTemp("", "skrelay-unix-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "s"), Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	defer l.Close()
	a, err := net.DialUnix("unix", nil, l.Addr().(*net.UnixAddr))
	if err != nil {
		return nil, nil, err
	}
	b, err := l.AcceptUnix()
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}
