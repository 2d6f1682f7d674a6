package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

func TestDeathstarAPI(t *testing.T) {
	var out testenv.SyncBuffer
	d := newDeathstar(&out, nil)
	exited := -1
	d.exit = func(code int) { exited = code }
	srv := httptest.NewServer(d)
	defer srv.Close()

	do := func(method, path string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		req.Header.Set("User-Agent", "tiefighter")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}

	code, body, _ := do("GET", "/v1")
	if code != 200 {
		t.Fatalf("GET /v1: %d %s", code, body)
	}
	var st struct {
		API    []string `json:"api"`
		Status string   `json:"status"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("GET /v1 body: %v\n%s", err, body)
	}
	if strings.Join(st.API, ",") != "GET /v1,POST /v1/request-landing" || st.Status != "operational" {
		t.Errorf("GET /v1: api %v status %q; want the two public APIs, operational", st.API, st.Status)
	}
	if strings.Contains(body, "exhaust-port") {
		t.Errorf("GET /v1 reveals the hidden API:\n%s", body)
	}

	code, body, h := do("POST", "/v1/request-landing")
	if code != 200 || body != "Ship landed\n" || h.Get("X-Deathstar-Request") != "2" {
		t.Errorf("POST /v1/request-landing: %d %q request %q; want 200 \"Ship landed\" request 2", code, body, h.Get("X-Deathstar-Request"))
	}
	if code, _, _ := do("GET", "/v1/request-landing"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/request-landing: %d, want 405", code)
	}
	for _, p := range []string{"/v1/", "/V1", "/v2", "/v1/exhaust-port/x"} {
		if code, _, _ := do("GET", p); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, code)
		}
	}
	if exited != -1 {
		t.Fatalf("the deathstar exited (%d) before the exhaust port was hit", exited)
	}
	code, body, _ = do("PUT", "/v1/exhaust-port")
	if code != 500 || !strings.Contains(body, "deathstar exploded") || exited != 2 {
		t.Errorf("PUT /v1/exhaust-port: %d %q, exit %d; want 500, exploded, exit 2", code, body, exited)
	}

	// The API log, which is what gets shipped to storage, names the hidden API and every
	// request with its client.
	d.mu.Lock()
	log := d.apiLog.String()
	d.mu.Unlock()
	for _, want := range []string{
		"registered API PUT /v1/exhaust-port (hidden",
		"#1 GET /v1 from 127.0.0.1 (tiefighter) -> 200",
		"#2 POST /v1/request-landing from 127.0.0.1 (tiefighter) -> 200",
		"#3 GET /v1/request-landing from 127.0.0.1 (tiefighter) -> 405",
		"PUT /v1/exhaust-port from 127.0.0.1 (tiefighter) -> boom",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("API log lacks %q:\n%s", want, log)
		}
	}
}

func TestShipOutcomes(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.UserAgent() != "xwing" {
			http.Error(w, "who are you", 400)
			return
		}
		w.Header().Set("X-Deathstar-Request", "7")
		io.WriteString(w, "Ship landed\n")
	}))
	defer srv.Close()
	res := fly(ctx, "xwing", "POST", srv.URL+"/v1/request-landing", time.Second)
	if res.Outcome != "200" || res.String() != "200 [request #7] Ship landed" {
		t.Errorf("answered request: %q", res)
	}

	// Nothing listens: refused.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := l.Addr().String()
	l.Close()
	if res := fly(ctx, "xwing", "GET", "http://"+closedAddr+"/v1", time.Second); res.Outcome != "refused" {
		t.Errorf("closed port: %q, want refused", res)
	}

	// Accepted by the kernel but never answered (what a dropped reply looks like): timeout.
	silent, _ := net.Listen("tcp", "127.0.0.1:0")
	defer silent.Close()
	if res := fly(ctx, "xwing", "GET", "http://"+silent.Addr().String()+"/v1", 300*time.Millisecond); res.Outcome != "timeout" {
		t.Errorf("silent server: %q, want timeout", res)
	}

	// Accepted and closed without an answer: closed.
	slam, _ := net.Listen("tcp", "127.0.0.1:0")
	defer slam.Close()
	go func() {
		for {
			c, err := slam.Accept()
			if err != nil {
				return
			}
			bufio.NewReader(c).ReadString('\n')
			c.Close()
		}
	}()
	if res := fly(ctx, "xwing", "GET", "http://"+slam.Addr().String()+"/v1", time.Second); res.Outcome != "closed" {
		t.Errorf("server closing the connection: %q, want closed", res)
	}
}

func TestParseFTPURL(t *testing.T) {
	tg, err := parseFTPURL("ftp://deathstar:s3cret@198.18.0.5/deathstar-api.log")
	if err != nil || tg.Addr != "198.18.0.5:21" || tg.User != "deathstar" || tg.Password != "s3cret" || tg.Path != "/deathstar-api.log" {
		t.Errorf("got %+v, %v", tg, err)
	}
	if s := tg.String(); strings.Contains(s, "s3cret") {
		t.Errorf("String shows the password: %s", s)
	}
	tg, err = parseFTPURL("ftp://198.18.0.6:2121/x.log")
	if err != nil || tg.Addr != "198.18.0.6:2121" || tg.User != "anonymous" {
		t.Errorf("anonymous: got %+v, %v", tg, err)
	}
	for _, bad := range []string{"http://x/y", "ftp://x", "ftp://x/", "ftp:///y"} {
		if _, err := parseFTPURL(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// startFTP runs examples/starwars/ftp-storage.py on a free loopback port and returns its
// address and root directory.
func startFTP(t *testing.T, name string, extra ...string) (addr, root string) {
	t.Helper()
	if err := exec.Command("python3", "-c", "import pyftpdlib").Run(); err != nil {
		testenv.SkipOrFail(t, "pyftpdlib is not installed (scripts/setup.sh installs it): %v", err)
	}
	root = t.TempDir()
	args := append([]string{"../../ftp-storage.py", "--name", name, "--root", root,
		"--listen", "127.0.0.1", "--port", "0", "--passive-ports", "", "--user", "deathstar:pw"}, extra...)
	cmd := exec.Command("python3", args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// The server prints its address once it listens; read until then, then keep draining.
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
	}()
	deadline := time.After(15 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("FTP server exited before listening")
			}
			if _, a, found := strings.Cut(l, ": listening on "); found {
				return a, root
			}
		case <-deadline:
			t.Fatal("FTP server did not start in 15s")
		}
	}
}

func TestFTPAgainstRealServer(t *testing.T) {
	legacy, legacyRoot := startFTP(t, "storage-legacy", "--anonymous-read")
	secure, _ := startFTP(t, "storage-secure")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tg := func(s string) ftpTarget {
		t.Helper()
		x, err := parseFTPURL(s)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}

	data := []byte("registered API PUT /v1/exhaust-port (hidden)\n")
	if err := ftpUpload(ctx, tg("ftp://deathstar:pw@"+legacy+"/api.log"), data); err != nil {
		t.Fatalf("upload: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(legacyRoot, "api.log")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("stored file: %q, %v", got, err)
	}
	// A second upload replaces the file.
	data2 := append(bytes.Clone(data), "#1 POST /v1/request-landing\n"...)
	if err := ftpUpload(ctx, tg("ftp://deathstar:pw@"+legacy+"/api.log"), data2); err != nil {
		t.Fatalf("second upload: %v", err)
	}
	got, err := ftpDownload(ctx, tg("ftp://"+legacy+"/api.log"))
	if err != nil || !bytes.Equal(got, data2) {
		t.Fatalf("anonymous read from the legacy server: %q, %v", got, err)
	}
	// Anonymous users may read the legacy server, not write to it.
	if err := ftpUpload(ctx, tg("ftp://"+legacy+"/evil.log"), []byte("x")); err == nil {
		t.Error("anonymous upload to the legacy server was accepted")
	}
	// The secure server has no anonymous access at all, and checks passwords.
	if err := ftpUpload(ctx, tg("ftp://deathstar:pw@"+secure+"/api.log"), data); err != nil {
		t.Fatalf("upload to secure: %v", err)
	}
	if _, err := ftpDownload(ctx, tg("ftp://"+secure+"/api.log")); err == nil || !strings.Contains(err.Error(), "530") {
		t.Errorf("anonymous read from the secure server: %v, want a 530 refusal", err)
	}
	if got, err := ftpDownload(ctx, tg("ftp://deathstar:pw@"+secure+"/api.log")); err != nil || !bytes.Equal(got, data) {
		t.Errorf("read from secure with the account: %q, %v", got, err)
	}
}

func TestUploaderReports(t *testing.T) {
	legacy, legacyRoot := startFTP(t, "storage-legacy", "--anonymous-read")
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	gone := l.Addr().String()
	l.Close()
	var stores storageFlags
	for _, s := range []string{
		"storage-legacy=ftp://deathstar:pw@" + legacy + "/deathstar-api.log",
		"storage-gone=ftp://deathstar:pw@" + gone + "/deathstar-api.log",
	} {
		if err := stores.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	var out testenv.SyncBuffer
	d := newDeathstar(&out, stores)
	d.uploadTimeout = 5 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go d.uploader(ctx)
	srv := httptest.NewServer(d)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/request-landing", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(out.String(), "upload #1 storage-gone:") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	log := out.String()
	for _, want := range []string{"upload #1 storage-legacy: ok (", "upload #1 storage-gone: failed: "} {
		if !strings.Contains(log, want) {
			t.Errorf("process log lacks %q:\n%s", want, log)
		}
	}
	stored, _ := os.ReadFile(filepath.Join(legacyRoot, "deathstar-api.log"))
	if !bytes.Contains(stored, []byte("#1 POST /v1/request-landing")) || !bytes.Contains(stored, []byte("exhaust-port")) {
		t.Errorf("stored log:\n%s", stored)
	}
}
