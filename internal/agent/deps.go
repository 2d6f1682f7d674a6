package agent

import (
	"context"
	"net/netip"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/proxy"
	"github.com/rampartnet/rampart/internal/sockverdict"
)

// SockPair is a pair of local endpoints with L7 rules and what the send-side verdict
// (Config.L7SendSide) does with it.
type SockPair = sockverdict.Pair

// Reasons of L7 flows (api.Flow type l7), decided by the agent from the proxy's records,
// not codes of the dataplane (those are flow.Reason's).
const (
	ReasonL7Denied = "l7-denied" // the proxy refused the request (no L7 rule matches)
	ReasonL7Error  = "l7-error"  // the proxy answered itself: malformed request, upstream failure...
)

// Proxy is the L7 proxy (proxy.Manager), an interface so that the agent can be tested
// without Envoy.
type Proxy interface {
	// Start starts Envoy (once); it gets its configuration when it connects.
	Start()
	// Update makes the proxy enforce plan (which must not change afterwards); it returns
	// once a running Envoy applied it.
	Update(ctx context.Context, plan *l7plan.Plan) error
	Status() proxy.Status
	// Close stops Envoy and the control plane.
	Close() error
}

// Network creates and finds endpoint namespaces and veths (endpoint.Node).
type Network interface {
	Setup() error
	Teardown() error
	NetnsPath() string
	Router() netip.Addr
	EndpointNetns(namespace, name string) string
	// CreateAttached makes an endpoint and runs attach on its host-side veth before the
	// veth can carry a packet.
	CreateAttached(namespace, name string, ip netip.Addr, attach func(hostIfName string) error) (endpoint.Endpoint, error)
	Lookup(namespace, name string, ip netip.Addr) (endpoint.Endpoint, error)
	Delete(namespace, name string) error
	// CreateIn, LookupIn and DeleteLink are CreateAttached, Lookup and Delete for an
	// endpoint in a namespace a container runtime owns (CNI): they never create or delete
	// that namespace.
	CreateIn(namespace, name string, ip netip.Addr, at endpoint.Attachment, attach func(hostIfName string) error) (endpoint.Endpoint, error)
	LookupIn(namespace, name string, ip netip.Addr, at endpoint.Attachment) (endpoint.Endpoint, error)
	DeleteLink(namespace, name string) error
	// CreateMonitorLinks gives a monitor endpoint its receive and return veths (kept when
	// they exist), running attach on their host sides before they can carry a packet;
	// DeleteMonitorLinks deletes them (none is no error).
	CreateMonitorLinks(ep endpoint.Endpoint, attach func(rx, tx string) error) (endpoint.MonitorLinks, error)
	DeleteMonitorLinks(namespace, name string) error
	// SetMonitorInline prepares a monitor's receive veth for an inline monitor (complete
	// checksums, frames of the MTU) or for copies only.
	SetMonitorInline(namespace, name string, inline bool) error
	// MonitorReading reports whether a monitor (its namespace at netnsPath) reads its
	// receive interface (endpoint.MonitorReading).
	MonitorReading(netnsPath string) (bool, error)
	// Devices finds the node namespace's interfaces by name, or, with no names, those
	// holding the address holding (host policy's host devices).
	Devices(names []string, holding netip.Addr) ([]endpoint.Device, error)
}

var _ Network = endpoint.Node{}

// TracePeer is one side of a traced connection.
type TracePeer struct {
	Endpoint *mapstate.Endpoint // nil when the address is not a managed endpoint
	IP       netip.Addr
	// Node names the node of a pod on another node (a remote endpoint); "" otherwise.
	Node string
}

// TraceQuery asks how a new connection From -> To on Protocol/Port is decided.
type TraceQuery struct {
	From, To TracePeer
	Protocol policy.Protocol
	Port     uint16
}

// Engine is the pure policy pipeline. Fields left nil take the real implementations
// (policy.Parse, mapstate.Prefixes, mapstate.Compute, mapstate.Trace).
type Engine struct {
	Parse    func(source string, data []byte) (*policy.Documents, error)
	Prefixes func(rules []policy.Rule) []netip.Prefix
	Compute  func(in mapstate.Input) mapstate.State
	// computeWith is Compute with a memo of the previous computation
	// (mapstate.ComputeWith when Compute is the default).
	computeWith func(in mapstate.Input, memo *mapstate.Memo) (mapstate.State, *mapstate.Memo)
	// Trace explains a verdict from the same input and state the dataplane got. Rule
	// references in the result are filled by the agent from RuleID.
	Trace func(in mapstate.Input, st mapstate.State, q TraceQuery) (api.TraceResult, error)

	// allowHost is Config.HostTraffic == HostTrafficAllow (mapstate.Input.AllowHost), set
	// by New.
	allowHost bool
	// subsystems plug into every computation and apply, in this order (subsystem.go);
	// set by New.
	subsystems []subsystem
	// router6 is the node's IPv6 router address (podaddr.Router6) on a dual-stack node,
	// zero otherwise: with podaddr.RouterLinkLocal, a host address.
	router6 netip.Addr
	// tunnel is Config.Tunnel: where it carries IPv6 to a node (overlay.CarriesIPv6: VXLAN,
	// or native routing to a node with an IPv6 fabric address), the node's pods' IPv6
	// addresses are in the ipcache (remoteInput); elsewhere they are not, and have no
	// identity here.
	tunnel overlay.Mode
	// nodeAddr is this node's address in Kubernetes mode (invalid outside it): a frontend
	// of every NodePort Service with the other nodes' (services.go).
	nodeAddr netip.Addr
	// hostFirewall: the computation's input has the host endpoint (host.go), whose
	// address is hostAddr; hostAddrs are the host devices' addresses, host addresses
	// in the ipcache.
	hostFirewall bool
	hostAddr     netip.Addr
	hostAddrs    []netip.Addr
}
