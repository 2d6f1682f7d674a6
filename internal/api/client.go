package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// DefaultInstance is the instance rampartd runs, and the CLI talks to, unless told
// otherwise.
const DefaultInstance = "default"

// SocketDir holds the instances' default sockets.
const SocketDir = "/run/rampart"

var instanceRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$`)

// CheckInstance checks an instance name: 1-32 lowercase letters, digits or '-', starting
// and ending with a letter or digit. The name becomes part of paths and of network
// namespace names, so nothing else (no '/', no "..") may pass.
func CheckInstance(name string) error {
	if !instanceRE.MatchString(name) {
		return fmt.Errorf("instance name %q: want 1-32 lowercase letters, digits or '-'", name)
	}
	return nil
}

// SocketFor returns the default API socket of an instance: <SocketDir>/<instance>.sock,
// so that agents of different instances on one host never share one.
func SocketFor(instance string) string {
	return filepath.Join(SocketDir, instance+".sock")
}

// Client talks to an agent over its Unix socket.
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client for the agent listening at socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}
	return &Client{socket: socket, http: &http.Client{Transport: tr}}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.send(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding agent response: %w", err)
	}
	return nil
}

func (c *Client) send(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("encoding request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://rampart"+path, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return c.roundTrip(req)
}

// roundTrip sends req and turns a non-2xx answer into an *Error.
func (c *Client) roundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("talking to the agent at %s (is rampartd running?): %w", c.socket, unwrapURL(err))
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		e := &Error{Status: resp.StatusCode}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, e) != nil || e.Message == "" {
			e.Message = fmt.Sprintf("agent answered %s: %s", resp.Status, bytes.TrimSpace(b))
		}
		return nil, e
	}
	return resp, nil
}

func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func esc(s string) string { return url.PathEscape(s) }

// Status returns the agent's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	return s, c.do(ctx, "GET", "/v1/status", nil, &s)
}

// WaitMonitorReading waits until the agent no longer shows monitor key ("ns/name") down,
// within ctx: after starting a monitor's reader (Suricata), so that what is sent after
// it is delivered to the monitor rather than counted lost. Reading the status makes the
// agent check its monitors at once.
func (c *Client) WaitMonitorReading(ctx context.Context, key string) error {
	for {
		st, err := c.Status(ctx)
		if err != nil {
			return fmt.Errorf("waiting for the agent to see monitor %s read: %w", key, err)
		}
		down := ""
		if st.Monitors != nil {
			for _, d := range st.Monitors.Down {
				if strings.HasPrefix(d, key+": ") {
					down = d
				}
			}
		}
		if down == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the agent still shows monitor %s down: %w", down, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ReportMonitor sends what monitor run read from the EVE file of monitor
// namespace/name since it started.
func (c *Client) ReportMonitor(ctx context.Context, namespace, name string, report MonitorReport) error {
	return c.do(ctx, "PUT", "/v1/endpoints/"+esc(namespace)+"/"+esc(name)+"/monitor-report", report, nil)
}

// ListEndpoints lists endpoints.
func (c *Client) ListEndpoints(ctx context.Context) ([]Endpoint, error) {
	var v []Endpoint
	return v, c.do(ctx, "GET", "/v1/endpoints", nil, &v)
}

// GetEndpoint returns one endpoint with its counters.
func (c *Client) GetEndpoint(ctx context.Context, namespace, name string) (Endpoint, error) {
	var v Endpoint
	return v, c.do(ctx, "GET", "/v1/endpoints/"+esc(namespace)+"/"+esc(name), nil, &v)
}

// AddEndpoint creates an endpoint.
func (c *Client) AddEndpoint(ctx context.Context, spec EndpointSpec) (Endpoint, error) {
	var v Endpoint
	return v, c.do(ctx, "POST", "/v1/endpoints", spec, &v)
}

// DeleteEndpoint deletes an endpoint.
func (c *Client) DeleteEndpoint(ctx context.Context, namespace, name string) error {
	return c.do(ctx, "DELETE", "/v1/endpoints/"+esc(namespace)+"/"+esc(name), nil, nil)
}

// LabelEndpoint changes an endpoint's labels.
func (c *Client) LabelEndpoint(ctx context.Context, namespace, name string, change LabelChange) (Endpoint, error) {
	var v Endpoint
	return v, c.do(ctx, "POST", "/v1/endpoints/"+esc(namespace)+"/"+esc(name)+"/labels", change, &v)
}

// ListNamespaces lists namespaces.
func (c *Client) ListNamespaces(ctx context.Context) ([]Namespace, error) {
	var v []Namespace
	return v, c.do(ctx, "GET", "/v1/namespaces", nil, &v)
}

// AuditEndpoint puts an endpoint in audit mode or takes it out.
func (c *Client) AuditEndpoint(ctx context.Context, namespace, name string, mode AuditMode) (Endpoint, error) {
	var v Endpoint
	return v, c.do(ctx, "PUT", "/v1/endpoints/"+esc(namespace)+"/"+esc(name)+"/audit", mode, &v)
}

// LabelNamespace changes a namespace's labels, creating the namespace if needed.
func (c *Client) LabelNamespace(ctx context.Context, namespace string, change LabelChange) (Namespace, error) {
	var v Namespace
	return v, c.do(ctx, "POST", "/v1/namespaces/"+esc(namespace)+"/labels", change, &v)
}

// ListIdentities lists reserved and allocated identities.
func (c *Client) ListIdentities(ctx context.Context) ([]Identity, error) {
	var v []Identity
	return v, c.do(ctx, "GET", "/v1/identities", nil, &v)
}

// ListPolicies lists stored policies.
func (c *Client) ListPolicies(ctx context.Context) ([]Policy, error) {
	var v []Policy
	return v, c.do(ctx, "GET", "/v1/policies", nil, &v)
}

// Apply applies policies from manifests, all or none.
func (c *Client) Apply(ctx context.Context, req ApplyRequest) (ChangeResult, error) {
	var v ChangeResult
	return v, c.do(ctx, "POST", "/v1/policies/apply", req, &v)
}

// ListTaps lists the tap contracts with their state and counters.
func (c *Client) ListTaps(ctx context.Context) ([]Tap, error) {
	var v []Tap
	return v, c.do(ctx, "GET", "/v1/taps", nil, &v)
}

// GetTap shows one tap contract.
func (c *Client) GetTap(ctx context.Context, name string) (Tap, error) {
	var v Tap
	return v, c.do(ctx, "GET", "/v1/taps/"+esc(name), nil, &v)
}

// AddTaps creates or replaces the tap contracts of the documents, all or none.
func (c *Client) AddTaps(ctx context.Context, req ApplyRequest) (ChangeResult, error) {
	var v ChangeResult
	return v, c.do(ctx, "POST", "/v1/taps", req, &v)
}

// DeleteTap deletes a tap contract.
func (c *Client) DeleteTap(ctx context.Context, name string) (ChangeResult, error) {
	var v ChangeResult
	return v, c.do(ctx, "DELETE", "/v1/taps/"+esc(name), nil, &v)
}

// ApplyTapPolicy makes a tap policy the agent's.
func (c *Client) ApplyTapPolicy(ctx context.Context, req TapPolicyRequest) (ChangeResult, error) {
	var v ChangeResult
	return v, c.do(ctx, "PUT", "/v1/tappolicy", req, &v)
}

// GetTapPolicy shows the tap policy and the contracts it yields.
func (c *Client) GetTapPolicy(ctx context.Context) (TapPolicy, error) {
	var v TapPolicy
	return v, c.do(ctx, "GET", "/v1/tappolicy", nil, &v)
}

// DeleteTapPolicy removes the tap policy and its contracts.
func (c *Client) DeleteTapPolicy(ctx context.Context) (ChangeResult, error) {
	var v ChangeResult
	return v, c.do(ctx, "DELETE", "/v1/tappolicy", nil, &v)
}

// CompileTapPolicy compiles a tap policy against the agent's facts, applying nothing.
func (c *Client) CompileTapPolicy(ctx context.Context, req TapPolicyRequest) (TapPolicy, error) {
	var v TapPolicy
	return v, c.do(ctx, "POST", "/v1/tappolicy/compile", req, &v)
}

// Delete deletes the policies the manifests name, all or none.
func (c *Client) Delete(ctx context.Context, req DeleteRequest) (ChangeResult, error) {
	var v ChangeResult
	return v, c.do(ctx, "POST", "/v1/policies/delete", req, &v)
}

// Trace explains the verdict for a new connection.
func (c *Client) Trace(ctx context.Context, req TraceRequest) (TraceResult, error) {
	var v TraceResult
	return v, c.do(ctx, "POST", "/v1/trace", req, &v)
}

// Observe calls fn for each flow the agent streams, until the stream ends (history only),
// ctx ends (follow) or fn returns an error.
func (c *Client) Observe(ctx context.Context, req ObserveRequest, fn func(Flow) error) error {
	resp, err := c.send(ctx, "POST", "/v1/observe", req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var probe struct {
			Error *string `json:"error"`
		}
		if json.Unmarshal(line, &probe) == nil && probe.Error != nil {
			return &Error{Status: http.StatusInternalServerError, Message: *probe.Error}
		}
		var f Flow
		if err := json.Unmarshal(line, &f); err != nil {
			return fmt.Errorf("decoding flow: %w", err)
		}
		if err := fn(f); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("reading flows: %w", err)
	}
	return nil
}

// ListCIDRSets lists the CIDR sets.
func (c *Client) ListCIDRSets(ctx context.Context) ([]CIDRSet, error) {
	var v []CIDRSet
	return v, c.do(ctx, "GET", "/v1/cidrsets", nil, &v)
}

// GetCIDRSet describes one CIDR set.
func (c *Client) GetCIDRSet(ctx context.Context, name string) (CIDRSet, error) {
	var v CIDRSet
	return v, c.do(ctx, "GET", "/v1/cidrsets/"+esc(name), nil, &v)
}

// LoadCIDRSet creates or replaces a CIDR set.
func (c *Client) LoadCIDRSet(ctx context.Context, req CIDRSetRequest) (CIDRSetChange, error) {
	return c.prefixes(ctx, "PUT", "/v1/cidrsets/"+esc(req.Name), req)
}

// AddCIDRs adds prefixes to a CIDR set in place.
func (c *Client) AddCIDRs(ctx context.Context, req CIDRSetRequest) (CIDRSetChange, error) {
	return c.prefixes(ctx, "POST", "/v1/cidrsets/"+esc(req.Name)+"/add", req)
}

// RemoveCIDRs removes prefixes from a CIDR set in place.
func (c *Client) RemoveCIDRs(ctx context.Context, req CIDRSetRequest) (CIDRSetChange, error) {
	return c.prefixes(ctx, "POST", "/v1/cidrsets/"+esc(req.Name)+"/remove", req)
}

// DeleteCIDRSet deletes a CIDR set (one that policies name only with force).
func (c *Client) DeleteCIDRSet(ctx context.Context, name string, force bool) (CIDRSetChange, error) {
	var v CIDRSetChange
	path := "/v1/cidrsets/" + esc(name)
	if force {
		path += "?force=true"
	}
	return v, c.do(ctx, "DELETE", path, nil, &v)
}

// prefixes sends req's prefixes in their wire form, streamed as they are encoded.
func (c *Client) prefixes(ctx context.Context, method, path string, req CIDRSetRequest) (CIDRSetChange, error) {
	var v CIDRSetChange
	if req.Source != "" {
		path += "?source=" + url.QueryEscape(req.Source)
	}
	pr, pw := io.Pipe()
	go func() { _, err := req.Prefixes.WriteTo(pw); pw.CloseWithError(err) }()
	defer pr.Close()
	hreq, err := http.NewRequestWithContext(ctx, method, "http://rampart"+path, pr)
	if err != nil {
		return v, err
	}
	hreq.ContentLength = req.Prefixes.EncodedSize()
	hreq.Header.Set("Content-Type", PrefixContentType)
	resp, err := c.roundTrip(hreq)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return v, fmt.Errorf("decoding agent response: %w", err)
	}
	return v, nil
}

// CNIAdd makes an endpoint in a runtime's network namespace.
func (c *Client) CNIAdd(ctx context.Context, req CNIAddRequest) (CNIResult, error) {
	var out CNIResult
	return out, c.do(ctx, "POST", "/v1/cni/add", req, &out)
}

// CNIDel deletes an attachment's endpoint; one the agent does not have is no error.
func (c *Client) CNIDel(ctx context.Context, req CNIAttachment) error {
	return c.do(ctx, "POST", "/v1/cni/del", req, nil)
}

// CNICheck checks an attachment's endpoint against what the agent recorded.
func (c *Client) CNICheck(ctx context.Context, req CNICheckRequest) (CNIResult, error) {
	var out CNIResult
	return out, c.do(ctx, "POST", "/v1/cni/check", req, &out)
}

// CNIGC deletes the endpoints of CNI attachments not in req.Valid.
func (c *Client) CNIGC(ctx context.Context, req CNIGCRequest) (CNIGCResult, error) {
	var out CNIGCResult
	return out, c.do(ctx, "POST", "/v1/cni/gc", req, &out)
}

// ListNodes lists the other nodes the agent knows.
func (c *Client) ListNodes(ctx context.Context) ([]Node, error) {
	var v []Node
	return v, c.do(ctx, "GET", "/v1/nodes", nil, &v)
}

// PutNode declares or changes another node.
func (c *Client) PutNode(ctx context.Context, name string, spec NodeSpec) (Node, error) {
	var v Node
	return v, c.do(ctx, "PUT", "/v1/nodes/"+esc(name), spec, &v)
}

// DeleteNode removes another node and its remote endpoints.
func (c *Client) DeleteNode(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/nodes/"+esc(name), nil, nil)
}

// ListRemoteEndpoints lists the pods on other nodes the agent knows.
func (c *Client) ListRemoteEndpoints(ctx context.Context) ([]RemoteEndpoint, error) {
	var v []RemoteEndpoint
	return v, c.do(ctx, "GET", "/v1/remote-endpoints", nil, &v)
}

// PutRemoteEndpoint declares or changes a pod on another node.
func (c *Client) PutRemoteEndpoint(ctx context.Context, namespace, name string, spec RemoteEndpointSpec) (RemoteEndpoint, error) {
	var v RemoteEndpoint
	return v, c.do(ctx, "PUT", "/v1/remote-endpoints/"+esc(namespace)+"/"+esc(name), spec, &v)
}

// DeleteRemoteEndpoint removes a pod on another node.
func (c *Client) DeleteRemoteEndpoint(ctx context.Context, namespace, name string) error {
	return c.do(ctx, "DELETE", "/v1/remote-endpoints/"+esc(namespace)+"/"+esc(name), nil, nil)
}

// ListServices lists the Services the agent translates.
func (c *Client) ListServices(ctx context.Context) ([]ServiceEntry, error) {
	var v []ServiceEntry
	return v, c.do(ctx, "GET", "/v1/services", nil, &v)
}

// PutService declares or changes a Service.
func (c *Client) PutService(ctx context.Context, namespace, name string, spec ServiceSpec) (ServiceEntry, error) {
	var v ServiceEntry
	return v, c.do(ctx, "PUT", "/v1/services/"+esc(namespace)+"/"+esc(name), spec, &v)
}

// DeleteService removes a Service.
func (c *Client) DeleteService(ctx context.Context, namespace, name string) error {
	return c.do(ctx, "DELETE", "/v1/services/"+esc(namespace)+"/"+esc(name), nil, nil)
}

var _ Service = (*Client)(nil)
