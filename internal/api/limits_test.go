package api

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// heldService holds every Apply until release is closed, counting how many run at once.
type heldService struct {
	fakeService
	mu               sync.Mutex
	running, maxSeen int
	entered          chan struct{}
	release          chan struct{}
}

func (s *heldService) Apply(ctx context.Context, _ ApplyRequest) (ChangeResult, error) {
	s.mu.Lock()
	s.running++
	s.maxSeen = max(s.maxSeen, s.running)
	s.mu.Unlock()
	s.entered <- struct{}{}
	<-s.release
	s.mu.Lock()
	s.running--
	s.mu.Unlock()
	return ChangeResult{}, nil
}

// TestLargeRequestsAtOnce: at most maxBulk large requests are handled at once; the others
// wait (their bodies unread) while small requests are still answered.
func TestLargeRequestsAtOnce(t *testing.T) {
	svc := &heldService{entered: make(chan struct{}, 8), release: make(chan struct{})}
	c, _ := serveFake(t, svc)
	const n = 6
	done := make(chan error, n)
	for range n {
		go func() {
			_, err := c.Apply(context.Background(), ApplyRequest{Documents: []Document{{Source: "p.yaml", Data: "x"}}})
			done <- err
		}()
	}
	for range maxBulk {
		select {
		case <-svc.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the first large requests were not handled")
		}
	}
	// The others are waiting: none enters while the first ones hold their places, and a
	// small request is answered meanwhile.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Status(ctx); err != nil {
		t.Fatalf("status while large requests wait: %v", err)
	}
	select {
	case <-svc.entered:
		t.Fatalf("more than %d large requests handled at once", maxBulk)
	case <-time.After(200 * time.Millisecond):
	}
	close(svc.release)
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if svc.maxSeen != maxBulk {
		t.Errorf("%d large requests handled at once, want %d", svc.maxSeen, maxBulk)
	}
}

// TestConnectionLimit: at most maxConns connections are served at once (each may hold a
// body in memory); the next one is served when one of them closes.
func TestConnectionLimit(t *testing.T) {
	c, path := serveFake(t, fakeService{})
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range maxConns {
		conn, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	answered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := c.Status(ctx)
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("connection %d served (%v) while %d were open", maxConns+1, err, maxConns)
	case <-time.After(200 * time.Millisecond):
	}
	conns[0].Close()
	if err := <-answered; err != nil {
		t.Fatalf("not served after a connection closed: %v", err)
	}
}

// TestBodyTimeout: a body sent too slowly is refused once bodyTimeout has passed, and the
// connection is closed.
func TestBodyTimeout(t *testing.T) {
	old := bodyTimeout
	bodyTimeout = 200 * time.Millisecond
	t.Cleanup(func() { bodyTimeout = old })
	_, path := serveFake(t, fakeService{})
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	// Ten bytes of the hundred announced, then nothing.
	if _, err := conn.Write([]byte("POST /v1/trace HTTP/1.1\r\nHost: r\r\nContent-Length: 100\r\n\r\n{\"from\": \"")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "request body of POST /v1/trace: reading:") || !strings.Contains(string(body), "i/o timeout") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}
