package agent

import (
	"context"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/cidrtable"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/proxy"
	"github.com/rampartnet/rampart/internal/sockverdict"
)

// The agent's kernel edge is one small interface per concern, each satisfied directly by
// the kernel package that owns the concept; Kernel gathers them, and openKernel (kernel.go)
// wires the real ones. They are interfaces so that the agent's transactions can be tested
// without the kernel (fakes_test.go and its companions).

// Kernel is what the agent needs below it. Its interfaces are embedded so that the agent
// calls their methods directly (a.dp.Attach, a.dp.ReplaceCIDRSets...).
type Kernel struct {
	EndpointTables // *datapath.Datapath
	IPCache        // *datapath.Datapath
	ProxyRouting   // *datapath.Datapath
	FlowEvents     // the datapath's event reader
	CIDRSets       // *cidrtable.Tables
	SendSide       // *sockverdict.Manager
	MapMemories    // *datapath.Datapath
	// Close releases the agent's handles; pinned maps and attached programs stay.
	Close func() error
}

// EndpointTables attach the tc programs to endpoints and hold each endpoint's info and
// policy (endpoints.go, agent.go).
type EndpointTables interface {
	// Attach loads (or replaces in place) the tc programs on the host-side veth ifname in
	// the network namespace at netnsPath and returns its ifindex.
	Attach(netnsPath, ifname string) (uint32, error)
	// ReleaseLinks forgets the programs of interface ifindex once the interface is deleted
	// (deleting it removed them).
	ReleaseLinks(ifindex uint32) error
	ApplyEndpoint(ifindex uint32, info datapath.EndpointInfo, pol mapstate.EndpointPolicy) error
	RemoveEndpoint(ifindex, epID uint32) error
	// InstalledEndpoints returns the endpoints in the dataplane by ifindex, so a restarted
	// agent can remove the ones it no longer has (e.g. deleted while it crashed).
	InstalledEndpoints() map[uint32]datapath.InstalledEndpoint
	// Counters returns endpoint epID's counters; its host-side interface ifindex in the
	// node namespace netnsPath counts its forwarded packets.
	Counters(netnsPath string, ifindex, epID uint32) (datapath.Counters, error)
}

// IPCache is the dataplane's address -> identity table (agent.go, applyState).
type IPCache interface {
	// ApplyIPCache makes the ipcache equal to entries.
	ApplyIPCache(entries map[netip.Prefix]mapstate.IPCacheEntry) error
	// UpdateIPCache writes upsert's entries, then deletes remove's prefixes.
	UpdateIPCache(upsert map[netip.Prefix]mapstate.IPCacheEntry, remove []netip.Prefix) error
}

// ProxyRouting hands connections to the L7 proxy (agent.go, proxy.go).
type ProxyRouting interface {
	// SetupProxy prepares the node namespace at netnsPath for the L7 proxy and tells the
	// dataplane where the proxy's transparent listener is. Idempotent.
	SetupProxy(netnsPath string, listen netip.AddrPort) error
	// RouteToProxy makes the node namespace at netnsPath deliver locally the packets the
	// dataplane hands to the proxy (a policy route, which costs all forwarded traffic a
	// little, so the agent adds it only once L7 rules are in force). Idempotent.
	RouteToProxy(netnsPath string) error
}

// FlowEvents are the dataplane's flow events (flows.go).
type FlowEvents interface {
	// Read blocks until the next flow event; it fails once the Kernel was closed.
	Read() (flow.Event, error)
	// Drained counts the times Read found no event waiting (it looks at least
	// every datapath.EventPoll): once it has grown by two, every event written before has
	// been read.
	Drained() uint64
}

// CIDRSets are the CIDR set tables (cidrsets.go).
type CIDRSets interface {
	// ReplaceCIDRSets makes the tables hold exactly sets (index -> prefixes; sets absent are
	// emptied): the new tables are built aside and switched to at once.
	ReplaceCIDRSets(sets map[uint8][]netip.Prefix) (cidrtable.Stats, error)
	// AddCIDRs and RemoveCIDRs change one set in the live tables. Adding never unlists
	// anything; removing clears the set's bit for every address of the prefixes.
	AddCIDRs(index uint8, prefixes []netip.Prefix) error
	RemoveCIDRs(index uint8, prefixes []netip.Prefix) error
	// CIDRSetMembership returns the set mask the dataplane computes for addr.
	CIDRSetMembership(addr netip.Addr) (uint32, error)
}

// SendSide is the send-side L7 verdict (sendside.go, namespaces.go, memory.go).
type SendSide interface {
	// ApplySockPairs makes the pairs whose L7 rules the verdict checks exactly the listed
	// ones of pairs (nil: none; their new connections go to the proxy again).
	ApplySockPairs(pairs []SockPair) error
	// ReadSockRequest blocks until the verdict reports a request, as an access log record;
	// it fails once the Kernel was closed.
	ReadSockRequest() (flow.AccessLog, error)
	// SockStatus returns the verdict's pairs and counters (zero counters while it is not
	// loaded).
	SockStatus() (sockverdict.Status, error)
	// Programs returns the verdict's programs while it is loaded (for MapMemory).
	Programs() []*ebpf.Program
}

// MapMemories report the memory of the dataplane's maps (memory.go).
type MapMemories interface {
	// MapMemory returns the memory of the dataplane's maps, by name, with those that the
	// programs extra use without pinning them.
	MapMemory(extra ...*ebpf.Program) ([]datapath.MapUsage, error)
}

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
}

var _ Network = endpoint.Node{}

// TracePeer is one side of a traced connection.
type TracePeer struct {
	Endpoint *mapstate.Endpoint // nil when the address is not a managed endpoint
	IP       netip.Addr
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
}
