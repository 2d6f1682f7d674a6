package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// route is one API of the deathstar. Hidden routes work but are not advertised by GET /v1;
// the API log still records every route registered at start, which is the leak.
type route struct {
	Method, Path string
	Hidden       bool
}

var routes = []route{
	{Method: "GET", Path: "/v1"},
	{Method: "POST", Path: "/v1/request-landing"},
	{Method: "PUT", Path: "/v1/exhaust-port", Hidden: true},
}

// handle serves a known route and returns the status it answered with.
func (d *deathstar) handle(rt route, w http.ResponseWriter, r *http.Request) int {
	switch rt.Path {
	case "/v1":
		return d.status(w, r)
	case "/v1/request-landing":
		return d.landing(w, r)
	default:
		return d.exhaustPort(w, r)
	}
}

// storage is one remote FTP storage the API log is shipped to.
type storage struct {
	Name   string
	Target ftpTarget
}

type deathstar struct {
	out           io.Writer // process log: request lines and upload results
	storages      []storage
	uploadTimeout time.Duration
	exit          func(code int) // os.Exit; tests replace it

	mu      sync.Mutex
	apiLog  bytes.Buffer // the API log shipped to storage
	served  int          // requests served, numbers the log lines
	started time.Time

	trigger chan struct{} // an upload round is due (capacity 1: rounds coalesce)
}

func newDeathstar(out io.Writer, storages []storage) *deathstar {
	d := &deathstar{
		out:           out,
		storages:      storages,
		uploadTimeout: 3 * time.Second,
		exit:          os.Exit,
		started:       time.Now(),
		trigger:       make(chan struct{}, 1),
	}
	d.logf("deathstar DS-1 starting")
	for _, rt := range routes {
		note := "public"
		if rt.Hidden {
			note = "hidden: maintenance only, not listed by GET /v1"
		}
		d.logf("registered API %s %s (%s)", rt.Method, rt.Path, note)
	}
	return d
}

// logf appends a line to the API log and mirrors it on the process log.
func (d *deathstar) logf(format string, args ...any) {
	line := time.Now().UTC().Format(time.RFC3339Nano) + " " + fmt.Sprintf(format, args...) + "\n"
	d.mu.Lock()
	d.apiLog.WriteString(line)
	d.mu.Unlock()
	io.WriteString(d.out, line)
}

func (d *deathstar) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	d.served++
	n := d.served
	d.mu.Unlock()
	w.Header().Set("X-Deathstar-Request", strconv.Itoa(n))
	code := http.StatusNotFound
	known := false
	for _, rt := range routes {
		if r.URL.Path != rt.Path {
			continue
		}
		known = true
		if r.Method == rt.Method {
			if rt.Hidden {
				// exhaust-port does not return: log the request first.
				d.logf("#%d %s %s from %s (%s) -> boom", n, r.Method, r.URL.Path, clientIP(r), r.UserAgent())
				d.handle(rt, w, r)
				return
			}
			code = d.handle(rt, w, r)
			break
		}
	}
	switch {
	case code == http.StatusNotFound && known:
		code = http.StatusMethodNotAllowed
		http.Error(w, "Method not allowed", code)
	case code == http.StatusNotFound:
		http.Error(w, "Not found", code)
	}
	d.logf("#%d %s %s from %s (%s) -> %d", n, r.Method, r.URL.Path, clientIP(r), r.UserAgent(), code)
	d.uploadSoon()
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (d *deathstar) status(w http.ResponseWriter, r *http.Request) int {
	var api []string
	for _, rt := range routes {
		if !rt.Hidden {
			api = append(api, rt.Method+" "+rt.Path)
		}
	}
	d.mu.Lock()
	served := d.served
	d.mu.Unlock()
	host, _ := os.Hostname()
	body, _ := json.MarshalIndent(map[string]any{
		"name":              "Death Star",
		"model":             "DS-1 Orbital Battle Station",
		"manufacturer":      "Imperial Department of Military Research, Sienar Fleet Systems",
		"starship_class":    "Deep Space Mobile Battlestation",
		"status":            "operational",
		"hostname":          host,
		"up_seconds":        int(time.Since(d.started).Seconds()),
		"requests_served":   served,
		"api":               api,
		"log_shipped_to":    d.storageNames(),
		"hyperdrive_rating": "4.0",
	}, "", "  ")
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(body, '\n'))
	return http.StatusOK
}

func (d *deathstar) storageNames() []string {
	names := make([]string, 0, len(d.storages))
	for _, s := range d.storages {
		names = append(names, s.Name)
	}
	return names
}

func (d *deathstar) landing(w http.ResponseWriter, r *http.Request) int {
	io.WriteString(w, "Ship landed\n")
	return http.StatusOK
}

// exhaustPort is the design flaw: one request destroys the station. It answers (so the
// attacker sees it happen) and then the process exits.
func (d *deathstar) exhaustPort(w http.ResponseWriter, r *http.Request) int {
	w.WriteHeader(http.StatusInternalServerError)
	io.WriteString(w, "Panic: deathstar exploded\n")
	http.NewResponseController(w).Flush()
	fmt.Fprintln(d.out, "deathstar exploded (PUT /v1/exhaust-port)")
	d.exit(2)
	return http.StatusInternalServerError
}

// uploadSoon asks for an upload round; rounds coalesce, so a burst of requests costs one.
func (d *deathstar) uploadSoon() {
	select {
	case d.trigger <- struct{}{}:
	default:
	}
}

// uploader ships the API log to every storage after each trigger, in parallel, and reports
// each result on the process log as
//
//	upload #N NAME: ok (B bytes)
//	upload #N NAME: failed: REASON
//
// where N is the number of requests the shipped log covers (0: the start-up log only).
func (d *deathstar) uploader(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.trigger:
		}
		d.mu.Lock()
		n := d.served
		data := bytes.Clone(d.apiLog.Bytes())
		d.mu.Unlock()
		results := make([]string, len(d.storages))
		var wg sync.WaitGroup
		for i, s := range d.storages {
			wg.Add(1)
			go func() {
				defer wg.Done()
				uctx, cancel := context.WithTimeout(ctx, d.uploadTimeout)
				defer cancel()
				if err := ftpUpload(uctx, s.Target, data); err != nil {
					reason := err.Error()
					if isTimeout(err) {
						reason = "no answer (timeout): " + reason
					}
					results[i] = fmt.Sprintf("upload #%d %s: failed: %s", n, s.Name, reason)
					return
				}
				results[i] = fmt.Sprintf("upload #%d %s: ok (%d bytes to %s)", n, s.Name, len(data), s.Target)
			}()
		}
		wg.Wait()
		// One write per line, so that readers polling the log never see half a line.
		for _, r := range results {
			io.WriteString(d.out, r+"\n")
		}
	}
}

// storageFlags collects repeated --storage NAME=URL flags.
type storageFlags []storage

func (s *storageFlags) String() string { return fmt.Sprint(*s) }
func (s *storageFlags) Set(v string) error {
	name, u, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("want NAME=ftp://user:password@host[:port]/path, got %q", v)
	}
	t, err := parseFTPURL(u)
	if err != nil {
		return err
	}
	*s = append(*s, storage{Name: name, Target: t})
	return nil
}

func runDeathstar(args []string) {
	fs := flag.NewFlagSet("deathstar", flag.ExitOnError)
	listen := fs.String("listen", ":80", "HTTP listen address")
	var stores storageFlags
	fs.Var(&stores, "storage", "ship the API log to NAME=ftp://user:password@host[:port]/path (repeatable)")
	timeout := fs.Duration("upload-timeout", 3*time.Second, "bound on one upload to one storage")
	fs.Parse(args)

	out := &lineWriter{w: os.Stdout}
	d := newDeathstar(out, stores)
	d.uploadTimeout = *timeout
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "deathstar: %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go d.uploader(ctx)
	d.uploadSoon() // ship the start-up log at once
	srv := &http.Server{Handler: d, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	fmt.Fprintf(out, "deathstar listening on %s\n", l.Addr())
	if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
		fmt.Fprintf(os.Stderr, "deathstar: %v\n", err)
		os.Exit(1)
	}
}

// lineWriter serialises writes from several goroutines so that lines never interleave.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
