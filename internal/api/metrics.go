package api

// Metrics are the agent's running counts that its status does not hold, for its Prometheus
// metrics (internal/metrics), which read them at each scrape. They are not served on the
// socket: the CLI has observe and status for the same facts.
type Metrics struct {
	// Flows count the dataplane's flow events the agent read, by their labels.
	Flows []FlowCount `json:"flows"`
	// L7 count the requests the L7 checks decided (the proxy, its fast path, the
	// send-side verdict), and L7Latency is their time from the first request byte to the
	// last response byte, in seconds.
	L7        []L7Count `json:"l7"`
	L7Latency Histogram `json:"l7Latency"`
	// Apply is the time of each move of the dataplane to a newly computed state (one per
	// transaction, and one per rollback), in seconds; ApplyFailures counts those that
	// failed.
	Apply         Histogram `json:"apply"`
	ApplyFailures uint64    `json:"applyFailures"`
	// Propagation is, in Kubernetes mode, the time from the watcher's first unapplied
	// change to the view holding it applied, in seconds.
	Propagation Histogram `json:"propagation"`
	// Endpoints are this node's endpoints, by key.
	Endpoints []EndpointMetrics `json:"endpoints"`
	// Monitors are the latest reports of `monitor run` of this node's monitor endpoints,
	// by key; a monitor that never reported has none.
	Monitors []MonitorMetrics `json:"monitors,omitempty"`
}

// FlowCount is how many flow events had these names (api.Flow's fields of the same names).
type FlowCount struct {
	Type      string `json:"type"`
	Verdict   string `json:"verdict"`
	Reason    string `json:"reason,omitempty"`
	Direction string `json:"direction,omitempty"`
	Protocol  string `json:"protocol"`
	Count     uint64 `json:"count"`
}

// L7Count is how many L7 requests had this verdict and reason (as their flows have them),
// decided by Checker: "proxy" (Envoy or the agent's fast path) or "send-side".
type L7Count struct {
	Verdict string `json:"verdict"`
	Reason  string `json:"reason,omitempty"`
	Checker string `json:"checker"`
	Count   uint64 `json:"count"`
}

// Histogram is a distribution of observations: Counts[i] observations were at most
// Bounds[i] (and above the bound before it), Counts[len(Bounds)] above every bound.
type Histogram struct {
	Bounds []float64 `json:"bounds"`
	Counts []uint64  `json:"counts"`
	Count  uint64    `json:"count"`
	Sum    float64   `json:"sum"`
}

// EndpointMetrics are one endpoint's policy map entries and dataplane counters (nil when
// they could not be read).
type EndpointMetrics struct {
	Endpoint      string    `json:"endpoint"` // namespace/name
	PolicyEntries int       `json:"policyEntries"`
	Counters      *Counters `json:"counters,omitempty"`
}
