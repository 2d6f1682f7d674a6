package api

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestFilterMatch(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f := Flow{
		Time:     at,
		Type:     "drop",
		Verdict:  "DROPPED",
		Protocol: "TCP",
		Source:   FlowPeer{Namespace: "x", Name: "a", Port: 40000, Labels: []string{"pod=a"}},
		Dest:     FlowPeer{Namespace: "y", Name: "b", Port: 80, Labels: []string{"pod=b", "tier=web"}},
	}
	cases := []struct {
		f    FlowFilter
		want bool
	}{
		{FlowFilter{}, true},
		{FlowFilter{Endpoint: "x/a"}, true},
		{FlowFilter{Endpoint: "y/b"}, true},
		{FlowFilter{Endpoint: "x/b"}, false},
		{FlowFilter{Namespace: "y"}, true},
		{FlowFilter{Namespace: "z"}, false},
		{FlowFilter{Labels: map[string]string{"pod": "b", "tier": "web"}}, true},
		{FlowFilter{Labels: map[string]string{"pod": "a", "tier": "web"}}, false}, // one side must have all
		{FlowFilter{Verdict: "dropped"}, true},
		{FlowFilter{Verdict: "forwarded"}, false},
		{FlowFilter{Port: 80}, true},
		{FlowFilter{Port: 40000}, true},
		{FlowFilter{Port: 81}, false},
		{FlowFilter{Protocol: "tcp"}, true},
		{FlowFilter{Protocol: "udp"}, false},
		{FlowFilter{Namespace: "x", Port: 80, Protocol: "tcp", Verdict: "dropped"}, true},
		{FlowFilter{Type: "l3l4"}, true},
		{FlowFilter{Type: "l7"}, false},
		{FlowFilter{Type: "drop"}, true},
		{FlowFilter{Type: "new"}, false},
		// hubble's --from-pod and --to-pod: one side, NS/PREFIX, NS/ or PREFIX.
		{FlowFilter{From: "x/a"}, true},
		{FlowFilter{From: "x/"}, true},
		{FlowFilter{From: "a"}, false}, // namespace default
		{FlowFilter{From: "x/"}, true},
		{FlowFilter{From: "y/b"}, false},
		{FlowFilter{To: "y/b"}, true},
		{FlowFilter{To: "b"}, false},
		{FlowFilter{To: "x/a"}, false},
		{FlowFilter{From: "x/a", To: "y/"}, true},
		{FlowFilter{Since: at}, true},
		{FlowFilter{Since: at.Add(time.Second)}, false},
		{FlowFilter{Until: at}, true},
		{FlowFilter{Until: at.Add(-time.Second)}, false},
	}
	for _, c := range cases {
		if got := c.f.Match(f); got != c.want {
			t.Errorf("%+v: got %v, want %v", c.f, got, c.want)
		}
	}
	f.Type = FlowTypeL7
	for typ, want := range map[string]bool{"": true, "l7": true, "L7": true, "l3l4": false} {
		if got := (FlowFilter{Type: typ}).Match(f); got != want {
			t.Errorf("l7 flow, type filter %q: got %v, want %v", typ, got, want)
		}
	}
}

// fakeService answers a few calls; the rest are not needed here.
type fakeService struct {
	Service
	flows []Flow
}

func (fakeService) Status(context.Context) (Status, error) { return Status{Instance: "fake"}, nil }

func (fakeService) GetEndpoint(_ context.Context, ns, name string) (Endpoint, error) {
	if ns == "x" && name == "a" {
		return Endpoint{Namespace: ns, Name: name, IP: "198.18.0.2"}, nil
	}
	return Endpoint{}, NotFound("endpoint %s/%s not found", ns, name)
}

func (fakeService) Apply(_ context.Context, req ApplyRequest) (ChangeResult, error) {
	return ChangeResult{}, BadRequest("%s: document 1: spec.x: unknown field", req.Documents[0].Source)
}

func (s fakeService) Observe(ctx context.Context, req ObserveRequest, send func(Flow) error) error {
	for _, f := range s.flows {
		if req.Filter.Match(f) {
			if err := send(f); err != nil {
				return err
			}
		}
	}
	if req.Follow {
		<-ctx.Done()
	}
	return nil
}

func serveFake(t *testing.T, svc Service) (*Client, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "rp-api-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "s.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, NewHandler(svc)) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	c := NewClient(path)
	t.Cleanup(c.Close)
	return c, path
}

func TestClientServerRoundTrip(t *testing.T) {
	svc := fakeService{flows: []Flow{{Verdict: "FORWARDED", Protocol: "TCP"}, {Verdict: "DROPPED", Protocol: "UDP"}}}
	c, path := serveFake(t, svc)
	ctx := context.Background()
	st, err := c.Status(ctx)
	if err != nil || st.Instance != "fake" {
		t.Fatalf("status: %+v %v", st, err)
	}
	ep, err := c.GetEndpoint(ctx, "x", "a")
	if err != nil || ep.IP != "198.18.0.2" {
		t.Fatalf("get: %+v %v", ep, err)
	}
	_, err = c.GetEndpoint(ctx, "x", "zz")
	if !IsNotFound(err) || err.Error() != "endpoint x/zz not found" {
		t.Fatalf("get missing: %v", err)
	}
	_, err = c.Apply(ctx, ApplyRequest{Documents: []Document{{Source: "p.yaml"}}})
	var ae *Error
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Message != "p.yaml: document 1: spec.x: unknown field" {
		t.Fatalf("apply error: %#v", err)
	}
	var got []Flow
	err = c.Observe(ctx, ObserveRequest{Filter: FlowFilter{Verdict: "dropped"}}, func(f Flow) error {
		got = append(got, f)
		return nil
	})
	if err != nil || len(got) != 1 || got[0].Protocol != "UDP" {
		t.Fatalf("observe: %+v %v", got, err)
	}
	// Following ends when the client's context does.
	fctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	got = nil
	if err := c.Observe(fctx, ObserveRequest{Follow: true}, func(f Flow) error { got = append(got, f); return nil }); err != nil && fctx.Err() == nil {
		t.Fatalf("observe follow: %v", err)
	}
	if len(got) != 2 {
		t.Fatalf("observe follow got %d flows", len(got))
	}

	// The socket is private, and a second listener is refused while this one answers.
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	if _, err := Listen(path); !errors.Is(err, ErrAgentRunning) {
		t.Fatalf("second Listen: %v", err)
	}
}

func TestListenRemovesStaleSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "rp-api-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "s.sock")
	// A socket file nobody listens on (left by a killed agent).
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatal("stale socket not left behind by the setup")
	}
	l2, err := Listen(path)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	l2.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("Close left the socket file")
	}
	if _, err := NewClient(path).Status(context.Background()); err == nil {
		t.Fatal("client reached a closed agent")
	}
}
