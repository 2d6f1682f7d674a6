package mapstate

import (
	"net/netip"

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
	ID         uint32 // ep_id in the dataplane
	Namespace  string
	Name       string
	Labels     labels.Labels // full label set (see docs/architecture.md)
	Identity   identity.Identity
	IP         netip.Addr
	NamedPorts map[string]NamedPort
}

// Input is everything the desired state depends on. Compute is a pure function of it.
type Input struct {
	Endpoints []Endpoint
	Rules     []policy.Rule // rule IDs filled in
	HostIPs   []netip.Addr  // addresses with the host identity
	// CIDRIdentities gives the identity of every prefix that Prefixes(Rules) returns.
	CIDRIdentities map[netip.Prefix]identity.Identity
	// RulePolicies names the policy each rule (by Rule.ID) came from, so Trace can say which
	// policy decided. Optional; Compute ignores it.
	RulePolicies map[uint32]PolicyRef
}

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
}

// EndpointPolicy is the desired policy state of one endpoint.
type EndpointPolicy struct {
	EnforceIngress bool
	EnforceEgress  bool
	Entries        map[Key]Value
}

// IPCacheEntry is the desired value for one ipcache prefix.
type IPCacheEntry struct {
	Identity identity.Identity
	// Secondary is, for endpoint and host addresses, EndpointCIDRFlag | the CIDR identity of
	// the longest policy prefix containing the address (0 when none does).
	Secondary identity.Identity
}

// State is the whole desired dataplane state.
type State struct {
	Endpoints map[uint32]EndpointPolicy // by endpoint ID
	IPCache   map[netip.Prefix]IPCacheEntry
}
