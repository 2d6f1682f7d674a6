package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"
)

// shipResult is what a ship saw: Outcome is the HTTP status code ("200", "403", ...) or one
// of "timeout" (no answer: the connection was dropped), "refused" (nothing listens),
// "closed" (the connection was reset or closed without an answer) and "error".
type shipResult struct {
	Outcome string
	Request string // the deathstar's request number, if it answered with one
	Body    string
	Err     error
}

// String is the line the demo prints and parses: the outcome first, then details.
func (r shipResult) String() string {
	var b strings.Builder
	b.WriteString(r.Outcome)
	if r.Request != "" {
		fmt.Fprintf(&b, " [request #%s]", r.Request)
	}
	body := strings.TrimRight(r.Body, "\n")
	switch {
	case r.Err != nil:
		fmt.Fprintf(&b, " (%v)", r.Err)
	case strings.Contains(body, "\n"):
		b.WriteString("\n    " + strings.ReplaceAll(body, "\n", "\n    "))
	case body != "":
		b.WriteString(" " + body)
	}
	return b.String()
}

// fly sends one request on a fresh connection (no keep-alive, so that each request is a
// new flow the policy sees).
func fly(ctx context.Context, name, method, url string, timeout time.Duration) shipResult {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return shipResult{Outcome: "error", Err: err}
	}
	req.Header.Set("User-Agent", name)
	tr := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	resp, err := client.Do(req)
	if err != nil {
		return shipResult{Outcome: classify(err), Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	res := shipResult{Outcome: fmt.Sprint(resp.StatusCode), Request: resp.Header.Get("X-Deathstar-Request"), Body: string(body)}
	if err != nil && len(body) == 0 {
		res.Err = fmt.Errorf("reading the answer: %w", err)
	}
	return res
}

func classify(err error) string {
	switch {
	case isTimeout(err):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.EPIPE):
		return "closed"
	}
	return "error"
}

func runShip(args []string) {
	fs := flag.NewFlagSet("ship", flag.ExitOnError)
	name := fs.String("name", "ship", "the ship's name (sent as User-Agent)")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for an answer")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: starwars ship [--name NAME] [--timeout D] METHOD URL")
		fs.PrintDefaults()
	}
	fs.Parse(args)
	if fs.NArg() != 2 {
		fs.Usage()
		os.Exit(2)
	}
	res := fly(context.Background(), *name, strings.ToUpper(fs.Arg(0)), fs.Arg(1), *timeout)
	fmt.Println(res)
	if res.Outcome == "error" {
		os.Exit(1)
	}
}

func runFTPGet(args []string) {
	fs := flag.NewFlagSet("ftp-get", flag.ExitOnError)
	timeout := fs.Duration("timeout", 5*time.Second, "bound on the whole transfer")
	fs.Parse(args)
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: starwars ftp-get [--timeout D] ftp://[user[:password]@]host[:port]/path")
		os.Exit(2)
	}
	t, err := parseFTPURL(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(os.Stderr, "ftp-get: %v\n", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	data, err := ftpDownload(ctx, t)
	if err != nil {
		fmt.Printf("ftp-get %s: %v\n", t, err)
		os.Exit(1)
	}
	os.Stdout.Write(data)
}

// runWaitTCP polls until ADDR accepts a TCP connection (a server has started), so that
// scripts need no fixed sleeps.
func runWaitTCP(args []string) {
	fs := flag.NewFlagSet("wait-tcp", flag.ExitOnError)
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	fs.Parse(args)
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: starwars wait-tcp [--timeout D] HOST:PORT")
		os.Exit(2)
	}
	deadline := time.Now().Add(*timeout)
	for {
		c, err := net.DialTimeout("tcp", fs.Arg(0), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "wait-tcp %s: %v\n", fs.Arg(0), err)
			os.Exit(1)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
