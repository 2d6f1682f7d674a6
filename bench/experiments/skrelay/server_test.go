package main

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// TestServerSendsThroughTracker asks what the server side of a send-side design needs: with
// the server's accepted sockets in a sockhash under an sk_msg program (msg.bpf.c,
// response_seen), do its responses still arrive whole, also one written with sendfile(2)
// (http.ServeFile), and does the program see each response's status line?
func TestServerSendsThroughTracker(t *testing.T) {
	testenv.RequireRoot(t)
	obj := compileBPF(t, "msg", t.TempDir())
	content := make([]byte, 1<<20)
	rand.Read(content)
	file := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(file, content, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	mux.HandleFunc("/file", func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, file) })
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	defer srv.Close()
	port := l.Addr().(*net.TCPAddr).Port

	consts, err := verdictConsts(uint16(port))
	if err != nil {
		t.Fatal(err)
	}
	coll, err := loadObject(obj, consts)
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()
	attachMsg(t, coll, "servers", "response_seen", "track_servers")

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	var received int
	for _, c := range []struct {
		path string
		want []byte
	}{{"/small", []byte("hello")}, {"/file", content}, {"/small", []byte("hello")}} {
		resp, err := client.Get("http://" + l.Addr().String() + c.path)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !bytes.Equal(body, c.want) {
			t.Fatalf("%s: %d, %d bytes (%v), want 200 and the %d bytes sent", c.path, resp.StatusCode, len(body), err, len(c.want))
		}
		received += len(body)
	}
	var bytesSent, heads []uint64
	if err := coll.Maps["sent"].Lookup(uint32(0), &bytesSent); err != nil {
		t.Fatal(err)
	}
	if err := coll.Maps["sent"].Lookup(uint32(1), &heads); err != nil {
		t.Fatal(err)
	}
	if sum(heads) != 3 || sum(bytesSent) < uint64(received) {
		t.Errorf("the program saw %d status lines and %d bytes; want 3, and at least the %d body bytes", sum(heads), sum(bytesSent), received)
	}
}
