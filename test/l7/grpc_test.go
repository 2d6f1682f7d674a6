package l7

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// A gRPC method allow-list over h2c, with a real gRPC client and server: the allowed
// method works, other methods of the same service are refused by the proxy with
// PERMISSION_DENIED (Envoy's 403 for a gRPC request) and never reach the server, and the
// connection goes on serving.
func testGRPC(t *testing.T, e *env) {
	e.sub(t)
	e.policy(t, l7Rule{role: "client", port: grpcPort, http: []map[string]any{
		httpRule("method", "POST", "path", `/grpc\.health\.v1\.Health/Check`),
	}})
	const (
		check = "/grpc.health.v1.Health/Check"
		list  = "/grpc.health.v1.Health/List"
		watch = "/grpc.health.v1.Health/Watch"
	)
	cc := e.grpcClient(t, e.clientNS, e.grpcAddr)
	hc := healthpb.NewHealthClient(cc)
	ctx := func() context.Context {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return c
	}
	resp, err := hc.Check(ctx(), &healthpb.HealthCheckRequest{Service: "deathstar"})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check: %v %v, want SERVING", resp, err)
	}
	denied := func(what string, err error) {
		t.Helper()
		st, _ := status.FromError(err)
		if st.Code() != codes.PermissionDenied || st.Message() != "RBAC: access denied" {
			t.Errorf("%s: %v, want PERMISSION_DENIED (RBAC: access denied)", what, err)
		}
	}
	_, err = hc.List(ctx(), &healthpb.HealthListRequest{})
	denied("List", err)
	stream, err := hc.Watch(ctx(), &healthpb.HealthCheckRequest{Service: "deathstar"})
	if err == nil {
		_, err = stream.Recv()
	}
	denied("Watch", err)
	// Methods the server does not have would get UNIMPLEMENTED from it; the proxy refuses
	// them first. The path expression is anchored and its dots are escaped.
	for _, m := range []string{check + "X", check + "/x", "/grpc.health.v1.Health/check", "/grpcXhealth.v1.Health/Check", "/x" + check} {
		var out healthpb.HealthCheckResponse
		denied(m, cc.Invoke(ctx(), m, &healthpb.HealthCheckRequest{}, &out))
	}
	// The same connection still serves the allowed method.
	if resp, err := hc.Check(ctx(), &healthpb.HealthCheckRequest{Service: "deathstar"}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check after the refusals: %v %v", resp, err)
	}
	if n := e.grpc.calls(check); n != 2 {
		t.Errorf("the server got %d Check calls, want 2", n)
	}
	if e.grpc.calls(list) != 0 || e.grpc.calls(watch) != 0 || len(e.grpc.all()) != 2 {
		t.Errorf("the server got refused calls: %v", e.grpc.all())
	}
	// The other client has no rule for the port: no connection at all.
	oc := healthpb.NewHealthClient(e.grpcClient(t, e.otherNS, e.grpcAddr))
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := oc.Check(short, &healthpb.HealthCheckRequest{Service: "deathstar"}); status.Code(err) != codes.DeadlineExceeded && status.Code(err) != codes.Unavailable {
		t.Errorf("Check from the other client: %v, want no connection", err)
	}
	if n := e.grpc.calls(check); n != 2 {
		t.Errorf("the server got %d Check calls, want 2", n)
	}
}
