package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/hubble/flowpb"
	"github.com/rampartnet/rampart/internal/hubble/observerpb"
)

// fakeObserver records the observe request and answers with its flows, filtered.
type fakeObserver struct {
	api.Service
	got   api.ObserveRequest
	flows []api.Flow
}

func (f *fakeObserver) Status(context.Context) (api.Status, error) {
	return api.Status{Kubernetes: &api.KubernetesStatus{NodeName: "node-1"}}, nil
}

func (f *fakeObserver) Observe(_ context.Context, req api.ObserveRequest, send func(api.Flow) error) error {
	f.got = req
	for _, fl := range f.flows {
		if req.Matches(fl) {
			if err := send(fl); err != nil {
				return err
			}
		}
	}
	return nil
}

// The hubble-style flags reach the agent's filter, and -o jsonpb prints Hubble's JSON.
func TestObserveHubbleFlags(t *testing.T) {
	at := time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond)
	svc := &fakeObserver{flows: []api.Flow{{
		Time: at, Type: "drop", Verdict: "DROPPED", Reason: "policy-deny", Direction: "ingress", Protocol: "TCP",
		Source: api.FlowPeer{IP: "198.18.0.5", Port: 40000, Identity: 260, Namespace: "x", Name: "client"},
		Dest:   api.FlowPeer{IP: "198.18.0.7", Port: 81, Identity: 261, Namespace: "y", Name: "web"},
	}}}
	out, errOut, code := runFake(t, svc, "", "observe", "--from-pod", "x/cl", "--to-pod", "y/", "--since", "5m",
		"--type", "drop", "--verdict", "dropped", "-o", "jsonpb")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	g := svc.got
	if g.Filter.From != "x/cl" || g.Filter.To != "y/" || g.Filter.Type != "drop" || g.Filter.Verdict != "DROPPED" ||
		!g.SinceStart || time.Since(g.Filter.Since) < 5*time.Minute || time.Since(g.Filter.Since) > 6*time.Minute {
		t.Errorf("request %+v", g)
	}
	var r observerpb.GetFlowsResponse
	if err := protojson.Unmarshal([]byte(strings.TrimSpace(out)), &r); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	f := r.GetFlow()
	if r.GetNodeName() != "node-1" || f.GetVerdict() != flowpb.Verdict_DROPPED || f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENY ||
		f.GetDestination().GetPodName() != "web" || f.GetL4().GetTCP().GetDestinationPort() != 81 || !f.GetTime().AsTime().Equal(at) {
		t.Errorf("printed %s", out)
	}
	for _, name := range []string{`"node_name":"node-1"`, `"drop_reason_desc":"POLICY_DENY"`, `"pod_name":"web"`} {
		if !strings.Contains(out, name) {
			t.Errorf("output lacks Hubble's %s: %s", name, out)
		}
	}
	// --since with --last: the last N since then; policy-verdict is Rampart's new.
	if _, errOut, code := runFake(t, svc, "", "observe", "--since", "2026-01-02T15:04:05Z", "--last", "3", "--type", "policy-verdict"); code != 0 ||
		svc.got.SinceStart || svc.got.Last != 3 || svc.got.Filter.Type != "new" || svc.got.Filter.Since.Year() != 2026 {
		t.Errorf("exit %d %s; request %+v", code, errOut, svc.got)
	}
	for _, bad := range [][]string{{"--since", "yesterday"}, {"--from-pod", "a/b/c"}, {"--type", "trace"}, {"-o", "yaml"}} {
		if _, _, code := runFake(t, svc, "", append([]string{"observe"}, bad...)...); code == 0 {
			t.Errorf("observe %v succeeded", bad)
		}
	}
}
