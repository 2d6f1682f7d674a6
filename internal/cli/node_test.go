package cli

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
)

// fakeNodes is an agent that only knows other nodes and remote endpoints, recording what
// it was sent.
type fakeNodes struct {
	api.Service
	mu      sync.Mutex
	nodes   map[string]api.NodeSpec
	remotes map[string]api.RemoteEndpointSpec
}

func (f *fakeNodes) PutNode(_ context.Context, name string, spec api.NodeSpec) (api.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes[name] = spec
	return api.Node{Name: name, Address: spec.Address, PodCIDR: spec.PodCIDR, PodCIDR6: spec.PodCIDR6, Address6: spec.Address6}, nil
}

func (f *fakeNodes) ListNodes(context.Context) ([]api.Node, error) {
	return []api.Node{{Name: "node-b", Address: "198.19.255.2", PodCIDR: "198.18.32.0/20", RemoteEndpoints: 1}}, nil
}

func (f *fakeNodes) PutRemoteEndpoint(_ context.Context, ns, name string, spec api.RemoteEndpointSpec) (api.RemoteEndpoint, error) {
	if spec.Identity == 1 {
		return api.RemoteEndpoint{}, api.Conflict("remote endpoint %s/%s: identity 1 is not an endpoint identity", ns, name)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.remotes[ns+"/"+name] = spec
	return api.RemoteEndpoint{Namespace: ns, Name: name, Node: spec.Node, IP: spec.IP, Labels: spec.Labels, Identity: spec.Identity}, nil
}

func TestNodeAndRemoteCommands(t *testing.T) {
	f := &fakeNodes{nodes: map[string]api.NodeSpec{}, remotes: map[string]api.RemoteEndpointSpec{}}
	out, errs, code := runFake(t, f, "", "node", "add", "node-b", "--address", "198.19.255.2", "--pod-cidr", "198.18.32.0/20")
	if code != 0 || !strings.Contains(out, "node node-b: address 198.19.255.2, pod CIDR 198.18.32.0/20") {
		t.Fatalf("node add: %d %q %q", code, out, errs)
	}
	if want := (api.NodeSpec{Address: "198.19.255.2", PodCIDR: "198.18.32.0/20"}); f.nodes["node-b"] != want {
		t.Errorf("node sent %+v, want %+v", f.nodes["node-b"], want)
	}
	out, errs, code = runFake(t, f, "", "node", "add", "node-d", "--address", "198.19.255.4", "--pod-cidr", "198.18.48.0/20", "--pod-cidr6", "2001:2:0:d::/64")
	if code != 0 || !strings.Contains(out, "pod CIDR 198.18.48.0/20, IPv6 pod CIDR 2001:2:0:d::/64") || f.nodes["node-d"].PodCIDR6 != "2001:2:0:d::/64" {
		t.Errorf("node add --pod-cidr6: %d %q %q, sent %+v", code, out, errs, f.nodes["node-d"])
	}
	out, errs, code = runFake(t, f, "", "node", "add", "node-e", "--address", "198.19.255.5", "--pod-cidr", "198.18.64.0/20",
		"--address6", "2001:2:0:fab::e", "--pod-cidr6", "2001:2:0:e::/64")
	if code != 0 || !strings.Contains(out, "pod CIDR 198.18.64.0/20, IPv6 address 2001:2:0:fab::e, IPv6 pod CIDR 2001:2:0:e::/64") ||
		f.nodes["node-e"].Address6 != "2001:2:0:fab::e" {
		t.Errorf("node add --address6: %d %q %q, sent %+v", code, out, errs, f.nodes["node-e"])
	}
	if _, errs, code := runFake(t, f, "", "node", "add", "node-c"); code == 0 || !strings.Contains(errs, "address") {
		t.Errorf("node add without --address: exit %d, stderr %q", code, errs)
	}
	out, _, code = runFake(t, f, "", "node", "list")
	if code != 0 || !strings.Contains(out, "node-b") || !strings.Contains(out, "198.18.32.0/20") {
		t.Errorf("node list: %d %q", code, out)
	}

	out, errs, code = runFake(t, f, "", "remote", "add", "x/b", "--node", "node-b", "--ip", "198.18.32.2", "--labels", "pod=b,app=web", "--identity", "258", "--port", "http=8080/TCP")
	if code != 0 || !strings.Contains(out, "remote endpoint x/b: node node-b, ip 198.18.32.2, identity 258") {
		t.Fatalf("remote add: %d %q %q", code, out, errs)
	}
	want := api.RemoteEndpointSpec{Node: "node-b", IP: "198.18.32.2", Labels: map[string]string{"pod": "b", "app": "web"}, Identity: 258,
		Ports: []api.NamedPort{{Name: "http", Port: 8080, Protocol: "TCP"}}}
	if got := f.remotes["x/b"]; !reflect.DeepEqual(got, want) {
		t.Errorf("remote sent %+v, want %+v", got, want)
	}
	if _, errs, code := runFake(t, f, "", "remote", "add", "x/d", "--node", "node-b", "--ip", "198.18.32.3", "--identity", "1"); code == 0 || !strings.Contains(errs, "not an endpoint identity") {
		t.Errorf("remote add refused by the agent: exit %d, stderr %q", code, errs)
	}
	if _, errs, code := runFake(t, f, "", "remote", "add", "nokey", "--node", "node-b", "--ip", "198.18.32.3"); code == 0 || errs == "" {
		t.Errorf("remote add without namespace/name: exit %d, stderr %q", code, errs)
	}
}

// A pod on another node is named with its node in observe's output.
func TestPeerNameOfRemotePod(t *testing.T) {
	cases := map[string]api.FlowPeer{
		"x/a@node-a":   {Namespace: "x", Name: "a", Node: "node-a", IP: "198.18.16.2"},
		"x/b":          {Namespace: "x", Name: "b", IP: "198.18.32.2"},
		"198.18.16.99": {IP: "198.18.16.99"},
	}
	for want, p := range cases {
		if got := peerName(p); got != want {
			t.Errorf("peerName(%+v) = %q, want %q", p, got, want)
		}
	}
}
