package servicemap

import (
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rampartnet/rampart/internal/api"
)

// Source is what the map reads from the agent (*agent.Agent).
type Source interface {
	ListEndpoints(ctx context.Context) ([]api.Endpoint, error)
	ListRemoteEndpoints(ctx context.Context) ([]api.RemoteEndpoint, error)
	// Observe is the flow hub's: the map follows it from the start of the history.
	Observe(ctx context.Context, req api.ObserveRequest, send func(api.Flow) error) error
}

// Options configure the map.
type Options struct {
	MaxEdges int // 0: DefaultMaxEdges
	MaxFlows int // 0: DefaultMaxFlows
	Logger   *slog.Logger
}

//go:embed web
var webFiles embed.FS

// maxMapRequests bounds the /api/map requests served at once: each lists the endpoints
// under the agent's lock, which a long change (a large CIDR set load) holds whatever the
// request's context says, and requests piling up behind it must not pile up without bound.
// Each open page has at most one request out at a time.
const maxMapRequests = 4

// Map is what /api/map answers: the endpoints grouped by namespace, with the peers the
// edges name that are not endpoints, and the edges.
type Map struct {
	Time       time.Time   `json:"time"`
	Namespaces []Namespace `json:"namespaces"`
	Edges      []Edge      `json:"edges"`
	Stats      Stats       `json:"stats"`
	// Error says why the endpoints could not be listed (the edges stand).
	Error string `json:"error,omitempty"`
}

// Namespace is a group of nodes on the page. The peers that are not endpoints are in the
// group with the empty name, last.
type Namespace struct {
	Name  string `json:"name"`
	Nodes []Peer `json:"nodes"`
}

// FlowTable is what /api/flows answers.
type FlowTable struct {
	Flows []FlowRow `json:"flows"`
	Stats Stats     `json:"stats"`
}

// Handler serves the page and its JSON endpoints from agg and src.
func Handler(src Source, agg *Aggregator) http.Handler {
	mux := http.NewServeMux()
	web, err := fs.Sub(webFiles, "web")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	// GET patterns also answer HEAD; every other method gets 405: the page changes nothing.
	mux.Handle("GET /", http.FileServerFS(web))
	busy := make(chan struct{}, maxMapRequests)
	mux.HandleFunc("GET /api/map", func(w http.ResponseWriter, r *http.Request) {
		select {
		case busy <- struct{}{}:
			defer func() { <-busy }()
		default:
			writeError(w, http.StatusServiceUnavailable, fmt.Errorf("%d map requests already wait for the agent", maxMapRequests))
			return
		}
		writeJSON(w, buildMap(r.Context(), src, agg))
	})
	mux.HandleFunc("GET /api/flows", func(w http.ResponseWriter, r *http.Request) {
		q, err := parseQuery(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		rows, st := agg.Flows(q)
		writeJSON(w, FlowTable{Flows: rows, Stats: st})
	})
	return guard(mux)
}

// guard refuses requests whose Host is a name other than localhost, and sets headers that
// keep the page from being framed or from running anything but its own script. Without
// authentication, a name check is what stops another web site from reading the flows
// through a name it points at 127.0.0.1 (DNS rebinding); an address or localhost as Host
// is what a browser on this machine, a tunnel or a proxy to the address sends.
func guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hostAllowed(r.Host) {
			http.Error(w, "host "+strconv.Quote(r.Host)+" not allowed: use an address or localhost", http.StatusForbidden)
			return
		}
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

func hostAllowed(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return strings.EqualFold(host, "localhost")
}

func parseQuery(r *http.Request) (FlowQuery, error) {
	v := r.URL.Query()
	q := FlowQuery{Namespace: v.Get("namespace"), Pod: v.Get("pod"), Verdict: v.Get("verdict")}
	if p := v.Get("port"); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return q, fmt.Errorf("port %q: want a number from 1 to 65535", p)
		}
		q.Port = uint16(n)
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			return q, fmt.Errorf("limit %q: want a number from 0 (all)", l)
		}
		q.Limit = n
	}
	return q, nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// writeError answers with the API's error body.
func writeError(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.Error{Message: err.Error()})
}

// buildMap groups the endpoints, local and remote, and the edges' other peers by
// namespace.
func buildMap(ctx context.Context, src Source, agg *Aggregator) Map {
	edges, peers, st := agg.Edges()
	m := Map{Time: time.Now(), Edges: edges, Stats: st}
	nodes := map[string]Peer{}
	eps, err := src.ListEndpoints(ctx)
	if err != nil {
		m.Error = fmt.Sprintf("listing endpoints: %v", err)
	}
	for _, e := range eps {
		nodes[e.Key()] = Peer{ID: e.Key(), Namespace: e.Namespace, Name: e.Name, Kind: "endpoint", IP: e.IP}
	}
	remote, err := src.ListRemoteEndpoints(ctx)
	if err != nil && m.Error == "" {
		m.Error = fmt.Sprintf("listing remote endpoints: %v", err)
	}
	for _, e := range remote {
		id := e.Namespace + "/" + e.Name
		nodes[id] = Peer{ID: id, Namespace: e.Namespace, Name: e.Name, Kind: "remote-endpoint", IP: e.IP, Node: e.Node}
	}
	for _, p := range peers {
		if _, ok := nodes[p.ID]; !ok {
			// A peer that is not listed: not an endpoint, or one deleted since.
			nodes[p.ID] = p
		}
	}
	byNS := map[string][]Peer{}
	for _, p := range nodes {
		byNS[p.Namespace] = append(byNS[p.Namespace], p)
	}
	for ns, ps := range byNS {
		slices.SortFunc(ps, func(x, y Peer) int { return cmp.Compare(x.ID, y.ID) })
		m.Namespaces = append(m.Namespaces, Namespace{Name: ns, Nodes: ps})
	}
	slices.SortFunc(m.Namespaces, func(x, y Namespace) int {
		if (x.Name == "") != (y.Name == "") {
			return cmp.Compare(y.Name, x.Name) // the peers outside last
		}
		return cmp.Compare(x.Name, y.Name)
	})
	return m
}

// Follow adds every flow of src's history and then each new one to agg, until ctx ends or
// the agent closes its flow hub.
func Follow(ctx context.Context, src Source, agg *Aggregator) error {
	// Lost reaches the agent's flow hub only in its process (rampartd --ui-address); over
	// the API (rampart ui) flows a slow map misses are counted by the agent alone.
	err := src.Observe(ctx, api.ObserveRequest{SinceStart: true, Follow: true, Lost: agg.Lost}, func(f api.Flow) error {
		agg.Add(f)
		return nil
	})
	if err != nil {
		return fmt.Errorf("following flows: %w", err)
	}
	return nil
}

// Server serves the map over HTTP on one address.
type Server struct {
	l   net.Listener
	srv *http.Server
	src Source
	agg *Aggregator
	log *slog.Logger
}

// Listen takes addr (host:port; port 0 picks a free one) for the map of src.
func Listen(addr string, src Source, opts Options) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("service map: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	agg := NewAggregator(opts.MaxEdges, opts.MaxFlows)
	srv := &http.Server{
		Handler:           Handler(src, agg),
		ReadHeaderTimeout: 10 * time.Second,
		// Answers are whole JSON documents, never streams: a client that stops reading is
		// cut.
		WriteTimeout:   30 * time.Second,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return &Server{l: l, srv: srv, src: src, agg: agg, log: log}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.l.Addr() }

// Serve follows the agent's flows and serves the page until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		if err := Follow(ctx, s.src, s.agg); err != nil {
			s.log.Error("service map: flows no longer followed", "error", err)
		}
	}()
	go func() {
		<-ctx.Done()
		s.srv.Close()
	}()
	err := s.srv.Serve(s.l)
	cancel()
	<-followed
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serving the service map: %w", err)
}
