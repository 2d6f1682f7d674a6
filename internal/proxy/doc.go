// Package proxy runs the L7 proxy: Envoy, supervised by the agent and configured over xDS,
// and the agent's own fast path for plain HTTP/1.1.
//
// BuildResources turns an L7 plan (internal/l7plan: which filter chains the proxy's
// transparent listener needs and what each one lets through) into Envoy listeners and
// routes. A Manager serves them over ADS on a Unix socket, starts Envoy in the node network
// namespace and restarts it when it dies, waits for Envoy to apply each configuration
// before the agent lets the dataplane steer traffic to it, and turns Envoy's access logs
// into flow.AccessLog records. The fast path checks requests against the same plan.
//
// See docs/architecture.md ("L7 path") for how connections reach and leave the proxy.
package proxy
