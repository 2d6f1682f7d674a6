package hubble

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/hubble/flowpb"
	"github.com/rampartnet/rampart/internal/hubble/observerpb"
	"github.com/rampartnet/rampart/internal/hubble/relaypb"
	"github.com/rampartnet/rampart/internal/version"
)

// Source is what the server reads from the agent.
type Source interface {
	Status(ctx context.Context) (api.Status, error)
	ListNamespaces(ctx context.Context) ([]api.Namespace, error)
	// Observe sends the requested history, then with Follow new flows (api.Service's).
	Observe(ctx context.Context, req api.ObserveRequest, send func(api.Flow) error) error
}

// Server is Hubble's observer service over a Source.
type Server struct {
	observerpb.UnimplementedObserverServer
	src  Source
	node string
}

// NewServer returns the observer service of the agent src, which runs on node.
func NewServer(src Source, node string) *Server {
	return &Server{src: src, node: node}
}

// errStop ends an Observe early once a request has what it asked for.
var errStop = errors.New("enough flows")

// GetFlows streams flows: the history the request selects (the last or first Number, or
// everything since Since), then with Follow new flows, each passing the request's
// filters.
func (s *Server) GetFlows(req *observerpb.GetFlowsRequest, stream grpc.ServerStreamingServer[observerpb.GetFlowsResponse]) error {
	filters, err := CompileFilters(req.GetWhitelist(), req.GetBlacklist())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if req.GetFieldMask() != nil && len(req.GetFieldMask().GetPaths()) > 0 {
		return status.Error(codes.InvalidArgument, "field_mask is not supported by Rampart's Hubble server")
	}
	if req.GetFirst() && req.GetFollow() {
		return status.Error(codes.InvalidArgument, "first and follow cannot go together")
	}
	ctx := stream.Context()
	or := api.ObserveRequest{Follow: req.GetFollow()}
	if req.GetSince() != nil {
		or.Filter.Since = req.GetSince().AsTime()
	}
	if req.GetUntil() != nil {
		or.Filter.Until = req.GetUntil().AsTime()
		if req.GetFollow() {
			// Following until a time ends at that time.
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, or.Filter.Until)
			defer cancel()
		}
	}
	n := req.GetNumber()
	switch {
	case req.GetFirst(), n == 0 && req.GetSince() != nil, n > math.MaxInt32:
		// Every buffered flow (the first n are kept below); "all" is number 2^64-1.
		or.SinceStart = true
	default:
		or.Last = int(n)
	}
	// The flow passed to Match is mapped once more to be sent: mapping is cheap next to
	// keeping every mapped flow of the history.
	or.Match = func(f api.Flow) bool { return filters.Match(Flow(f, s.node)) }
	or.Lost = func(lost uint64) {
		// Best effort: the client learns of the gap with the next flow it gets.
		stream.Send(&observerpb.GetFlowsResponse{
			ResponseTypes: &observerpb.GetFlowsResponse_LostEvents{LostEvents: &flowpb.LostEvent{
				Source:        flowpb.LostEventSource_OBSERVER_EVENTS_QUEUE,
				NumEventsLost: lost,
			}},
			NodeName: s.node,
			Time:     timestamppb.Now(),
		})
	}
	var sent uint64
	err = s.src.Observe(ctx, or, func(f api.Flow) error {
		if req.GetFirst() && sent >= n {
			return errStop
		}
		fl := Flow(f, s.node)
		if err := stream.Send(&observerpb.GetFlowsResponse{
			ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: fl},
			NodeName:      s.node,
			Time:          fl.GetTime(),
		}); err != nil {
			return err
		}
		sent++
		return nil
	})
	switch {
	case errors.Is(err, errStop), err == nil:
		return nil
	case ctx.Err() != nil:
		return nil // the client went, or the until time came
	}
	return status.Error(codes.Unavailable, fmt.Sprintf("observing flows: %v", err))
}

// ServerStatus reports the flow history's fill and counts.
func (s *Server) ServerStatus(ctx context.Context, _ *observerpb.ServerStatusRequest) (*observerpb.ServerStatusResponse, error) {
	st, err := s.src.Status(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, fmt.Sprintf("reading the agent's status: %v", err))
	}
	up := time.Since(st.StartedAt)
	rate := 0.0
	if up > 0 {
		rate = float64(st.FlowsSeen) / up.Seconds()
	}
	return &observerpb.ServerStatusResponse{
		NumFlows:  uint64(st.FlowsBuffered),
		MaxFlows:  uint64(st.FlowHistory),
		SeenFlows: st.FlowsSeen,
		UptimeNs:  uint64(up.Nanoseconds()),
		Version:   versionString(),
		FlowsRate: rate,
	}, nil
}

// GetNodes lists this node, the one this server knows.
func (s *Server) GetNodes(ctx context.Context, _ *observerpb.GetNodesRequest) (*observerpb.GetNodesResponse, error) {
	st, err := s.src.Status(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, fmt.Sprintf("reading the agent's status: %v", err))
	}
	return &observerpb.GetNodesResponse{Nodes: []*observerpb.Node{{
		Name:      s.node,
		Version:   versionString(),
		State:     relaypb.NodeState_NODE_CONNECTED,
		UptimeNs:  uint64(time.Since(st.StartedAt).Nanoseconds()),
		NumFlows:  uint64(st.FlowsBuffered),
		MaxFlows:  uint64(st.FlowHistory),
		SeenFlows: st.FlowsSeen,
	}}}, nil
}

// GetNamespaces lists the agent's namespaces.
func (s *Server) GetNamespaces(ctx context.Context, _ *observerpb.GetNamespacesRequest) (*observerpb.GetNamespacesResponse, error) {
	nss, err := s.src.ListNamespaces(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, fmt.Sprintf("listing namespaces: %v", err))
	}
	out := &observerpb.GetNamespacesResponse{}
	for _, ns := range nss {
		out.Namespaces = append(out.Namespaces, &observerpb.Namespace{Namespace: ns.Name})
	}
	return out, nil
}

// versionString is what hubble status shows: the emitter and its version.
func versionString() string { return EmitterName + " " + version.Get().Version }

// Listen opens addr: unix:///PATH (a socket only root can use, as the agent's API
// socket; a stale one is replaced, a live one refused) or HOST:PORT (TCP, plain text:
// for a loopback or otherwise private address).
func Listen(addr string) (net.Listener, error) {
	if p, ok := strings.CutPrefix(addr, "unix://"); ok {
		if p == "" {
			return nil, fmt.Errorf("hubble address %q: no socket path", addr)
		}
		return api.Listen(p)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("hubble address %q: want unix:///PATH or HOST:PORT: %w", addr, err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return l, nil
}

// Serve serves the observer service on l until ctx ends, then lets the streams end
// (at most a second: followers never end by themselves).
func Serve(ctx context.Context, l net.Listener, srv *Server) error {
	g := grpc.NewServer(
		// Bounds per client: a few concurrent streams each, small messages in.
		grpc.MaxConcurrentStreams(64),
		grpc.MaxRecvMsgSize(1<<20),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
	)
	observerpb.RegisterObserverServer(g, srv)
	// hubble status asks the standard health service about the observer first, by the
	// name Hubble gives it (cilium's pkg/hubble/api/v1 ObserverServiceName).
	hs := health.NewServer()
	hs.SetServingStatus("hubble.server.Observer", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		stopped := make(chan struct{})
		go func() { g.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(time.Second):
			g.Stop()
		}
	}()
	err := g.Serve(l)
	if ctx.Err() != nil {
		<-done // stopped by ctx: wait until the streams ended
	}
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving the hubble API: %w", err)
	}
	return nil
}
