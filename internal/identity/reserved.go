package identity

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

// IsCIDR reports whether id (without the endpoint flag) is a CIDR identity.
func IsCIDR(id Identity) bool { return id&^EndpointCIDRFlag >= FirstCIDR }
