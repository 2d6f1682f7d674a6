package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/policy"
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
	AuditEndpoint(ctx context.Context, namespace, name string, mode AuditMode) (Endpoint, error)
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
	// CNIAdd, CNIDel, CNICheck and CNIGC serve the CNI plugin (cmd/rampart-cni). CNIDel
	// of an attachment the agent does not have succeeds.
	CNIAdd(ctx context.Context, req CNIAddRequest) (CNIResult, error)
	CNIDel(ctx context.Context, req CNIAttachment) error
	CNICheck(ctx context.Context, req CNICheckRequest) (CNIResult, error)
	CNIGC(ctx context.Context, req CNIGCRequest) (CNIGCResult, error)
	// PutNode declares or changes another node; DeleteNode removes it with its remote
	// endpoints. PutRemoteEndpoint declares or changes a pod on another node.
	ListNodes(ctx context.Context) ([]Node, error)
	PutNode(ctx context.Context, name string, spec NodeSpec) (Node, error)
	DeleteNode(ctx context.Context, name string) error
	ListRemoteEndpoints(ctx context.Context) ([]RemoteEndpoint, error)
	PutRemoteEndpoint(ctx context.Context, namespace, name string, spec RemoteEndpointSpec) (RemoteEndpoint, error)
	DeleteRemoteEndpoint(ctx context.Context, namespace, name string) error
	// PutService declares or changes a Service; DeleteService removes it.
	ListServices(ctx context.Context) ([]ServiceEntry, error)
	PutService(ctx context.Context, namespace, name string, spec ServiceSpec) (ServiceEntry, error)
	DeleteService(ctx context.Context, namespace, name string) error
	// ListTaps and GetTap show tap contracts with their state and counters; AddTaps
	// creates or replaces the contracts of TapContract and TrafficControl documents, all
	// or none; DeleteTap deletes one by name.
	ListTaps(ctx context.Context) ([]Tap, error)
	GetTap(ctx context.Context, name string) (Tap, error)
	AddTaps(ctx context.Context, req ApplyRequest) (ChangeResult, error)
	DeleteTap(ctx context.Context, name string) (ChangeResult, error)
	// ApplyTapPolicy makes a Datalog tap policy the agent's (one per agent), compiled
	// against the agent's facts, its contracts checked with the others: all or nothing.
	// GetTapPolicy shows it and its contracts; DeleteTapPolicy removes it and them.
	// CompileTapPolicy is a dry run against the current facts: nothing is applied.
	ApplyTapPolicy(ctx context.Context, req TapPolicyRequest) (ChangeResult, error)
	GetTapPolicy(ctx context.Context) (TapPolicy, error)
	DeleteTapPolicy(ctx context.Context) (ChangeResult, error)
	CompileTapPolicy(ctx context.Context, req TapPolicyRequest) (TapPolicy, error)
	// ReportMonitor keeps what `monitor run` read from monitor endpoint namespace/name's
	// EVE file, for the metrics, in place of its previous report. Endpoints that do not
	// exist or are not monitors are refused.
	ReportMonitor(ctx context.Context, namespace, name string, report MonitorReport) error
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

// Limits on requests, so that no request can crash the agent or make it allocate without
// bound (docs/policy-language.md, Limits). Manifests have their own limits on what they
// hold (package policy), checked by the agent.
const (
	// MaxHeaderBytes bounds the request line (the URL) and the headers.
	MaxHeaderBytes = 64 << 10
	// MaxBodyBytes bounds a JSON request body other than manifests (endpoints, labels,
	// trace, observe).
	MaxBodyBytes = 1 << 20
	// MaxManifestBodyBytes bounds the body of apply and delete: 8 MiB of manifests
	// (policy.MaxManifestBytes), which JSON may escape to six times their size at worst.
	MaxManifestBodyBytes = 64 << 20
	// MaxTapPolicyBodyBytes bounds a tap policy request: a 1 MiB policy
	// (tappolicy.MaxSourceBytes) escaped by JSON at worst.
	MaxTapPolicyBodyBytes = 8 << 20
	// MaxBodyDepth bounds the nesting of a JSON request body (the API's own types nest 3
	// levels).
	MaxBodyDepth = 16
	// maxBulk is how many large requests (manifests, prefix lists) are read and handled at
	// once; more wait, so that their memory does not add up without bound.
	maxBulk = 2
	// maxConns is how many connections are served at once (each CLI command takes one,
	// observe --follow one for as long as it follows).
	maxConns = 128
)

// bodyTimeout bounds the time to send a request body (10M prefixes take well under a second
// on the socket). A variable for tests.
var bodyTimeout = 2 * time.Minute

// tooLarge is the error for a body over its limit: status 413, naming the request, the
// limit and the size seen (seen < 0: more than the limit, the size not known).
func tooLarge(r *http.Request, seen, limit int64) *Error {
	size := fmt.Sprintf("size %d bytes", seen)
	if seen < 0 {
		size = fmt.Sprintf("size more than %d bytes", limit)
	}
	return Errorf(http.StatusRequestEntityTooLarge, "request body of %s %s: %s exceeds the limit of %d bytes", r.Method, r.URL.Path, size, limit)
}

// NewHandler serves svc over HTTP with JSON bodies.
func NewHandler(svc Service) http.Handler {
	rt := routes{mux: http.NewServeMux(), svc: svc, bulk: make(chan struct{}, maxBulk)}
	rt.cni()
	rt.endpoints()
	rt.cluster()
	rt.policies()
	rt.taps()
	rt.cidrSets()
	rt.flows()
	return rt.mux
}

// routes registers the API's handlers on mux, by domain.
type routes struct {
	mux *http.ServeMux
	svc Service
	// bulk bounds the large requests (applies, CIDR set loads) in progress at once.
	bulk chan struct{}
}

// withBulk runs fn once fewer than maxBulk large requests are in progress.
func (rt routes) withBulk(w http.ResponseWriter, r *http.Request, fn func()) {
	select {
	case rt.bulk <- struct{}{}:
	case <-r.Context().Done():
		writeError(w, Errorf(http.StatusServiceUnavailable, "request cancelled while waiting for other large requests"))
		return
	}
	defer func() { <-rt.bulk }()
	fn()
}

// cni serves the agent's status and the CNI plugin's calls.
func (rt routes) cni() {
	svc := rt.svc
	rt.mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.Status(r.Context()) })
	})
	rt.mux.HandleFunc("POST /v1/cni/add", func(w http.ResponseWriter, r *http.Request) {
		var req CNIAddRequest
		withBody(w, r, MaxBodyBytes, &req, func() (any, error) { return svc.CNIAdd(r.Context(), req) })
	})
	rt.mux.HandleFunc("POST /v1/cni/del", func(w http.ResponseWriter, r *http.Request) {
		var req CNIAttachment
		withBody(w, r, MaxBodyBytes, &req, func() (any, error) { return struct{}{}, svc.CNIDel(r.Context(), req) })
	})
	rt.mux.HandleFunc("POST /v1/cni/check", func(w http.ResponseWriter, r *http.Request) {
		var req CNICheckRequest
		withBody(w, r, MaxBodyBytes, &req, func() (any, error) { return svc.CNICheck(r.Context(), req) })
	})
	rt.mux.HandleFunc("POST /v1/cni/gc", func(w http.ResponseWriter, r *http.Request) {
		var req CNIGCRequest
		withBody(w, r, MaxBodyBytes, &req, func() (any, error) { return svc.CNIGC(r.Context(), req) })
	})
}

// endpoints serves endpoints on this node.
func (rt routes) endpoints() {
	svc := rt.svc
	rt.mux.HandleFunc("GET /v1/endpoints", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListEndpoints(r.Context()) })
	})
	rt.mux.HandleFunc("POST /v1/endpoints", func(w http.ResponseWriter, r *http.Request) {
		var spec EndpointSpec
		withBody(w, r, MaxBodyBytes, &spec, func() (any, error) { return svc.AddEndpoint(r.Context(), spec) })
	})
	rt.mux.HandleFunc("GET /v1/endpoints/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.GetEndpoint(r.Context(), r.PathValue("ns"), r.PathValue("name")) })
	})
	rt.mux.HandleFunc("DELETE /v1/endpoints/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) {
			return struct{}{}, svc.DeleteEndpoint(r.Context(), r.PathValue("ns"), r.PathValue("name"))
		})
	})
	rt.mux.HandleFunc("POST /v1/endpoints/{ns}/{name}/labels", func(w http.ResponseWriter, r *http.Request) {
		var c LabelChange
		withBody(w, r, MaxBodyBytes, &c, func() (any, error) {
			return svc.LabelEndpoint(r.Context(), r.PathValue("ns"), r.PathValue("name"), c)
		})
	})
	rt.mux.HandleFunc("PUT /v1/endpoints/{ns}/{name}/audit", func(w http.ResponseWriter, r *http.Request) {
		var m AuditMode
		withBody(w, r, MaxBodyBytes, &m, func() (any, error) {
			return svc.AuditEndpoint(r.Context(), r.PathValue("ns"), r.PathValue("name"), m)
		})
	})
	rt.mux.HandleFunc("PUT /v1/endpoints/{ns}/{name}/monitor-report", func(w http.ResponseWriter, r *http.Request) {
		var rep MonitorReport
		withBody(w, r, MaxBodyBytes, &rep, func() (any, error) {
			return struct{}{}, svc.ReportMonitor(r.Context(), r.PathValue("ns"), r.PathValue("name"), rep)
		})
	})
}

// cluster serves nodes, remote endpoints, Services, namespaces and identities.
func (rt routes) cluster() {
	svc := rt.svc
	rt.mux.HandleFunc("GET /v1/nodes", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListNodes(r.Context()) })
	})
	rt.mux.HandleFunc("PUT /v1/nodes/{name}", func(w http.ResponseWriter, r *http.Request) {
		var spec NodeSpec
		withBody(w, r, MaxBodyBytes, &spec, func() (any, error) { return svc.PutNode(r.Context(), r.PathValue("name"), spec) })
	})
	rt.mux.HandleFunc("DELETE /v1/nodes/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return struct{}{}, svc.DeleteNode(r.Context(), r.PathValue("name")) })
	})
	rt.mux.HandleFunc("GET /v1/remote-endpoints", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListRemoteEndpoints(r.Context()) })
	})
	rt.mux.HandleFunc("PUT /v1/remote-endpoints/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		var spec RemoteEndpointSpec
		withBody(w, r, MaxBodyBytes, &spec, func() (any, error) {
			return svc.PutRemoteEndpoint(r.Context(), r.PathValue("ns"), r.PathValue("name"), spec)
		})
	})
	rt.mux.HandleFunc("DELETE /v1/remote-endpoints/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) {
			return struct{}{}, svc.DeleteRemoteEndpoint(r.Context(), r.PathValue("ns"), r.PathValue("name"))
		})
	})
	rt.mux.HandleFunc("GET /v1/services", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListServices(r.Context()) })
	})
	rt.mux.HandleFunc("PUT /v1/services/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		var spec ServiceSpec
		withBody(w, r, MaxBodyBytes, &spec, func() (any, error) {
			return svc.PutService(r.Context(), r.PathValue("ns"), r.PathValue("name"), spec)
		})
	})
	rt.mux.HandleFunc("DELETE /v1/services/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) {
			return struct{}{}, svc.DeleteService(r.Context(), r.PathValue("ns"), r.PathValue("name"))
		})
	})
	rt.mux.HandleFunc("GET /v1/namespaces", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListNamespaces(r.Context()) })
	})
	rt.mux.HandleFunc("POST /v1/namespaces/{ns}/labels", func(w http.ResponseWriter, r *http.Request) {
		var c LabelChange
		withBody(w, r, MaxBodyBytes, &c, func() (any, error) { return svc.LabelNamespace(r.Context(), r.PathValue("ns"), c) })
	})
	rt.mux.HandleFunc("GET /v1/identities", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListIdentities(r.Context()) })
	})
}

// policies serves policies and their trace.
func (rt routes) policies() {
	svc := rt.svc
	rt.mux.HandleFunc("GET /v1/policies", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListPolicies(r.Context()) })
	})
	rt.mux.HandleFunc("POST /v1/policies/apply", func(w http.ResponseWriter, r *http.Request) {
		rt.withBulk(w, r, func() {
			var req ApplyRequest
			withBody(w, r, MaxManifestBodyBytes, &req, func() (any, error) { return svc.Apply(r.Context(), req) })
		})
	})
	rt.mux.HandleFunc("POST /v1/policies/delete", func(w http.ResponseWriter, r *http.Request) {
		rt.withBulk(w, r, func() {
			var req DeleteRequest
			withBody(w, r, MaxManifestBodyBytes, &req, func() (any, error) { return svc.Delete(r.Context(), req) })
		})
	})
	rt.mux.HandleFunc("POST /v1/trace", func(w http.ResponseWriter, r *http.Request) {
		var req TraceRequest
		withBody(w, r, MaxBodyBytes, &req, func() (any, error) { return svc.Trace(r.Context(), req) })
	})
}

// taps serves tap contracts and the tap policy.
func (rt routes) taps() {
	svc := rt.svc
	rt.mux.HandleFunc("GET /v1/taps", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListTaps(r.Context()) })
	})
	rt.mux.HandleFunc("GET /v1/taps/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.GetTap(r.Context(), r.PathValue("name")) })
	})
	rt.mux.HandleFunc("POST /v1/taps", func(w http.ResponseWriter, r *http.Request) {
		var req ApplyRequest
		withBody(w, r, MaxBodyBytes, &req, func() (any, error) { return svc.AddTaps(r.Context(), req) })
	})
	rt.mux.HandleFunc("DELETE /v1/taps/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.DeleteTap(r.Context(), r.PathValue("name")) })
	})
	rt.mux.HandleFunc("GET /v1/tappolicy", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.GetTapPolicy(r.Context()) })
	})
	rt.mux.HandleFunc("PUT /v1/tappolicy", func(w http.ResponseWriter, r *http.Request) {
		var req TapPolicyRequest
		withBody(w, r, MaxTapPolicyBodyBytes, &req, func() (any, error) { return svc.ApplyTapPolicy(r.Context(), req) })
	})
	rt.mux.HandleFunc("DELETE /v1/tappolicy", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.DeleteTapPolicy(r.Context()) })
	})
	rt.mux.HandleFunc("POST /v1/tappolicy/compile", func(w http.ResponseWriter, r *http.Request) {
		var req TapPolicyRequest
		withBody(w, r, MaxTapPolicyBodyBytes, &req, func() (any, error) { return svc.CompileTapPolicy(r.Context(), req) })
	})
}

// cidrSets serves CIDR sets.
func (rt routes) cidrSets() {
	svc := rt.svc
	rt.mux.HandleFunc("GET /v1/cidrsets", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.ListCIDRSets(r.Context()) })
	})
	rt.mux.HandleFunc("GET /v1/cidrsets/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) { return svc.GetCIDRSet(r.Context(), r.PathValue("name")) })
	})
	rt.mux.HandleFunc("PUT /v1/cidrsets/{name}", func(w http.ResponseWriter, r *http.Request) {
		rt.withBulk(w, r, func() { withPrefixes(w, r, svc.LoadCIDRSet) })
	})
	rt.mux.HandleFunc("POST /v1/cidrsets/{name}/add", func(w http.ResponseWriter, r *http.Request) {
		rt.withBulk(w, r, func() { withPrefixes(w, r, svc.AddCIDRs) })
	})
	rt.mux.HandleFunc("POST /v1/cidrsets/{name}/remove", func(w http.ResponseWriter, r *http.Request) {
		rt.withBulk(w, r, func() { withPrefixes(w, r, svc.RemoveCIDRs) })
	})
	rt.mux.HandleFunc("DELETE /v1/cidrsets/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, r, func() (any, error) {
			return svc.DeleteCIDRSet(r.Context(), r.PathValue("name"), r.URL.Query().Get("force") == "true")
		})
	})
}

// flows serves flows.
func (rt routes) flows() {
	svc := rt.svc
	rt.mux.HandleFunc("POST /v1/observe", func(w http.ResponseWriter, r *http.Request) {
		var req ObserveRequest
		if err := decode(w, r, MaxBodyBytes, &req); err != nil {
			writeError(w, err)
			return
		}
		observe(w, r, svc, req)
	})
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
// more than the whole load) and calls fn with it. The list is read as it arrives, within
// the size its header announces (MaxPrefixes IPv4 and MaxPrefixesV6 IPv6 at most), so a load of ten
// million prefixes streams in and a request that claims more than it sends costs only
// what it sent.
func withPrefixes(w http.ResponseWriter, r *http.Request, fn func(context.Context, CIDRSetRequest) (CIDRSetChange, error)) {
	if ct := r.Header.Get("Content-Type"); ct != PrefixContentType {
		writeError(w, BadRequest("content type %q: want %s", ct, PrefixContentType))
		return
	}
	if r.ContentLength > MaxPrefixBodyBytes {
		writeError(w, tooLarge(r, r.ContentLength, MaxPrefixBodyBytes))
		return
	}
	received := time.Now()
	release := bodyDeadline(w)
	br := bufio.NewReaderSize(r.Body, 1<<16)
	l, err := ReadPrefixList(br)
	if err == nil {
		// The list must end the body: anything after it is a malformed request.
		if _, perr := br.Peek(1); perr != io.EOF {
			err = fmt.Errorf("%w: data after the last prefix", ErrBadPrefixList)
		}
	}
	if err != nil {
		// The deadline stays: the server gives up on the rest of the body by then.
		writeError(w, BadRequest("request body of %s %s: decoding prefixes: %v", r.Method, r.URL.Path, err))
		return
	}
	release()
	req := CIDRSetRequest{Name: r.PathValue("name"), Source: r.URL.Query().Get("source"), Prefixes: l, Received: received}
	reply(w, r, func() (any, error) { return fn(r.Context(), req) })
}

// bodyDeadline bounds the time left to read the request body, and returns the function
// that lifts the bound once the body is read (observe streams for as long as it follows,
// so the server has no global read timeout). A body refused before its end keeps the
// bound: the server reads (and discards) up to 256 KiB of what is left before it answers,
// and a client that sends it slowly must not hold the answer back beyond it.
func bodyDeadline(w http.ResponseWriter) func() {
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(bodyTimeout)) != nil {
		return func() {}
	}
	return func() { rc.SetReadDeadline(time.Time{}) }
}

// decode reads a JSON body of at most limit bytes into v, checking its nesting before
// decoding it.
func decode(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if r.ContentLength > limit {
		return tooLarge(r, r.ContentLength, limit)
	}
	release := bodyDeadline(w)
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		// Room for a small body at once; a large one grows as it arrives, so a length
		// announced and not sent costs nothing.
		buf.Grow(int(min(r.ContentLength, 64<<10)) + 1)
	}
	_, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1))
	b := buf.Bytes()
	if err != nil {
		return BadRequest("request body of %s %s: reading: %v", r.Method, r.URL.Path, err)
	}
	if int64(len(b)) > limit {
		return tooLarge(r, -1, limit)
	}
	release()
	if depth, off := policy.JSONDepth(b, MaxBodyDepth); depth > MaxBodyDepth {
		return BadRequest("request body of %s %s: nesting depth %d (at byte %d) exceeds the limit of %d", r.Method, r.URL.Path, depth, off, MaxBodyDepth)
	}
	if req, ok := v.(*ApplyRequest); ok && decodeDocumentsFast(b, req) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return BadRequest("decoding request: %v", err)
	}
	return nil
}

func withBody(w http.ResponseWriter, r *http.Request, limit int64, v any, fn func() (any, error)) {
	if err := decode(w, r, limit, v); err != nil {
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
// At most maxConns connections are served at once.
func Serve(ctx context.Context, l net.Listener, h http.Handler) error {
	l = &limitListener{Listener: l, slots: make(chan struct{}, maxConns), done: make(chan struct{})}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    MaxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
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

// limitListener accepts a connection only while fewer than cap(slots) are open: each may
// hold a request body in memory, so their number is bounded too. Further connections wait
// in the socket's backlog until one closes.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: sync.OnceFunc(func() { <-l.slots })}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
