package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
)

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// fakeNodes is an Exec whose agents print the flows given per node (at the times given,
// in seconds after t0), then fail with err[node] if set, or, with follow, wait for ctx.
type fakeNodes struct {
	flows  map[string][]int
	err    map[string]string
	raw    map[string]string // printed as is before the flows
	follow bool

	mu   sync.Mutex
	argv [][]string
}

func (n *fakeNodes) exec(ctx context.Context, a Agent, argv []string, stdout, stderr io.Writer) error {
	n.mu.Lock()
	n.argv = append(n.argv, argv)
	n.mu.Unlock()
	if _, err := io.WriteString(stdout, n.raw[a.Node]); err != nil {
		return err
	}
	for i, s := range n.flows[a.Node] {
		b, _ := json.Marshal(api.Flow{Time: t0.Add(time.Duration(s) * time.Second), Endpoint: fmt.Sprintf("%s/%d", a.Node, i)})
		if _, err := stdout.Write(append(b, '\n')); err != nil {
			return err
		}
	}
	if e := n.err[a.Node]; e != "" {
		io.WriteString(stderr, e)
		return errors.New("command terminated with exit code 1")
	}
	if n.follow {
		<-ctx.Done()
	}
	return nil
}

var three = []Agent{{Node: "node-1", Pod: "a1"}, {Node: "node-2", Pod: "a2"}, {Node: "node-3", Pod: "a3"}}

func listThree(context.Context) ([]Agent, error) { return three, nil }

func collect(t *testing.T, n *fakeNodes, req api.ObserveRequest) ([]api.Flow, []string, error) {
	t.Helper()
	var (
		got    []api.Flow
		failed []string
		mu     sync.Mutex
	)
	c := &Cluster{List: listThree, Exec: n.exec, Warn: func(err error) {
		mu.Lock()
		failed = append(failed, err.Error())
		mu.Unlock()
	}}
	err := c.Observe(context.Background(), req, func(f api.Flow) error {
		got = append(got, f)
		return nil
	})
	slices.Sort(failed)
	return got, failed, err
}

func names(fs []api.Flow) []string {
	var s []string
	for _, f := range fs {
		s = append(s, f.Node+"@"+f.Time.Sub(t0).String())
	}
	return s
}

// Every node's flows come out in one time order, each naming its node; the argv asks
// each node's CLI for JSON with the filters given.
func TestObserveMergesNodesInTimeOrder(t *testing.T) {
	n := &fakeNodes{flows: map[string][]int{"node-1": {1, 4, 7}, "node-2": {2, 5}, "node-3": {3, 6, 8}}}
	got, failed, err := collect(t, n, api.ObserveRequest{Filter: api.FlowFilter{Namespace: "shop"}, Last: 20})
	if err != nil || failed != nil {
		t.Fatalf("Observe: %v, failed %v", err, failed)
	}
	want := []string{"node-1@1s", "node-2@2s", "node-3@3s", "node-1@4s", "node-2@5s", "node-3@6s", "node-1@7s", "node-3@8s"}
	if !slices.Equal(names(got), want) {
		t.Errorf("flows %v, want %v", names(got), want)
	}
	for _, argv := range n.argv {
		if w := []string{"rampart", "observe", "--namespace=shop", "--last=20", "--since-start=false", "--follow=false", "--output=json"}; !slices.Equal(argv, w) {
			t.Errorf("argv %q, want %q", argv, w)
		}
	}
}

// --last N is the newest N of the merged view, not of each node.
func TestObserveLastIsOfTheMergedView(t *testing.T) {
	n := &fakeNodes{flows: map[string][]int{"node-1": {1, 9, 10}, "node-2": {2, 3}, "node-3": {4, 11}}}
	got, _, err := collect(t, n, api.ObserveRequest{Last: 3})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"node-1@10s", "node-3@11s"}; len(got) != 3 || !slices.Equal(names(got)[1:], want) || names(got)[0] != "node-1@9s" {
		t.Errorf("last 3: %v", names(got))
	}
}

// A node that fails is reported with its error output; the others are still shown, and
// Observe fails only when no node answered.
func TestObserveReportsFailedNodes(t *testing.T) {
	n := &fakeNodes{
		flows: map[string][]int{"node-1": {1}, "node-3": {3}},
		err:   map[string]string{"node-2": "rampart: connecting to the agent: no such file"},
		raw:   map[string]string{"node-3": "not json\n"},
	}
	got, failed, err := collect(t, n, api.ObserveRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names(got), []string{"node-1@1s"}) {
		t.Errorf("flows %v, want node-1's only", names(got))
	}
	if len(failed) != 2 || !strings.Contains(failed[0], "node node-2 (agent pod /a2)") || !strings.Contains(failed[0], "no such file") ||
		!strings.Contains(failed[1], "node node-3") || !strings.Contains(failed[1], `line "not json"`) {
		t.Errorf("failed %q", failed)
	}

	n.err = map[string]string{"node-1": "x", "node-2": "y", "node-3": "z"}
	n.raw = nil
	if _, _, err := collect(t, n, api.ObserveRequest{}); err == nil || !strings.Contains(err.Error(), "no agent answered") {
		t.Errorf("every node failed: %v", err)
	}
}

// A line longer than maxLine fails that node instead of growing a buffer without bound.
func TestObserveBoundsLines(t *testing.T) {
	n := &fakeNodes{raw: map[string]string{"node-2": strings.Repeat("x", maxLine+10) + "\n"}, flows: map[string][]int{"node-1": {1}}}
	got, failed, err := collect(t, n, api.ObserveRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(failed) != 1 || !strings.Contains(failed[0], "too long") {
		t.Errorf("flows %v, failed %q", names(got), failed)
	}
}

// Followed streams come out in time order through the window however they interleave,
// and the stream stops with its context.
func TestObserveFollowSortsThroughTheWindow(t *testing.T) {
	n := &fakeNodes{flows: map[string][]int{"node-1": {5, 6}, "node-2": {1, 2}, "node-3": {3, 4}}, follow: true}
	ctx, cancel := context.WithCancel(context.Background())
	var got []api.Flow
	done := make(chan error, 1)
	go func() {
		c := &Cluster{List: listThree, Exec: n.exec, Warn: func(err error) { t.Errorf("left out: %v", err) }}
		done <- c.Observe(ctx, api.ObserveRequest{Follow: true}, func(f api.Flow) error {
			if got = append(got, f); len(got) == 6 {
				cancel()
			}
			return nil
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Observe did not stop with its context")
	}
	want := []string{"node-2@1s", "node-2@2s", "node-3@3s", "node-3@4s", "node-1@5s", "node-1@6s"}
	if !slices.Equal(names(got), want) {
		t.Errorf("followed flows %v, want %v", names(got), want)
	}
}

// A send error stops every stream and is returned.
func TestObserveStopsOnSendError(t *testing.T) {
	n := &fakeNodes{flows: map[string][]int{"node-1": {1, 2}}, follow: true}
	stop := errors.New("stdout closed")
	c := &Cluster{List: listThree, Exec: n.exec, Warn: func(error) {}}
	err := c.Observe(context.Background(), api.ObserveRequest{Follow: true}, func(api.Flow) error { return stop })
	if !errors.Is(err, stop) {
		t.Errorf("Observe: %v, want the send error", err)
	}
}

// Args asks an agent's CLI for exactly the request: every filter, and --last,
// --since-start and --follow explicit so the CLI's defaults do not stand in.
func TestArgs(t *testing.T) {
	req := api.ObserveRequest{Filter: api.FlowFilter{Endpoint: "a/b", Namespace: "shop", Labels: map[string]string{"z": "1", "app": "web"},
		Verdict: "DROPPED", Port: 80, Protocol: "tcp", Type: "drop", From: "shop/", To: "x/y",
		Since: t0, Until: t0.Add(time.Hour)}, Last: 5, Follow: true}
	want := []string{"--endpoint=a/b", "--namespace=shop", "--label=app=web", "--label=z=1", "--verdict=DROPPED", "--port=80",
		"--protocol=tcp", "--type=drop", "--from-pod=shop/", "--to-pod=x/y", "--since=2026-12-07T12:00:00Z", "--until=2026-12-07T13:00:00Z",
		"--last=5", "--since-start=false", "--follow=true", "--output=json"}
	if got := Args(req); !slices.Equal(got, want) {
		t.Errorf("Args:\n got %q\nwant %q", got, want)
	}
}

// A followed node whose stream ends is asked again from its last flow on (no flow twice),
// and an agent that appears is followed once the agents are listed again.
func TestFollowAsksAgainAndFindsNewAgents(t *testing.T) {
	var (
		mu     sync.Mutex
		calls  = map[string][][]string{}
		agents = []Agent{{Node: "node-1", Pod: "a1"}}
	)
	exec := func(ctx context.Context, a Agent, argv []string, stdout, stderr io.Writer) error {
		mu.Lock()
		calls[a.Node] = append(calls[a.Node], argv)
		n := len(calls[a.Node])
		if a.Node == "node-1" && n == 2 { // a new node joins while the view is followed
			agents = append(agents, Agent{Node: "node-2", Pod: "a2"})
		}
		mu.Unlock()
		if a.Node == "node-1" && n == 1 { // one flow, then the stream ends (the agent restarted)
			b, _ := json.Marshal(api.Flow{Time: t0.Add(time.Second)})
			stdout.Write(append(b, '\n'))
			return errors.New("connection reset")
		}
		b, _ := json.Marshal(api.Flow{Time: t0.Add(time.Duration(n+1) * time.Second)})
		stdout.Write(append(b, '\n'))
		<-ctx.Done()
		return nil
	}
	var warned []string
	c := &Cluster{List: func(context.Context) ([]Agent, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(agents), nil
	}, Exec: exec, Warn: func(err error) { mu.Lock(); warned = append(warned, err.Error()); mu.Unlock() }, RelistInterval: 50 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []string
	c.Observe(ctx, api.ObserveRequest{Follow: true, Last: 3}, func(f api.Flow) error {
		if got = append(got, f.Node+"@"+f.Time.Sub(t0).String()); len(got) == 3 {
			cancel()
		}
		return nil
	})
	if ctx.Err() != context.Canceled {
		t.Fatalf("flows %v after 20 s (warned %q)", got, warned)
	}
	slices.Sort(got)
	if want := []string{"node-1@1s", "node-1@3s", "node-2@2s"}; !slices.Equal(got, want) {
		t.Errorf("flows %v, want %v", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls["node-1"]) < 2 || !slices.Contains(calls["node-1"][1], "--since=2026-12-07T12:00:01.000000001Z") || !slices.Contains(calls["node-1"][1], "--since-start=true") {
		t.Errorf("node-1 asked again with %q, want since its last flow", calls["node-1"])
	}
	if len(warned) == 0 || !strings.Contains(warned[0], "node node-1") || !strings.Contains(warned[0], "connection reset") {
		t.Errorf("warned %q, want node-1's reset", warned)
	}
}

// ListEndpoints is every node's endpoints, a failing node left out and said.
func TestListEndpoints(t *testing.T) {
	var warned []string
	var calls atomic.Int32
	c := &Cluster{List: listThree, Warn: func(err error) { warned = append(warned, err.Error()) },
		Exec: func(_ context.Context, a Agent, argv []string, stdout, stderr io.Writer) error {
			calls.Add(1)
			if !slices.Equal(argv, []string{"rampart", "endpoint", "list", "-o", "json"}) {
				return fmt.Errorf("argv %q", argv)
			}
			if a.Node == "node-3" {
				io.WriteString(stderr, "no agent")
				return errors.New("exit 1")
			}
			b, _ := json.Marshal([]api.Endpoint{{Namespace: "shop", Name: "web-" + a.Node}})
			_, err := stdout.Write(b)
			return err
		}}
	eps, err := c.ListEndpoints(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range eps {
		keys = append(keys, e.Key())
	}
	if want := []string{"shop/web-node-1", "shop/web-node-2"}; !slices.Equal(keys, want) {
		t.Errorf("endpoints %v, want %v", keys, want)
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "node node-3") || !strings.Contains(warned[0], "no agent") {
		t.Errorf("warned %q", warned)
	}
	if _, err := c.ListEndpoints(context.Background()); err != nil || calls.Load() != 3 {
		t.Errorf("a second listing at once: %v, %d execs; want the first reused", err, calls.Load())
	}
}
