package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"

	accesslogdata "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
)

// controlPlane is the agent's gRPC server on a Unix socket: ADS (listeners and routes from
// a snapshot cache) and the access log service. It tracks what Envoy acknowledged so that
// Update can wait until Envoy has the rules before the dataplane steers traffic to it.
type controlPlane struct {
	log    *slog.Logger
	nodeID string
	cache  cachev3.SnapshotCache
	gs     *grpc.Server
	lis    net.Listener
	onLog  func(*accesslogdata.HTTPAccessLogEntry)
	served chan struct{}

	mu      sync.Mutex
	changed chan struct{} // closed and replaced whenever stream or ack state changes
	streams map[int64]*streamState
	nonces  map[string]string // response nonce -> version, to attribute NACKs
}

type streamState struct {
	acked  map[string]string // type URL -> version Envoy applied
	nacked map[string]nack   // type URL -> last rejection
}

type nack struct {
	version string
	err     string
}

func newControlPlane(sockPath, nodeID string, log *slog.Logger, onLog func(*accesslogdata.HTTPAccessLogEntry)) (*controlPlane, error) {
	if err := os.Remove(sockPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale control socket: %w", err)
	}
	lis, err := net.Listen("unix", sockPath)
	if err != nil {
		return nil, fmt.Errorf("listening on control socket %s: %w", sockPath, err)
	}
	// Only root (the agent and Envoy) may talk to it: it hands out the proxy's rules.
	if err := os.Chmod(sockPath, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("restricting control socket: %w", err)
	}
	cp := &controlPlane{
		log:     log,
		nodeID:  nodeID,
		cache:   cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil),
		lis:     lis,
		onLog:   onLog,
		served:  make(chan struct{}),
		changed: make(chan struct{}),
		streams: map[int64]*streamState{},
		nonces:  map[string]string{},
	}
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, id int64, typ string) error {
			cp.mu.Lock()
			cp.streams[id] = &streamState{acked: map[string]string{}, nacked: map[string]nack{}}
			cp.notifyLocked()
			cp.mu.Unlock()
			return nil
		},
		StreamClosedFunc: func(id int64, _ *core.Node) {
			cp.mu.Lock()
			delete(cp.streams, id)
			cp.notifyLocked()
			cp.mu.Unlock()
		},
		StreamRequestFunc:  cp.onRequest,
		StreamResponseFunc: cp.onResponse,
	}
	srv := serverv3.NewServer(context.Background(), cp.cache, cb)
	cp.gs = grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(cp.gs, srv)
	alsv3.RegisterAccessLogServiceServer(cp.gs, &alsServer{cp: cp})
	go func() {
		defer close(cp.served)
		if err := cp.gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			log.Error("proxy control plane stopped", "error", err)
		}
	}()
	return cp, nil
}

func (cp *controlPlane) notifyLocked() {
	close(cp.changed)
	cp.changed = make(chan struct{})
}

func (cp *controlPlane) onResponse(_ context.Context, _ int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.nonces[resp.GetNonce()] = resp.GetVersionInfo()
	if len(cp.nonces) > 1024 {
		// Nonces are only needed until Envoy answers; drop old ones wholesale.
		cp.nonces = map[string]string{resp.GetNonce(): resp.GetVersionInfo()}
	}
}

func (cp *controlPlane) onRequest(id int64, req *discovery.DiscoveryRequest) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	s, ok := cp.streams[id]
	if !ok {
		return nil
	}
	typ := req.GetTypeUrl()
	if d := req.GetErrorDetail(); d != nil {
		v := cp.nonces[req.GetResponseNonce()]
		s.nacked[typ] = nack{version: v, err: d.GetMessage()}
		cp.log.Error("proxy rejected its configuration", "type", typ, "version", v, "error", d.GetMessage())
	} else if req.GetResponseNonce() != "" {
		s.acked[typ] = req.GetVersionInfo()
	}
	cp.notifyLocked()
	return nil
}

// set publishes a new snapshot.
func (cp *controlPlane) set(version uint64, res Resources) error {
	var ls, rs []types.Resource
	for _, l := range res.Listeners {
		ls = append(ls, l)
	}
	for _, r := range res.Routes {
		rs = append(rs, r)
	}
	snap, err := cachev3.NewSnapshot(strconv.FormatUint(version, 10), map[resourcev3.Type][]types.Resource{
		resourcev3.ListenerType: ls,
		resourcev3.RouteType:    rs,
	})
	if err != nil {
		return fmt.Errorf("building proxy snapshot: %w", err)
	}
	if err := snap.Consistent(); err != nil {
		return fmt.Errorf("proxy snapshot inconsistent: %w", err)
	}
	if err := cp.cache.SetSnapshot(context.Background(), cp.nodeID, snap); err != nil {
		return fmt.Errorf("publishing proxy snapshot: %w", err)
	}
	return nil
}

// errNoProxy: no Envoy is connected, so there is nothing to wait for.
var errNoProxy = errors.New("no proxy connected")

// waitAck waits until every connected Envoy applied version for the listener type (and
// the route type when routes is set), or rejected it. With no Envoy connected it returns
// errNoProxy at once: a proxy that connects later gets the latest snapshot first.
func (cp *controlPlane) waitAck(ctx context.Context, version uint64, routes bool) error {
	v := strconv.FormatUint(version, 10)
	typesToWait := []string{resourcev3.ListenerType}
	if routes {
		typesToWait = append(typesToWait, resourcev3.RouteType)
	}
	for {
		cp.mu.Lock()
		ch := cp.changed
		done, connected := true, false
		var rejected error
		for _, s := range cp.streams {
			connected = true
			for _, t := range typesToWait {
				if n, ok := s.nacked[t]; ok && n.version == v {
					rejected = fmt.Errorf("proxy rejected configuration version %s: %s", v, n.err)
				}
				if got, _ := strconv.ParseUint(s.acked[t], 10, 64); got < version {
					done = false
				}
			}
		}
		cp.mu.Unlock()
		switch {
		case rejected != nil:
			return rejected
		case !connected:
			return errNoProxy
		case done:
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the proxy to apply configuration version %s: %w", v, ctx.Err())
		}
	}
}

// acked returns the lowest listener version the connected proxies applied (0: none).
func (cp *controlPlane) acked() (uint64, bool) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var low uint64
	connected := false
	for _, s := range cp.streams {
		v, _ := strconv.ParseUint(s.acked[resourcev3.ListenerType], 10, 64)
		if !connected || v < low {
			low = v
		}
		connected = true
	}
	return low, connected
}

func (cp *controlPlane) close() {
	// Stop rather than GracefulStop: Envoy's streams never end on their own.
	cp.gs.Stop()
	<-cp.served
	os.Remove(cp.lis.Addr().String())
}

// alsServer receives Envoy's HTTP access logs.
type alsServer struct {
	alsv3.UnimplementedAccessLogServiceServer
	cp *controlPlane
}

func (s *alsServer) StreamAccessLogs(stream alsv3.AccessLogService_StreamAccessLogsServer) error {
	for {
		msg, err := stream.Recv()
		if err != nil {
			return nil // Envoy went away or the server stops
		}
		if s.cp.onLog == nil {
			continue
		}
		for _, e := range msg.GetHttpLogs().GetLogEntry() {
			s.cp.onLog(e)
		}
	}
}
