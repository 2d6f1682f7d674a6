package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/relay"
	"github.com/rampartnet/rampart/internal/testenv"
)

// What the cluster's view asks each node's CLI (relay.Args) is read back by observe into
// the very request it came from: no filter is lost or changed on the way to a node.
func TestRelayArgsRoundTrip(t *testing.T) {
	since := time.Date(2026, 12, 7, 12, 0, 0, 123456789, time.UTC)
	for _, req := range []api.ObserveRequest{
		{Last: 20},
		{Follow: true},
		{SinceStart: true, Last: 20, Filter: api.FlowFilter{Since: since}},
		{Last: 3, Filter: api.FlowFilter{Endpoint: "a/b", Namespace: "shop", Labels: map[string]string{"app": "web", "tier": "front"},
			Verdict: "DROPPED", Port: 8080, Protocol: "udp", Type: "new", From: "shop/", To: "x/y", Since: since, Until: since.Add(time.Hour)}},
		{Follow: true, Filter: api.FlowFilter{Type: "l7", Verdict: "AUDIT"}},
	} {
		svc := &fakeObserver{}
		args := relay.Args(req)
		if _, errOut, code := runFake(t, svc, "", append([]string{"observe"}, args...)...); code != 0 {
			t.Fatalf("observe %q: exit %d: %s", args, code, errOut)
		}
		if !reflect.DeepEqual(svc.got, req) {
			t.Errorf("observe %q asked the agent\n %+v\nwant\n %+v", args, svc.got, req)
		}
	}
}

type fakeMapSource struct{ fakeObserver }

func (f *fakeMapSource) ListEndpoints(context.Context) ([]api.Endpoint, error) {
	return []api.Endpoint{{Namespace: "x", Name: "client"}, {Namespace: "y", Name: "web"}}, nil
}

func (f *fakeMapSource) ListRemoteEndpoints(context.Context) ([]api.RemoteEndpoint, error) {
	return nil, nil
}

// rampart ui serves the map of the agent it talks to: its endpoints and the edges of its
// flows.
func TestUIServesTheAgentsMap(t *testing.T) {
	svc := &fakeMapSource{fakeObserver{flows: []api.Flow{{
		Time: time.Now(), Type: "drop", Verdict: "DROPPED", Reason: "policy-deny", Direction: "ingress", Protocol: "TCP",
		Source: api.FlowPeer{IP: "198.18.0.5", Namespace: "x", Name: "client"},
		Dest:   api.FlowPeer{IP: "198.18.0.7", Port: 80, Namespace: "y", Name: "web"},
	}}}}
	sock := serveFake(t, svc)
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut testenv.SyncBuffer
	ran := make(chan int, 1)
	go func() {
		ran <- Run(ctx, []string{"--socket", sock, "ui", "--address", "127.0.0.1:0"}, IO{In: strings.NewReader(""), Out: &out, Err: &errOut})
	}()
	defer func() {
		cancel()
		if code := <-ran; code != 0 {
			t.Errorf("rampart ui exited %d: %s", code, errOut.String())
		}
	}()
	var url string
	if !testenv.Eventually(10*time.Second, func() bool {
		_, after, ok := strings.Cut(out.String(), "serving the service map on ")
		url = strings.TrimSpace(after)
		return ok && strings.HasSuffix(url, "/")
	}) {
		t.Fatalf("rampart ui does not say where it serves: %q %q", out.String(), errOut.String())
	}
	var m struct {
		Namespaces []struct{ Nodes []struct{ ID string } }
		Edges      []struct{ ID, Verdict string }
	}
	if !testenv.Eventually(10*time.Second, func() bool {
		resp, err := http.Get(url + "api/map")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		if json.NewDecoder(resp.Body).Decode(&m) != nil {
			return false
		}
		return len(m.Edges) == 1 && len(m.Namespaces) == 2
	}) {
		t.Fatalf("map %+v, want x/client and y/web with one edge", m)
	}
	if m.Edges[0].ID != "x/client->y/web" || m.Edges[0].Verdict != "DROPPED" || m.Namespaces[0].Nodes[0].ID != "x/client" {
		t.Errorf("map %+v", m)
	}
}
