package l7

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestServerAndProbes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ServeHTTP(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})

	// A port where nothing listens (refused), and a server that closes every connection
	// without answering (what a proxy refusing a connection looks like).
	closedLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := closedLn.Addr().String()
	closedLn.Close()
	hangup, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hangup.Close() })
	go func() {
		for {
			c, err := hangup.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()

	base := "http://" + ln.Addr().String()
	got, err := ProbeAll(ctx, []ProbeRequest{
		{"get", "GET", base + benchPath},
		{"query", "GET", base + benchPath + "?x=1"},
		{"other", "GET", base + "/v2"},
		{"put", "PUT", base + benchPath},
		{"refused", "GET", "http://" + refusedAddr + benchPath},
		{"hangup", "GET", "http://" + hangup.Addr().String() + benchPath},
	}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"get": "200", "query": "200", "other": "404", "put": "405", "refused": OutcomeRefused, "hangup": OutcomeClosed}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}

	resp, err := http.Get(base + benchPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if body := readAll(t, resp); resp.StatusCode != 200 || body != responseBody {
		t.Errorf("GET %s: %d %q, want 200 %q", benchPath, resp.StatusCode, body, responseBody)
	}
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	var sb strings.Builder
	buf := make([]byte, 512)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			return sb.String()
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassify(t *testing.T) {
	dialTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}
	if got, err := classify(fmt.Errorf("Get x: %w", dialTimeout)); got != OutcomeTimeout || err != nil {
		t.Errorf("dial timeout: %q %v", got, err)
	}
	readTimeout := &net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}
	if got, err := classify(fmt.Errorf("Get x: %w", readTimeout)); got != "" || err == nil {
		t.Errorf("a connected request without a response in time must be an error, got %q", got)
	}
}

func TestSubcommandUsage(t *testing.T) {
	var out, errb strings.Builder
	if code := Subcommand("http-probe", []string{"no-equals-sign"}, &out, &errb); code != 2 {
		t.Errorf("bad probe spec: exit %d", code)
	}
	if code := Subcommand("nope", nil, &out, &errb); code != 2 {
		t.Errorf("unknown subcommand: exit %d", code)
	}
}
