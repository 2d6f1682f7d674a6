package relay

import (
	"bufio"
	"bytes"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/rampartnet/rampart/internal/api"
)

// Where deploy/ runs the agents, and the container that has the CLI.
const (
	DefaultNamespace = "kube-system"
	DefaultSelector  = "app.kubernetes.io/name=rampart"
	agentContainer   = "rampartd"
)

const (
	// SortWindow is how long a followed flow waits for earlier ones from other nodes.
	SortWindow = 500 * time.Millisecond
	// MaxBuffered bounds the flows waiting in the window.
	MaxBuffered = 10000
	// maxLine bounds one flow's JSON line: an agent's flow is a few hundred bytes, an L7
	// one a few kilobytes; a longer line is an error, not an allocation without bound.
	maxLine = 1 << 20
	// stderrTail is how much of a node's error output is kept to explain its failure.
	stderrTail = 4096
)

// Agent is one node's agent pod.
type Agent struct {
	Node, Namespace, Pod string
}

// Agents lists the running agent pods selected by selector in namespace, by node name.
func Agents(ctx context.Context, cs kubernetes.Interface, namespace, selector string) ([]Agent, error) {
	list, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("listing agent pods (%s in %s): %w", selector, namespace, err)
	}
	var agents []Agent
	for _, p := range list.Items {
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil || p.Spec.NodeName == "" {
			continue
		}
		agents = append(agents, Agent{Node: p.Spec.NodeName, Namespace: p.Namespace, Pod: p.Name})
	}
	if len(agents) == 0 {
		return nil, fmt.Errorf("no running agent pods (%s in %s)", selector, namespace)
	}
	sort.Slice(agents, func(i, j int) bool { return agents[i].Node < agents[j].Node })
	return agents, nil
}

// Exec runs argv in an agent's pod and copies its output to stdout and stderr until it
// ends or ctx is done.
type Exec func(ctx context.Context, a Agent, argv []string, stdout, stderr io.Writer) error

// PodExec is Exec through the API server (the pods/exec subresource), as kubectl exec.
func PodExec(cfg *rest.Config, cs kubernetes.Interface) Exec {
	return func(ctx context.Context, a Agent, argv []string, stdout, stderr io.Writer) error {
		u := cs.CoreV1().RESTClient().Post().Namespace(a.Namespace).Resource("pods").Name(a.Pod).
			SubResource("exec").VersionedParams(&corev1.PodExecOptions{
			Container: agentContainer, Command: argv, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec).URL()
		ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", u.String())
		if err != nil {
			return fmt.Errorf("exec into %s/%s: %w", a.Namespace, a.Pod, err)
		}
		spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", u)
		if err != nil {
			return fmt.Errorf("exec into %s/%s: %w", a.Namespace, a.Pod, err)
		}
		// An API server without the WebSocket protocol is asked over SPDY, as kubectl does.
		ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
			return err != nil && !errors.Is(err, context.Canceled)
		})
		if err != nil {
			return fmt.Errorf("exec into %s/%s: %w", a.Namespace, a.Pod, err)
		}
		return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
	}
}

// Cluster is a cluster's agents as one source of flows and endpoints: it is what `rampart
// observe --cluster` and `rampart ui --cluster` read, and satisfies the service map's
// Source.
type Cluster struct {
	// List finds the agents (Agents through the API server).
	List func(ctx context.Context) ([]Agent, error)
	// Exec runs the CLI in an agent's pod (PodExec).
	Exec Exec
	// Warn is told of what is left out of the view and why: a node that failed, a
	// listing that failed. The view goes on without it.
	Warn func(error)
	// RelistInterval is how often a followed view looks for agents that came or went
	// (0: DefaultRelistInterval).
	RelistInterval time.Duration

	endpoints endpointCache
}

// DefaultRelistInterval is how often a followed view lists the agents again.
const DefaultRelistInterval = 10 * time.Second

// New is the Cluster of the agent pods selected by selector in namespace, reached through
// the API server cfg names.
func New(cfg *rest.Config, namespace, selector string, warn func(error)) (*Cluster, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("making a client of the API server: %w", err)
	}
	return &Cluster{
		List: func(ctx context.Context) ([]Agent, error) { return Agents(ctx, cs, namespace, selector) },
		Exec: PodExec(cfg, cs),
		Warn: warn,
	}, nil
}

// Args are the flags of `rampart observe` that ask an agent for req.
func Args(req api.ObserveRequest) []string {
	var args []string
	add := func(flag, v string) {
		if v != "" {
			args = append(args, "--"+flag+"="+v)
		}
	}
	f := req.Filter
	add("endpoint", f.Endpoint)
	add("namespace", f.Namespace)
	keys := make([]string, 0, len(f.Labels))
	for k := range f.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		add("label", k+"="+f.Labels[k])
	}
	add("verdict", f.Verdict)
	if f.Port != 0 {
		add("port", strconv.Itoa(int(f.Port)))
	}
	add("protocol", f.Protocol)
	add("type", f.Type)
	add("from-pod", f.From)
	add("to-pod", f.To)
	if !f.Since.IsZero() {
		add("since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	if !f.Until.IsZero() {
		add("until", f.Until.UTC().Format(time.RFC3339Nano))
	}
	// Explicit, so that no default of the agent's CLI (--last 20, --since's "all") stands
	// in for what req says.
	add("last", strconv.Itoa(req.Last))
	add("since-start", strconv.FormatBool(req.SinceStart))
	add("follow", strconv.FormatBool(req.Follow))
	return append(args, "--output=json")
}

// Observe sends the flows req asks for from every agent, each with its Node set, from one
// goroutine at a time. Without Follow: every node's, merged in time order (req.Last is
// then of the merged view), once all have answered; an error if none did. With Follow:
// through the sort window until ctx is done; a node whose stream ends is asked again from
// its last flow on, and agents that come or go are found by listing them again.
func (c *Cluster) Observe(ctx context.Context, req api.ObserveRequest, send func(api.Flow) error) error {
	if req.Follow {
		return c.follow(ctx, req, send)
	}
	agents, err := c.List(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	flows := make(chan api.Flow, 256)
	var (
		wg       sync.WaitGroup
		failures atomic.Int32
	)
	argv := append([]string{"rampart", "observe"}, Args(req)...)
	for _, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := stream(ctx, a, c.Exec, argv, flows); err != nil && ctx.Err() == nil {
				failures.Add(1)
				c.Warn(nodeError(a, err))
			}
		}()
	}
	go func() { wg.Wait(); close(flows) }()
	last := req.Last
	if req.SinceStart {
		last = 0
	}
	if err := sortAll(flows, last, send); err != nil {
		cancel()
		for range flows { // let the streams end
		}
		return err
	}
	if ctx.Err() == nil && int(failures.Load()) == len(agents) {
		return errors.New("no agent answered")
	}
	return ctx.Err()
}

func nodeError(a Agent, err error) error {
	return fmt.Errorf("node %s (agent pod %s/%s): %w", a.Node, a.Namespace, a.Pod, err)
}

// follow is Observe with Follow.
func (c *Cluster) follow(ctx context.Context, req api.ObserveRequest, send func(api.Flow) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	flows := make(chan api.Flow, 256)
	interval := c.RelistInterval
	if interval == 0 {
		interval = DefaultRelistInterval
	}
	go func() {
		running := map[Agent]context.CancelFunc{}
		for {
			agents, err := c.List(ctx)
			if err != nil && ctx.Err() == nil {
				c.Warn(err)
			}
			if err == nil {
				seen := map[Agent]bool{}
				for _, a := range agents {
					seen[a] = true
					if running[a] == nil {
						actx, stop := context.WithCancel(ctx)
						running[a] = stop
						go c.followAgent(actx, a, req, flows)
					}
				}
				for a, stop := range running {
					if !seen[a] {
						stop()
						delete(running, a)
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
		}
	}()
	return sortWindow(ctx, flows, send)
}

// followAgent follows one agent's flows until ctx is done, asking again after a failure
// (with a growing pause) from the last flow it sent on.
func (c *Cluster) followAgent(ctx context.Context, a Agent, req api.ObserveRequest, flows chan<- api.Flow) {
	pause := time.Second
	var last time.Time
	for {
		r := req
		if !last.IsZero() {
			r.Filter.Since, r.SinceStart, r.Last = last.Add(time.Nanosecond), true, 0
		}
		argv := append([]string{"rampart", "observe"}, Args(r)...)
		newest, err := stream(ctx, a, c.Exec, argv, flows)
		if ctx.Err() != nil {
			return
		}
		if newest.After(last) {
			last, pause = newest, time.Second
		}
		if err == nil {
			err = errors.New("its flow stream ended")
		}
		c.Warn(fmt.Errorf("%w; asking again in %v", nodeError(a, err), pause))
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 30*time.Second)
	}
}

// stream runs argv, an observe, in a's pod and sends its flows; it returns the time of the
// newest one it sent.
func stream(ctx context.Context, a Agent, exec Exec, argv []string, flows chan<- api.Flow) (newest time.Time, _ error) {
	r, w := io.Pipe()
	var errOut tailBuffer
	done := make(chan error, 1)
	go func() {
		err := exec(ctx, a, argv, w, &errOut)
		w.Close()
		done <- err
	}()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	var readErr error
	for sc.Scan() {
		var f api.Flow
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			readErr = fmt.Errorf("reading its flows: %w (line %q)", err, clip(sc.Text()))
			break
		}
		f.Node = a.Node
		select {
		case flows <- f:
			if f.Time.After(newest) {
				newest = f.Time
			}
		case <-ctx.Done():
			r.CloseWithError(ctx.Err())
			<-done
			return newest, nil
		}
	}
	if readErr == nil {
		readErr = sc.Err()
	}
	r.CloseWithError(errors.New("stopped reading")) // the exec's writes fail and it returns
	err := <-done
	if readErr != nil {
		return newest, readErr
	}
	if err != nil {
		if msg := strings.TrimSpace(errOut.String()); msg != "" {
			return newest, fmt.Errorf("%w: %s", err, msg)
		}
		return newest, err
	}
	return newest, nil
}

// sortAll sends every flow, in time order, once all streams have ended: the last last
// ones when last > 0.
func sortAll(flows <-chan api.Flow, last int, send func(api.Flow) error) error {
	var all []api.Flow
	for f := range flows {
		all = append(all, f)
		if last > 0 && len(all) > 2*last+1024 { // keep the memory to about last per node
			all = newest(all, last)
		}
	}
	if last > 0 {
		all = newest(all, last)
	} else {
		slices.SortStableFunc(all, byTime)
	}
	for _, f := range all {
		if err := send(f); err != nil {
			return err
		}
	}
	return nil
}

// newest returns the last n flows of fs in time order.
func newest(fs []api.Flow, n int) []api.Flow {
	slices.SortStableFunc(fs, byTime)
	if len(fs) > n {
		fs = slices.Clone(fs[len(fs)-n:])
	}
	return fs
}

func byTime(a, b api.Flow) int { return a.Time.Compare(b.Time) }

// sortWindow sends each flow once it has waited SortWindow (or the buffer is full), the
// earliest first.
func sortWindow(ctx context.Context, flows <-chan api.Flow, send func(api.Flow) error) error {
	var h held
	tick := time.NewTicker(SortWindow / 5)
	defer tick.Stop()
	flush := func(now time.Time, all bool) error {
		for h.Len() > 0 && (all || h.Len() > MaxBuffered || now.Sub(h[0].arrived) >= SortWindow) {
			if err := send(heap.Pop(&h).(heldFlow).Flow); err != nil {
				return err
			}
		}
		return nil
	}
	for {
		select {
		case f, ok := <-flows:
			if !ok {
				return flush(time.Now(), true)
			}
			now := time.Now()
			heap.Push(&h, heldFlow{Flow: f, arrived: now})
			if err := flush(now, false); err != nil {
				return err
			}
		case now := <-tick.C:
			if err := flush(now, false); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

type heldFlow struct {
	api.Flow
	arrived time.Time
}

// held is a heap of flows, the earliest on top.
type held []heldFlow

func (h held) Len() int           { return len(h) }
func (h held) Less(i, j int) bool { return h[i].Time.Before(h[j].Time) }
func (h held) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *held) Push(x any)        { *h = append(*h, x.(heldFlow)) }
func (h *held) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// tailBuffer keeps the last stderrTail bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) > stderrTail {
		p = p[len(p)-stderrTail:]
	}
	t.buf.Write(p)
	if extra := t.buf.Len() - stderrTail; extra > 0 {
		t.buf.Next(extra)
	}
	return n, nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}
