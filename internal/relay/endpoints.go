package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rampartnet/rampart/internal/api"
)

const (
	// endpointsFresh is how long a listing of the cluster's endpoints is reused: the
	// service map asks every few seconds, and each listing is one exec per node.
	endpointsFresh = 3 * time.Second
	// maxEndpointList bounds one node's `rampart endpoint list -o json`: some hundred
	// bytes an endpoint, far more than a node's pods.
	maxEndpointList = 64 << 20
)

type endpointCache struct {
	mu   sync.Mutex
	at   time.Time
	list []api.Endpoint
}

// ListEndpoints lists every node's endpoints (each agent's `rampart endpoint list`),
// sorted by namespace and name; a node that fails is left out (and told to Warn), an
// error only if every node failed.
func (c *Cluster) ListEndpoints(ctx context.Context) ([]api.Endpoint, error) {
	c.endpoints.mu.Lock()
	defer c.endpoints.mu.Unlock()
	if time.Since(c.endpoints.at) < endpointsFresh {
		return c.endpoints.list, nil
	}
	agents, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		all      []api.Endpoint
		failures int
	)
	for _, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			eps, err := c.nodeEndpoints(ctx, a)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures++
				c.Warn(nodeError(a, err))
				return
			}
			all = append(all, eps...)
		}()
	}
	wg.Wait()
	if failures == len(agents) {
		return nil, errors.New("listing endpoints: no agent answered")
	}
	slices.SortFunc(all, func(a, b api.Endpoint) int { return strings.Compare(a.Key(), b.Key()) })
	c.endpoints.at, c.endpoints.list = time.Now(), all
	return all, nil
}

func (c *Cluster) nodeEndpoints(ctx context.Context, a Agent) ([]api.Endpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out := limitedBuffer{max: maxEndpointList}
	var errOut tailBuffer
	if err := c.Exec(ctx, a, []string{"rampart", "endpoint", "list", "-o", "json"}, &out, &errOut); err != nil {
		if msg := strings.TrimSpace(errOut.String()); msg != "" {
			return nil, fmt.Errorf("listing endpoints: %w: %s", err, msg)
		}
		return nil, fmt.Errorf("listing endpoints: %w", err)
	}
	var eps []api.Endpoint
	if err := json.Unmarshal(out.Bytes(), &eps); err != nil {
		return nil, fmt.Errorf("listing endpoints: %w", err)
	}
	return eps, nil
}

// ListRemoteEndpoints is empty: in the cluster's view every pod is some node's endpoint,
// which ListEndpoints lists.
func (c *Cluster) ListRemoteEndpoints(context.Context) ([]api.RemoteEndpoint, error) {
	return nil, nil
}

// limitedBuffer fails writes past max bytes.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, fmt.Errorf("output over %d bytes", b.max)
	}
	return b.Buffer.Write(p)
}
