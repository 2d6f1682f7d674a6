package identity

import "fmt"

// Identity is a security identity number. See docs/architecture.md for the ranges.
type Identity = uint32

// Reserved identities (Cilium's numbers). Any (0) in a policy key means every peer.
const (
	Any           Identity = 0
	Host          Identity = 1
	World         Identity = 2
	Unmanaged     Identity = 3
	Health        Identity = 4
	Init          Identity = 5
	RemoteNode    Identity = 6
	KubeAPIServer Identity = 7

	// FirstEndpoint is the first identity given to an endpoint label set.
	FirstEndpoint Identity = 256
	// FirstCIDR is the first identity given to a CIDR prefix.
	FirstCIDR Identity = 1 << 24
	// FirstCIDRSet is the identity of CIDR set 0; set i (0..MaxCIDRSets-1) has
	// FirstCIDRSet+i. These fixed numbers sit above every allocated CIDR identity (the
	// allocator stops below FirstCIDRSet) and below EndpointCIDRFlag; the dataplane looks
	// them up for a peer address in the set, so they are never flagged.
	FirstCIDRSet Identity = 0x7FFFFF00
	// MaxCIDRSets is the number of CIDR sets an agent can have (one bit each in the
	// dataplane's membership mask).
	MaxCIDRSets = 32
	// EndpointCIDRFlag marks a CIDR identity used as the secondary identity of an endpoint's
	// (or the host's) own address.
	EndpointCIDRFlag Identity = 0x80000000
)

// ReservedNames maps reserved identities to their names.
var ReservedNames = map[Identity]string{
	Host:          "reserved:host",
	World:         "reserved:world",
	Unmanaged:     "reserved:unmanaged",
	Health:        "reserved:health",
	Init:          "reserved:init",
	RemoteNode:    "reserved:remote-node",
	KubeAPIServer: "reserved:kube-apiserver",
}

// IsCIDR reports whether id (without the endpoint flag) is a CIDR identity of a prefix.
// CIDR set identities are not: they stand for a whole set (IsCIDRSet).
func IsCIDR(id Identity) bool {
	id &^= EndpointCIDRFlag
	return id >= FirstCIDR && id < FirstCIDRSet
}

// CIDRSet returns the identity of CIDR set i. It panics if i >= MaxCIDRSets (a caller bug:
// set indexes are assigned by the agent within that range).
func CIDRSet(i uint8) Identity {
	if i >= MaxCIDRSets {
		panic(fmt.Sprintf("identity: CIDR set index %d out of range 0..%d", i, MaxCIDRSets-1))
	}
	return FirstCIDRSet + Identity(i)
}

// IsCIDRSet reports whether id is a CIDR set identity, and which set.
func IsCIDRSet(id Identity) (uint8, bool) {
	if id >= FirstCIDRSet && id < FirstCIDRSet+MaxCIDRSets {
		return uint8(id - FirstCIDRSet), true
	}
	return 0, false
}
