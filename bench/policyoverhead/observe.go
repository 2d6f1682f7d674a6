package policyoverhead

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// The observed agent (CaseObserved) serves everything an operator watches a node with,
// and each is read all through the run, as a Prometheus server, a `hubble observe
// --follow` and an open service map page would: what the l4 case costs with them against
// what it costs without is what observability costs the data path.

// observeEvery is how often the metrics and the service map are read: far more often than
// a Prometheus scrape (15 s by default) or the page (1 s), so that a cost would show.
const observeEvery = 200 * time.Millisecond

// ObservedReads is what the observed agent's readers read during the run.
type ObservedReads struct {
	MetricsScrapes  int    `json:"metrics_scrapes"`
	ServiceMapReads int    `json:"service_map_reads"`
	FollowFlowBytes int    `json:"follow_flow_bytes"` // of `rampart observe --follow`'s output
	HubbleFlowBytes int    `json:"hubble_flow_bytes"` // of `hubble observe --follow`'s; 0 without hubble
	Errors          int    `json:"errors"`
	FirstError      string `json:"first_error,omitempty"`
}

// observed holds the observed agent's addresses.
type observed struct {
	metrics, ui, hubble string
	hubbleCLI           string // the hubble binary ("": not read over the Hubble API)
}

// newObserved picks free local ports for the metrics and the service map, and a socket in
// dir for the Hubble API; hubbleCLI, when not empty, reads it.
func newObserved(dir, hubbleCLI string) (*observed, error) {
	o := &observed{hubble: "unix://" + filepath.Join(dir, "hubble.sock"), hubbleCLI: hubbleCLI}
	for _, p := range []*string{&o.metrics, &o.ui} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("picking a local port: %w", err)
		}
		*p = l.Addr().String()
		l.Close()
	}
	return o, nil
}

func (o *observed) flags() []string {
	return []string{"--metrics-address", o.metrics, "--hubble-address", o.hubble, "--ui-address", o.ui}
}

// countingWriter counts what a follower printed.
type countingWriter struct {
	mu sync.Mutex
	n  int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.n += len(p)
	w.mu.Unlock()
	return len(p), nil
}

func (w *countingWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// read starts the readers of agent a: the flow followers (daemons, stopped with the
// others) and a loop reading the metrics and the service map. The function it returns
// stops the loop and reports what was read.
func (o *observed) read(ctx context.Context, a *benchkit.Agent, d *benchkit.Daemons) func() *ObservedReads {
	res := &ObservedReads{}
	fail := func(err error) {
		res.Errors++
		if res.FirstError == "" {
			res.FirstError = err.Error()
		}
	}
	follow, hubble := &countingWriter{}, &countingWriter{}
	cmd := exec.Command(a.Rampart, "--socket", a.Socket, "observe", "--follow")
	cmd.Stdout = follow
	if _, err := d.Start("rampart observe --follow", cmd); err != nil {
		fail(err)
	}
	if o.hubbleCLI != "" {
		cmd := exec.Command(o.hubbleCLI, "observe", "--server", o.hubble, "--follow", "-o", "json")
		cmd.Stdout = hubble
		if _, err := d.Start("hubble observe --follow", cmd); err != nil {
			fail(err)
		}
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(url string) error {
		req, err := http.NewRequestWithContext(lctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
	go func() {
		defer close(done)
		t := time.NewTicker(observeEvery)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
			}
			if err := get("http://" + o.metrics + "/metrics"); err != nil {
				if lctx.Err() == nil {
					fail(err)
				}
			} else {
				res.MetricsScrapes++
			}
			mapErr := get("http://" + o.ui + "/api/map")
			if mapErr == nil {
				mapErr = get("http://" + o.ui + "/api/flows")
			}
			if mapErr != nil {
				if lctx.Err() == nil {
					fail(mapErr)
				}
			} else {
				res.ServiceMapReads++
			}
		}
	}()
	return func() *ObservedReads {
		cancel()
		<-done
		res.FollowFlowBytes, res.HubbleFlowBytes = follow.count(), hubble.count()
		return res
	}
}

// checkRead says whether the readers read anything of each kind (a run whose readers
// read nothing measured no observability).
func (r *ObservedReads) checkRead(hubble bool) error {
	var missing []string
	if r.MetricsScrapes == 0 {
		missing = append(missing, "metrics")
	}
	if r.ServiceMapReads == 0 {
		missing = append(missing, "service map")
	}
	if r.FollowFlowBytes == 0 {
		missing = append(missing, "rampart observe --follow")
	}
	if hubble && r.HubbleFlowBytes == 0 {
		missing = append(missing, "hubble observe --follow")
	}
	if len(missing) > 0 {
		return fmt.Errorf("the observed agent's readers read nothing from: %s (errors %d, first: %s)", strings.Join(missing, ", "), r.Errors, r.FirstError)
	}
	return nil
}
