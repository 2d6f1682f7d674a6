package flow

import (
	"net/netip"
	"time"

	"github.com/rampartnet/rampart/internal/policy"
)

// AccessLog is one request an L7 check decided on: the proxy (Envoy or its fast path) or
// the kernel's send-side verdict. The agent turns it into an L7 flow.
type AccessLog struct {
	Time     time.Time
	Chain    string         // the filter chain (route) that handled it; "" if none did
	Src      netip.AddrPort // the client (the connection's own remote address)
	Dst      netip.AddrPort // the original destination
	Protocol string         // HTTP/1.0, HTTP/1.1, HTTP/2
	Method   string
	Path     string
	Host     string
	Status   uint32        // HTTP status sent to the client (0: none, e.g. reset)
	Latency  time.Duration // from the first request byte to the last response byte
	// Denied: an RBAC filter refused the request (403, or PERMISSION_DENIED for gRPC).
	Denied bool
	// Egress and Ingress are the decisions of the source endpoint's egress and the
	// destination endpoint's ingress checks, when the chain has them and they ran.
	Egress, Ingress *Decision
	// Details is Envoy's response code detail (e.g. "via_upstream",
	// "rbac_access_denied_matched_policy[none]", "http1.codec_error").
	Details string
	// Upstream is false when no response came from the server (local reply, error).
	Upstream bool
}

// Decision is one side's L7 verdict on a request.
type Decision struct {
	EndpointID uint32
	Direction  policy.Direction
	Allowed    bool
	Grant      string // the grant that matched (l7plan.GrantL3L4 or rule-<id>-<n>); "" when denied
	RuleID     uint32 // the policy rule behind Grant (0: l3l4 or denied)
}
