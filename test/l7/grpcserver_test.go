package l7

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rampartnet/rampart/internal/testenv"
)

// grpcServer is a real gRPC server (the standard health service: Check and List are unary,
// Watch streams) that records the full method name of every call it receives.
type grpcServer struct {
	srv *grpc.Server
	mu  sync.Mutex
	got []string
}

func serveGRPC(t testing.TB, nsPath string, port uint16) *grpcServer {
	t.Helper()
	var l net.Listener
	if err := testenv.InNetns(nsPath, func() error {
		var err error
		l, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatalf("listening on tcp/%d in %s: %v", port, nsPath, err)
	}
	g := &grpcServer{}
	g.srv = grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			g.record(info.FullMethod)
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			g.record(info.FullMethod)
			return h(srv, ss)
		}),
	)
	hs := health.NewServer()
	hs.SetServingStatus("deathstar", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g.srv, hs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.srv.Serve(l)
	}()
	t.Cleanup(func() {
		g.srv.Stop()
		<-done
	})
	return g
}

func (g *grpcServer) record(m string) {
	g.mu.Lock()
	g.got = append(g.got, m)
	g.mu.Unlock()
}

// all returns every call received so far.
func (g *grpcServer) all() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.got...)
}

func (g *grpcServer) calls(method string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, m := range g.got {
		if m == method {
			n++
		}
	}
	return n
}

// grpcClient connects (h2c, no TLS) from the namespace at nsPath to to.
func (e *env) grpcClient(t testing.TB, nsPath string, to netip.AddrPort) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+to.String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			timeout := 3 * time.Second
			if d, ok := ctx.Deadline(); ok {
				timeout = time.Until(d)
			}
			return e.dial(nsPath, to, timeout)
		}),
	)
	if err != nil {
		t.Fatalf("grpc client: %v", err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
