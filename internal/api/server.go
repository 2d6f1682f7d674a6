package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Service is what the agent offers through the API. Errors of type *Error keep their
// status; any other error is a 500.
type Service interface {
	Status(ctx context.Context) (Status, error)
	ListEndpoints(ctx context.Context) ([]Endpoint, error)
	GetEndpoint(ctx context.Context, namespace, name string) (Endpoint, error)
	AddEndpoint(ctx context.Context, spec EndpointSpec) (Endpoint, error)
	DeleteEndpoint(ctx context.Context, namespace, name string) error
	LabelEndpoint(ctx context.Context, namespace, name string, change LabelChange) (Endpoint, error)
	ListNamespaces(ctx context.Context) ([]Namespace, error)
	LabelNamespace(ctx context.Context, namespace string, change LabelChange) (Namespace, error)
	ListIdentities(ctx context.Context) ([]Identity, error)
	ListPolicies(ctx context.Context) ([]Policy, error)
	Apply(ctx context.Context, req ApplyRequest) (ChangeResult, error)
	Delete(ctx context.Context, req DeleteRequest) (ChangeResult, error)
	Trace(ctx context.Context, req TraceRequest) (TraceResult, error)
	// Observe calls send for each matching flow: the requested history first, then, with
	// Follow, new flows until ctx ends or send fails.
	Observe(ctx context.Context, req ObserveRequest, send func(Flow) error) error
	ListCIDRSets(ctx context.Context) ([]CIDRSet, error)
	GetCIDRSet(ctx context.Context, name string) (CIDRSet, error)
	// LoadCIDRSet creates the set or replaces its content (the dataplane switches to the
	// new content at once, with no moment in between).
	LoadCIDRSet(ctx context.Context, req CIDRSetRequest) (CIDRSetChange, error)
	// AddCIDRs and RemoveCIDRs change a set in place. Adding to a set that does not exist
	// creates it.
	AddCIDRs(ctx context.Context, req CIDRSetRequest) (CIDRSetChange, error)
	RemoveCIDRs(ctx context.Context, req CIDRSetRequest) (CIDRSetChange, error)
	// DeleteCIDRSet deletes a set; one that policies name only with force.
	DeleteCIDRSet(ctx context.Context, name string, force bool) (CIDRSetChange, error)
}

// CIDRSetRequest carries prefixes for a set. On the wire the prefixes are the request body
// in PrefixList's wire form and Source is the query parameter "source".
type CIDRSetRequest struct {
	Name     string
	Source   string
	Prefixes PrefixList
	// Received is when the server began reading the body (zero when not served over
	// HTTP), for CIDRSetChange.Timing.
	Received time.Time
}

// maxBody bounds request bodies (manifests included).
const maxBody = 64 << 20

// NewHandler serves svc over HTTP with JSON bodies.
func NewHandler(svc Service) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.Status(r.Context()) })
	})
	mux.HandleFunc("GET /v1/endpoints", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListEndpoints(r.Context()) })
	})
	mux.HandleFunc("POST /v1/endpoints", func(w http.ResponseWriter, r *http.Request) {
		var spec EndpointSpec
		withBody(w, r, &spec, func() (any, error) { return svc.AddEndpoint(r.Context(), spec) })
	})
	mux.HandleFunc("GET /v1/endpoints/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.GetEndpoint(r.Context(), r.PathValue("ns"), r.PathValue("name")) })
	})
	mux.HandleFunc("DELETE /v1/endpoints/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) {
			return struct{}{}, svc.DeleteEndpoint(r.Context(), r.PathValue("ns"), r.PathValue("name"))
		})
	})
	mux.HandleFunc("POST /v1/endpoints/{ns}/{name}/labels", func(w http.ResponseWriter, r *http.Request) {
		var c LabelChange
		withBody(w, r, &c, func() (any, error) {
			return svc.LabelEndpoint(r.Context(), r.PathValue("ns"), r.PathValue("name"), c)
		})
	})
	mux.HandleFunc("GET /v1/namespaces", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListNamespaces(r.Context()) })
	})
	mux.HandleFunc("POST /v1/namespaces/{ns}/labels", func(w http.ResponseWriter, r *http.Request) {
		var c LabelChange
		withBody(w, r, &c, func() (any, error) { return svc.LabelNamespace(r.Context(), r.PathValue("ns"), c) })
	})
	mux.HandleFunc("GET /v1/identities", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListIdentities(r.Context()) })
	})
	mux.HandleFunc("GET /v1/policies", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListPolicies(r.Context()) })
	})
	mux.HandleFunc("POST /v1/policies/apply", func(w http.ResponseWriter, r *http.Request) {
		var req ApplyRequest
		withBody(w, r, &req, func() (any, error) { return svc.Apply(r.Context(), req) })
	})
	mux.HandleFunc("POST /v1/policies/delete", func(w http.ResponseWriter, r *http.Request) {
		var req DeleteRequest
		withBody(w, r, &req, func() (any, error) { return svc.Delete(r.Context(), req) })
	})
	mux.HandleFunc("POST /v1/trace", func(w http.ResponseWriter, r *http.Request) {
		var req TraceRequest
		withBody(w, r, &req, func() (any, error) { return svc.Trace(r.Context(), req) })
	})
	mux.HandleFunc("GET /v1/cidrsets", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListCIDRSets(r.Context()) })
	})
	mux.HandleFunc("GET /v1/cidrsets/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.GetCIDRSet(r.Context(), r.PathValue("name")) })
	})
	mux.HandleFunc("PUT /v1/cidrsets/{name}", func(w http.ResponseWriter, r *http.Request) {
		withPrefixes(w, r, svc.LoadCIDRSet)
	})
	mux.HandleFunc("POST /v1/cidrsets/{name}/add", func(w http.ResponseWriter, r *http.Request) {
		withPrefixes(w, r, svc.AddCIDRs)
	})
	mux.HandleFunc("POST /v1/cidrsets/{name}/remove", func(w http.ResponseWriter, r *http.Request) {
		withPrefixes(w, r, svc.RemoveCIDRs)
	})
	mux.HandleFunc("DELETE /v1/cidrsets/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) {
			return svc.DeleteCIDRSet(r.Context(), r.PathValue("name"), r.URL.Query().Get("force") == "true")
		})
	})
	mux.HandleFunc("POST /v1/observe", func(w http.ResponseWriter, r *http.Request) {
		var req ObserveRequest
		if err := decode(r, &req); err != nil {
			writeError(w, err)
			return
		}
		observe(w, r, svc, req)
	})
	return mux
}

// observe streams flows as JSON lines, flushing after each one so `observe --follow` sees
// them as they happen. Errors after the first line cannot change the status any more; they
// end the stream with an {"error": ...} line.
func observe(w http.ResponseWriter, r *http.Request, svc Service, req ObserveRequest) {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	enc := json.NewEncoder(w)
	err := svc.Observe(r.Context(), req, func(f Flow) error {
		if err := enc.Encode(f); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	})
	if err != nil && r.Context().Err() == nil {
		enc.Encode(Error{Message: err.Error()})
	}
}

// withPrefixes decodes a prefix list body (binary: a JSON document per prefix would cost
// more than the whole load) and calls fn with it.
func withPrefixes(w http.ResponseWriter, r *http.Request, fn func(context.Context, CIDRSetRequest) (CIDRSetChange, error)) {
	if ct := r.Header.Get("Content-Type"); ct != PrefixContentType {
		writeError(w, BadRequest("content type %q: want %s", ct, PrefixContentType))
		return
	}
	received := time.Now()
	l, err := ReadPrefixList(r.Body)
	if err != nil {
		writeError(w, BadRequest("decoding prefixes: %v", err))
		return
	}
	req := CIDRSetRequest{Name: r.PathValue("name"), Source: r.URL.Query().Get("source"), Prefixes: l, Received: received}
	reply(w, r, func() (any, error) { return fn(r.Context(), req) })
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return BadRequest("decoding request: %v", err)
	}
	return nil
}

func withBody(w http.ResponseWriter, r *http.Request, v any, fn func() (any, error)) {
	if err := decode(r, v); err != nil {
		writeError(w, err)
		return
	}
	reply(w, r, fn)
}

func reply(w http.ResponseWriter, _ *http.Request, fn func() (any, error)) {
	v, err := fn()
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(statusOf(err))
	json.NewEncoder(w).Encode(Error{Message: err.Error()})
}

// ErrAgentRunning is returned by Listen when another agent answers on the socket.
var ErrAgentRunning = errors.New("an agent is already serving this socket")

// Listen opens the API socket at path, usable only by root (mode 0600, and peers must be
// root, checked in the handler's connection context by Serve). A socket file that exists
// but does not answer is stale and removed; one that answers is another agent's, and Listen
// refuses to take it over.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			// Not a stale socket: a file of someone else's, which must not be removed.
			return nil, fmt.Errorf("socket %s: the path exists and is not a socket", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: %w", path, ErrAgentRunning)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	}
	// Bind under a temporary name, restrict it, then rename it into place: the socket is
	// never reachable with looser permissions.
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	os.Remove(tmp)
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		l.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("restricting socket: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		l.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("placing socket: %w", err)
	}
	return &socketListener{UnixListener: ul, path: path}, nil
}

// socketListener removes its socket file on Close, and only accepts peers with the
// agent's own user id (root): defence in depth behind the file mode.
type socketListener struct {
	*net.UnixListener
	path string
}

func (l *socketListener) Accept() (net.Conn, error) {
	for {
		c, err := l.UnixListener.AcceptUnix()
		if err != nil {
			return nil, err
		}
		if peerAllowed(c) {
			return c, nil
		}
		c.Close()
	}
}

func (l *socketListener) Close() error {
	err := l.UnixListener.Close()
	os.Remove(l.path)
	return err
}

func peerAllowed(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cerr != nil || cred == nil {
		return false
	}
	return cred.Uid == 0 || int(cred.Uid) == syscall.Geteuid()
}

// Serve serves h on l until ctx ends, then shuts down (open observe streams are cut).
func Serve(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	<-errc
	return nil
}
