package main

import (
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// TestRefusalOrder checks the order guard of the send-side design (pipeline.bpf.c): a
// client that waits for each response gets its refusal as a 403, in order; a client that
// sends a refused request before it has read the answer to an earlier one is not
// answered out of order: its send fails, and the earlier answer still arrives whole.
func TestRefusalOrder(t *testing.T) {
	r := &verdictRig{}
	dir := t.TempDir()
	if _, err := exec.LookPath("bpftool"); err != nil {
		benchkit.SkipOrFail(t, "bpftool not found (scripts/setup.sh installs it)")
	}
	vmlinux, err := exec.Command("bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "c").Output()
	if err != nil {
		t.Fatalf("dumping the kernel's BTF: %v", err)
	}
	writeFile(t, filepath.Join(dir, "vmlinux.h"), vmlinux)
	r.start(t, compileBPF(t, "pipeline", dir, "-I"+dir), "clients", "request_in_order", "track")
	attachMsgTo(t, r.coll, "servers", "response_tracker")

	c, br := r.dial(t)
	roundTrip := func(method string, want int) {
		t.Helper()
		if _, err := io.WriteString(c, method+" /v1 HTTP/1.1\r\nHost: server\r\n\r\n"); err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s: %d, want %d", method, resp.StatusCode, want)
		}
	}
	// Waiting for each answer: refusals come as 403s, in order.
	roundTrip("GET", 200)
	roundTrip("DELETE", 403)
	roundTrip("GET", 200)

	// Pipelining: GET, then DELETE before reading the GET's answer.
	if _, err := io.WriteString(c, "GET /v1 HTTP/1.1\r\nHost: server\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_, werr := io.WriteString(c, "DELETE /v1 HTTP/1.1\r\nHost: server\r\n\r\n")
	if werr == nil {
		t.Errorf("the pipelined refused request was accepted, want its send to fail")
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the answer to the pipelined GET: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "hello from the server" {
		t.Errorf("the answer to the pipelined GET: %d %q, want 200 from the server", resp.StatusCode, body)
	}
	if got, want := r.requests(), []string{"GET /v1", "GET /v1", "GET /v1"}; !slices.Equal(got, want) {
		t.Errorf("the server saw %q, want %q", got, want)
	}
	var v [3]uint64
	for k := range v {
		if err := r.coll.Maps["verdicts"].Lookup(uint32(k), &v[k]); err != nil {
			t.Fatal(err)
		}
	}
	if v != [3]uint64{3, 1, 1} {
		t.Errorf("verdicts (passed, 403, failed send) %v, want [3 1 1]", v)
	}
}
