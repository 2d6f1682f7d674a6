package mapstate

import (
	"net/netip"

	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
)

// NamedPort is a port an endpoint declares by name (--port http=80/TCP).
type NamedPort struct {
	Port     uint16
	Protocol policy.Protocol
}

// Endpoint is what the computation needs to know of one endpoint.
type Endpoint struct {
	ID uint32 // ep_id in the dataplane
	// Host marks the node's own endpoint (HostEndpointID, identity.Host, the node's labels):
	// only host policy rules (policy.Rule.Host) apply to it, and it is no peer of its own
	// (the host identity is a reserved one, its addresses are Input.HostIPs).
	Host       bool
	Namespace  string
	Name       string
	Labels     labels.Labels // full label set (see docs/architecture.md)
	Identity   identity.Identity
	IP         netip.Addr
	NamedPorts map[string]NamedPort
	// IP6 is a dual-stack endpoint's IPv6 address (zero: none): the ipcache maps it, a
	// /128, to the identity and ep_id its IPv4 address has.
	IP6 netip.Addr
	// Audit puts the endpoint in audit mode: every rule that applies to it counts as in
	// audit mode (policy.Rule.Audit) there, so it enforces nothing and reports what its
	// policies would drop.
	Audit bool
}

// RemoteEndpoint is a pod on another node: policy selects it by its labels like a local
// endpoint, and the ipcache maps its address to its identity and to the address of the
// node that hosts it (the tunnel endpoint). It has no policy of its own here; its named
// ports are what an egress rule naming a port resolves against when it is the peer.
type RemoteEndpoint struct {
	Namespace  string
	Name       string
	Labels     labels.Labels // full label set, as a local endpoint's
	Identity   identity.Identity
	IP         netip.Addr
	Node       netip.Addr // the hosting node's address
	NamedPorts map[string]NamedPort
	// IP6 is its IPv6 address (zero: none, or not carried between nodes): the ipcache
	// maps it, a /128, to the identity and tunnel endpoint its IPv4 address has.
	IP6 netip.Addr
}

// Input is everything the desired state depends on. Compute is a pure function of it.
type Input struct {
	Endpoints []Endpoint
	// Remote lists the pods on other nodes; NodeIPs the other nodes' addresses (identity
	// remote-node in the ipcache).
	Remote  []RemoteEndpoint
	NodeIPs []netip.Addr
	Rules   []policy.Rule // rule IDs filled in
	HostIPs []netip.Addr  // addresses with the host identity
	// AllowHost admits the host (identity.Host) into every endpoint that enforces ingress,
	// whatever its allow rules say (rampartd --host-traffic=allow, as Kubernetes expects
	// for the kubelet's probes): an allow entry for the host, any protocol, with rule ID
	// HostTrafficRuleID. Deny rules that match the host still win, and L7 rules of a port
	// still apply to it (see docs/policy-language.md). False: the host is an ordinary peer.
	AllowHost bool
	// CIDRIdentities gives the identity of every prefix that Prefixes(Rules) returns.
	CIDRIdentities map[netip.Prefix]identity.Identity
	// RulePolicies names the policy each rule (by Rule.ID) came from, so Trace can say which
	// policy decided. Optional; Compute ignores it.
	RulePolicies map[uint32]PolicyRef
	// CIDRSets maps the names of the CIDR sets that exist (CIDR groups) to their dataplane
	// index, 0..MaxCIDRSets-1. A cidrGroupRef peer selects identity.CIDRSet(index); a peer
	// naming a set absent here selects nothing (MissingCIDRGroups lists such names).
	CIDRSets map[string]uint8
	// CIDRSetMembership returns the set mask of an address as the dataplane computes it
	// (bit i: the address is inside some prefix of set i). Optional (nil: no address is in
	// any set); Trace uses it, Compute ignores it.
	CIDRSetMembership func(netip.Addr) uint32
}

// HostEndpointID is the host endpoint's ep_id: the last one the dataplane has
// (RAMPART_MAX_ENDPOINTS - 1), never given to a pod.
const HostEndpointID uint32 = 4095

// HostEndpointName is the host endpoint's name in flows and traces (its namespace is "").
const HostEndpointName = "host"

// HostSafeRuleID is the rule ID the dataplane reports for a flow of the host endpoint that
// host policy never cuts (the API server connection, rampartd's host-safe flows); no
// policy rule may have it.
const HostSafeRuleID uint32 = 1<<32 - 2

// HostSafeDescription describes the HostSafeRuleID verdict, for explanations.
const HostSafeDescription = "always allowed by the agent: the API server connection of a node with host policy"

// HostTrafficRuleID is the rule ID of the entry that Input.AllowHost adds; no policy rule
// may have it (Check).
const HostTrafficRuleID uint32 = 1<<32 - 1

// HostTrafficDescription describes the HostTrafficRuleID entry, for explanations.
const HostTrafficDescription = "host traffic allowed by the agent (--host-traffic=allow)"

// MaxCIDRSets is the number of CIDR sets the dataplane has (one bit each in a u32 mask).
const MaxCIDRSets = identity.MaxCIDRSets

// PolicyRef names a policy (see policy.Policy.Key).
type PolicyRef struct {
	Kind      policy.Kind `json:"kind"`
	Namespace string      `json:"namespace,omitempty"`
	Name      string      `json:"name"`
}

// Key is one policy map entry of one endpoint. Protocol ProtoAny matches every protocol and
// port (PortPrefixLen must be 0). Otherwise the entry matches ports whose first
// PortPrefixLen bits equal Port's (0: any port, 16: exactly Port).
type Key struct {
	// Admin: an Admin tier entry (ClusterNetworkPolicy), looked up in a round of its own
	// before the others (see Lookup).
	Admin         bool
	Identity      identity.Identity // identity.Any for every peer
	Direction     policy.Direction
	Protocol      policy.Protocol
	Port          uint16
	PortPrefixLen uint8
}

// Value is what a Key maps to.
type Value struct {
	Deny   bool
	RuleID uint32 // the rule that produced the entry (lowest ID when several did)
	// Redirect: allowed only through the L7 proxy, which applies the endpoint's L7Rules for
	// this direction and port. Deny still wins over Redirect; Redirect wins over a plain
	// allow of the same traffic (the plain allow becomes an allow-all L7 rule for its peers).
	Redirect bool
	// DNS (with Redirect): the proxy is the DNS proxy, which applies the endpoint's
	// DNSRules for this protocol and port (State.DNS); else the HTTP proxy.
	DNS bool
	// Pass: a ClusterNetworkPolicy Pass: no decision in this tier (never with Deny or
	// Redirect).
	Pass bool
	// Prec orders the entries one packet's lookups find: the lower wins, then the higher
	// action (deny > redirect > allow > pass). 0 for NetworkPolicy-tier entries;
	// ClusterNetworkPolicy entries carry 1 + their rule's place in its tier's order.
	Prec uint16
}

// DNSRule is what the DNS proxy enforces for one endpoint's egress queries to one port and
// protocol (UDP or TCP): a query to a server with one of Peers' identities passes if one
// of Selectors matches its name. Peers containing identity.Any means every server.
type DNSRule struct {
	EndpointID uint32
	Protocol   policy.Protocol
	Port       uint16
	Peers      []identity.Identity
	Selectors  []fqdn.Selector
	RuleID     uint32
}

// L7Rule is what the proxy enforces for one endpoint, direction and TCP port: a request
// from (ingress) or to (egress) a peer with one of Peers' identities passes if it matches
// one of HTTP (an empty HTTPRule matches everything). Peers containing identity.Any means
// every peer.
type L7Rule struct {
	EndpointID uint32
	Direction  policy.Direction
	Port       uint16
	Peers      []identity.Identity
	HTTP       []policy.HTTPRule
	RuleID     uint32
}

// EndpointPolicy is the desired policy state of one endpoint.
type EndpointPolicy struct {
	EnforceIngress bool
	EnforceEgress  bool
	// DNSObserve: the endpoint's egress DNS queries that policy allows go through the DNS
	// proxy, which forwards every name and learns the answers, because a
	// ClusterNetworkPolicy domainNames peer selects what it learns.
	DNSObserve bool
	Entries    map[Key]Value
	// Audit is, for an endpoint that a rule in audit mode (policy.Rule.Audit) applies to,
	// the policy it would have with those rules enforced too (nil: no such rule). The
	// fields above never depend on audited rules; the dataplane looks a new flow up in
	// Audit too, and reports one that Audit would drop and the policy above forwards as
	// audited (it forwards it).
	Audit *EndpointPolicy
}

// IPCacheEntry is the desired value for one ipcache prefix.
type IPCacheEntry struct {
	Identity identity.Identity
	// Secondary is, for endpoint and host addresses, EndpointCIDRFlag | the CIDR identity of
	// the longest policy prefix containing the address (0 when none does).
	Secondary identity.Identity
	// EndpointID is, for a local endpoint's /32, its ep_id (else 0): the dataplane evaluates
	// that endpoint's ingress policy at the sender's veth to decide L7 steering.
	EndpointID uint32
	// TunnelEndpoint is, for a remote pod's address, the address of the node that hosts it
	// (where the overlay sends its packets); the zero Addr for everything else.
	TunnelEndpoint netip.Addr
}

// State is the whole desired dataplane state.
type State struct {
	Endpoints map[uint32]EndpointPolicy // by endpoint ID
	IPCache   map[netip.Prefix]IPCacheEntry
	// L7 lists the proxy's rules, sorted by endpoint, direction, port, rule ID.
	L7 []L7Rule
	// DNS lists the DNS proxy's rules, sorted by endpoint, protocol, port, rule ID.
	DNS []DNSRule
}
