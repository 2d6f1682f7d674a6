package hubble

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/hubble/flowpb"
	"github.com/rampartnet/rampart/internal/hubble/observerpb"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// Three flows as the agent decorates them: an allowed connection, a policy drop and an
// L7 request.
var flows = []api.Flow{{
	Time: t0, Type: "new", Verdict: "FORWARDED", Direction: "ingress", Protocol: "TCP",
	Source:   api.FlowPeer{IP: "198.18.0.5", Port: 40000, Identity: 260, Namespace: "x", Name: "client-1", Labels: []string{"app=client"}},
	Dest:     api.FlowPeer{IP: "198.18.0.7", Port: 80, Identity: 261, Namespace: "y", Name: "web", Labels: []string{"app=web"}},
	Endpoint: "y/web",
	Rule:     &api.RuleRef{ID: 3, Policy: "NetworkPolicy/y/allow-client", Rule: "ingress[0]"},
}, {
	Time: t0.Add(time.Second), Type: "drop", Verdict: "DROPPED", Reason: "policy-default-deny", Direction: "ingress", Protocol: "UDP",
	Source:   api.FlowPeer{IP: "198.18.0.5", Port: 40001, Identity: 260, Namespace: "x", Name: "client-1", Labels: []string{"app=client"}},
	Dest:     api.FlowPeer{IP: "198.18.0.7", Port: 53, Identity: 261, Namespace: "y", Name: "web", Labels: []string{"app=web"}},
	Endpoint: "y/web",
}, {
	Time: t0.Add(2 * time.Second), Type: "l7", Verdict: "DROPPED", Reason: "l7-denied", Direction: "ingress", Protocol: "TCP",
	Source: api.FlowPeer{IP: "198.18.0.5", Port: 40002, Identity: 260, Namespace: "x", Name: "client-1", Labels: []string{"app=client"}},
	Dest:   api.FlowPeer{IP: "198.18.0.7", Port: 80, Identity: 261, Namespace: "y", Name: "web", Labels: []string{"app=web"}},
	L7:     &api.L7Flow{Protocol: "HTTP/1.1", Method: "PUT", Path: "/v1/x", Host: "web", Status: 403, LatencyMs: 0.5},
	Rule:   &api.RuleRef{ID: 4, Policy: "CiliumNetworkPolicy/y/l7"},
}}

func TestFlowMapping(t *testing.T) {
	f := Flow(flows[0], "node-1")
	want := `{"time":"2026-05-01T12:00:00Z","verdict":"FORWARDED","IP":{"source":"198.18.0.5","destination":"198.18.0.7","ipVersion":"IPv4"},` +
		`"l4":{"TCP":{"source_port":40000,"destination_port":80}},` +
		`"source":{"identity":260,"namespace":"x","labels":["app=client"],"pod_name":"client-1"},` +
		`"destination":{"identity":261,"namespace":"y","labels":["app=web"],"pod_name":"web"},` +
		`"Type":"L3_L4","node_name":"node-1","event_type":{"type":5},"traffic_direction":"INGRESS","is_reply":false,` +
		`"ingress_allowed_by":[{"name":"allow-client","namespace":"y","kind":"NetworkPolicy"}]}`
	f.Emitter = nil // the build's version
	if got := compactJSON(t, f); got != compactJSON(t, mustFlow(t, want)) {
		t.Errorf("allowed flow:\n got %s\nwant %s", got, want)
	}

	d := Flow(flows[1], "node-1")
	if d.GetVerdict() != flowpb.Verdict_DROPPED || d.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENIED ||
		d.GetEventType().GetType() != MessageTypeDrop || d.GetEventType().GetSubType() != int32(flowpb.DropReason_POLICY_DENIED) ||
		d.GetL4().GetUDP().GetDestinationPort() != 53 || d.GetIsReply() != nil || d.GetSummary() != "" {
		t.Errorf("drop: %v", d)
	}
	l := Flow(flows[2], "node-1")
	h := l.GetL7().GetHttp()
	if l.GetType() != flowpb.FlowType_L7 || l.GetEventType().GetType() != MessageTypeAccessLog || h.GetMethod() != "PUT" ||
		h.GetUrl() != "http://web/v1/x" || h.GetCode() != 403 || l.GetL7().GetLatencyNs() != 500000 ||
		l.GetSummary() != "reason=l7-denied" || l.GetDropReasonDesc() != flowpb.DropReason_DROP_REASON_UNKNOWN ||
		len(l.GetIngressDeniedBy()) != 1 || l.GetIngressDeniedBy()[0].GetName() != "l7" {
		t.Errorf("l7: %v", l)
	}
}

func mustFlow(t *testing.T, s string) *flowpb.Flow {
	var f flowpb.Flow
	if err := protojson.Unmarshal([]byte(s), &f); err != nil {
		t.Fatal(err)
	}
	return &f
}

func compactJSON(t *testing.T, f *flowpb.Flow) string {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFilters(t *testing.T) {
	cases := []struct {
		name         string
		white, black []*flowpb.FlowFilter
		want         []int // indexes of flows that pass
	}{
		{"none", nil, nil, []int{0, 1, 2}},
		{"verdict", []*flowpb.FlowFilter{{Verdict: []flowpb.Verdict{flowpb.Verdict_DROPPED}}}, nil, []int{1, 2}},
		{"blacklist", nil, []*flowpb.FlowFilter{{Verdict: []flowpb.Verdict{flowpb.Verdict_DROPPED}}}, []int{0}},
		{"to-pod", []*flowpb.FlowFilter{{DestinationPod: []string{"y/we"}}}, nil, []int{0, 1, 2}},
		{"from-pod default namespace", []*flowpb.FlowFilter{{SourcePod: []string{"client"}}}, nil, nil},
		{"namespace either side", []*flowpb.FlowFilter{{SourcePod: []string{"x/"}}, {DestinationPod: []string{"x/"}}}, nil, []int{0, 1, 2}},
		{"label", []*flowpb.FlowFilter{{SourceLabel: []string{"k8s:app=client"}, DestinationLabel: []string{"app in (web, db)"}}}, nil, []int{0, 1, 2}},
		{"label miss", []*flowpb.FlowFilter{{SourceLabel: []string{"app=web"}}}, nil, nil},
		{"port", []*flowpb.FlowFilter{{DestinationPort: []string{"53"}}}, nil, []int{1}},
		{"protocol", []*flowpb.FlowFilter{{Protocol: []string{"http"}}}, nil, []int{2}},
		{"type", []*flowpb.FlowFilter{{EventType: []*flowpb.EventTypeFilter{{Type: MessageTypeDrop}}}}, nil, []int{1}},
		{"drop reason", []*flowpb.FlowFilter{{DropReasonDesc: []flowpb.DropReason{flowpb.DropReason_POLICY_DENIED}}}, nil, []int{1}},
		{"ip prefix", []*flowpb.FlowFilter{{SourceIp: []string{"198.18.0.0/24"}, DestinationIp: []string{"198.18.0.7"}}}, nil, []int{0, 1, 2}},
		{"http status", []*flowpb.FlowFilter{{HttpStatusCode: []string{"4+"}}}, nil, []int{2}},
		{"reply", []*flowpb.FlowFilter{{Reply: []bool{false}}}, nil, []int{0, 2}},
		{"identity", []*flowpb.FlowFilter{{DestinationIdentity: []uint32{261}, TrafficDirection: []flowpb.TrafficDirection{flowpb.TrafficDirection_INGRESS}}}, nil, []int{0, 1, 2}},
		{"node", []*flowpb.FlowFilter{{NodeName: []string{"cluster/node-*"}}}, nil, []int{0, 1, 2}},
	}
	for _, c := range cases {
		fs, err := CompileFilters(c.white, c.black)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var got []int
		for i, f := range flows {
			if fs.Match(Flow(f, "node-1")) {
				got = append(got, i)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: flows %v pass, want %v", c.name, got, c.want)
		}
	}
	// A filter the server cannot evaluate is refused, naming the field.
	_, err := CompileFilters([]*flowpb.FlowFilter{{SourceFqdn: []string{"x.example"}}}, nil)
	if err == nil || !strings.Contains(err.Error(), "source_fqdn") {
		t.Errorf("fqdn filter: %v, want an error naming source_fqdn", err)
	}
}

// fakeSource serves the flows above as the agent's Observe does: the last req.Last
// matching ones (or all), then with Follow the flows of live.
type fakeSource struct {
	live chan api.Flow
}

func (fakeSource) Status(context.Context) (api.Status, error) {
	return api.Status{StartedAt: time.Now().Add(-time.Minute), FlowsSeen: 3, FlowsBuffered: 3, FlowHistory: 16}, nil
}

func (fakeSource) ListNamespaces(context.Context) ([]api.Namespace, error) {
	return []api.Namespace{{Name: "x"}, {Name: "y"}}, nil
}

func (s fakeSource) Observe(ctx context.Context, req api.ObserveRequest, send func(api.Flow) error) error {
	var hist []api.Flow
	for _, f := range flows {
		if req.Matches(f) {
			hist = append(hist, f)
		}
	}
	if !req.SinceStart && len(hist) > req.Last {
		hist = hist[len(hist)-req.Last:]
	}
	for _, f := range hist {
		if err := send(f); err != nil {
			return err
		}
	}
	if !req.Follow {
		return nil
	}
	req.Lost(7)
	for {
		select {
		case <-ctx.Done():
			return nil
		case f := <-s.live:
			if req.Matches(f) {
				if err := send(f); err != nil {
					return err
				}
			}
		}
	}
}

func TestServer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "hubble.sock")
	l, err := Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	src := fakeSource{live: make(chan api.Flow)}
	served := make(chan error)
	go func() { served <- Serve(ctx, l, NewServer(src, "node-1")) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := observerpb.NewObserverClient(conn)
	tctx, tcancel := context.WithTimeout(ctx, 10*time.Second)
	defer tcancel()

	get := func(req *observerpb.GetFlowsRequest) ([]*observerpb.GetFlowsResponse, error) {
		st, err := c.GetFlows(tctx, req)
		if err != nil {
			return nil, err
		}
		var out []*observerpb.GetFlowsResponse
		for {
			r, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			if err != nil {
				return out, err
			}
			out = append(out, r)
		}
	}
	rs, err := get(&observerpb.GetFlowsRequest{Number: 2})
	if err != nil || len(rs) != 2 || rs[0].GetFlow().GetVerdict() != flowpb.Verdict_DROPPED || rs[0].GetNodeName() != "node-1" {
		t.Errorf("last 2: %v, %v", rs, err)
	}
	rs, err = get(&observerpb.GetFlowsRequest{Number: 1, First: true})
	if err != nil || len(rs) != 1 || rs[0].GetFlow().GetEventType().GetType() != MessageTypePolicyVerdict {
		t.Errorf("first 1: %v, %v", rs, err)
	}
	rs, err = get(&observerpb.GetFlowsRequest{Since: timestampAt(t0.Add(time.Second)), Until: timestampAt(t0.Add(time.Second))})
	if err != nil || len(rs) != 1 || rs[0].GetFlow().GetL4().GetUDP() == nil {
		t.Errorf("since/until: %v, %v", rs, err)
	}
	_, err = get(&observerpb.GetFlowsRequest{Number: 1, Whitelist: []*flowpb.FlowFilter{{DnsQuery: []string{"x"}}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("dns filter: %v, want InvalidArgument", err)
	}

	// Following: a lost-events notice, then the new flow that matches.
	st, err := c.GetFlows(tctx, &observerpb.GetFlowsRequest{Follow: true, Whitelist: []*flowpb.FlowFilter{{DestinationPort: []string{"8080"}}}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil || r.GetLostEvents().GetNumEventsLost() != 7 {
		t.Fatalf("first message following: %v, %v; want 7 lost", r, err)
	}
	nf := flows[0]
	nf.Dest.Port = 8080
	src.live <- flows[0]
	src.live <- nf
	if r, err = st.Recv(); err != nil || r.GetFlow().GetL4().GetTCP().GetDestinationPort() != 8080 {
		t.Errorf("followed flow: %v, %v", r, err)
	}

	ss, err := c.ServerStatus(tctx, &observerpb.ServerStatusRequest{})
	if err != nil || ss.GetNumFlows() != 3 || ss.GetMaxFlows() != 16 || ss.GetSeenFlows() != 3 || ss.GetUptimeNs() == 0 {
		t.Errorf("status: %v, %v", ss, err)
	}
	nodes, err := c.GetNodes(tctx, &observerpb.GetNodesRequest{})
	if err != nil || len(nodes.GetNodes()) != 1 || nodes.GetNodes()[0].GetName() != "node-1" {
		t.Errorf("nodes: %v, %v", nodes, err)
	}
	nss, err := c.GetNamespaces(tctx, &observerpb.GetNamespacesRequest{})
	if err != nil || len(nss.GetNamespaces()) != 2 {
		t.Errorf("namespaces: %v, %v", nss, err)
	}
}

func TestListenRefusesBadAddresses(t *testing.T) {
	for _, a := range []string{"unix://", "localhost", "tcp://127.0.0.1:1"} {
		if l, err := Listen(a); err == nil {
			l.Close()
			t.Errorf("Listen(%q) succeeded", a)
		}
	}
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Addr().(*net.TCPAddr); !ok {
		t.Errorf("addr %v", l.Addr())
	}
	l.Close()
}

func timestampAt(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }
