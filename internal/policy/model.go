package policy

import (
	"net/netip"

	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/labels"
)

// Kind names the manifest kind a policy came from. The kind decides the namespace scoping of
// selectors and how default deny is switched on.
type Kind string

const (
	KindNetworkPolicy           Kind = "NetworkPolicy"                  // networking.k8s.io/v1
	KindCiliumNetworkPolicy     Kind = "CiliumNetworkPolicy"            // cilium.io/v2
	KindCiliumClusterwidePolicy Kind = "CiliumClusterwideNetworkPolicy" // cilium.io/v2
	// KindClusterNetworkPolicy is SIG Network's cluster-admin policy
	// (policy.networking.k8s.io/v1beta1, network-policy-api v0.3.0): cluster-scoped, in
	// the Admin or Baseline tier, with rules that Accept, Deny or Pass.
	KindClusterNetworkPolicy Kind = "ClusterNetworkPolicy"
	// KindCiliumCIDRGroup is not a policy: a named list of CIDRs (cilium.io/v2alpha1 or
	// v2) that policies reference with toCIDRSet/fromCIDRSet cidrGroupRef. Parse returns
	// it as a CIDRGroup.
	KindCiliumCIDRGroup Kind = "CiliumCIDRGroup"
)

// Direction is seen from the selected (subject) endpoint.
type Direction uint8

const (
	Ingress Direction = 1 // traffic arriving at the subject endpoint
	Egress  Direction = 2 // traffic leaving the subject endpoint
)

func (d Direction) String() string {
	switch d {
	case Ingress:
		return "ingress"
	case Egress:
		return "egress"
	}
	return "unknown"
}

// Protocol is an IP protocol number; ProtoAny (0) matches every protocol.
type Protocol uint8

const (
	ProtoAny    Protocol = 0
	ProtoICMP   Protocol = 1
	ProtoTCP    Protocol = 6
	ProtoUDP    Protocol = 17
	ProtoICMPv6 Protocol = 58
	ProtoSCTP   Protocol = 132
)

// Tier says where a rule stands in the evaluation order that ClusterNetworkPolicy defines:
// every Admin tier rule (by priority, then rule order) before the NetworkPolicy tier
// (NetworkPolicy and the Cilium policies, whose semantics are unchanged), and the Baseline
// tier only for traffic of endpoints that no policy of the NetworkPolicy tier isolates in
// that direction.
type Tier uint8

const (
	TierNetworkPolicy Tier = 0 // NetworkPolicy, CiliumNetworkPolicy, CiliumClusterwideNetworkPolicy
	TierAdmin         Tier = 1 // ClusterNetworkPolicy tier: Admin
	TierBaseline      Tier = 2 // ClusterNetworkPolicy tier: Baseline
)

func (t Tier) String() string {
	switch t {
	case TierAdmin:
		return "Admin"
	case TierBaseline:
		return "Baseline"
	}
	return "NetworkPolicy"
}

// MaxTierPriority is the largest ClusterNetworkPolicy priority (lower values come first).
const MaxTierPriority = 1000

// Policy is one parsed manifest document (one NetworkPolicy, or one Cilium policy with all
// of its spec/specs rules). Policies are identified by Kind, Namespace and Name.
type Policy struct {
	Kind      Kind
	Namespace string // "" for clusterwide policies
	Name      string
	Source    string // file (or "-") and document index it was read from, for messages
	Rules     []Rule
	Audit     bool // in audit mode (AuditAnnotation): so are all of Rules
	// Raw is the document as read, as compact JSON, kept so the agent can persist and
	// show it (and compare it byte for byte).
	// Parsing Raw again yields the same policy. (A Cilium JSON rule array is kept as the
	// equivalent CiliumNetworkPolicy with its rules under specs, so that its name, which
	// may come from the file name, survives.)
	Raw []byte
}

// Key identifies a policy across apply/delete.
func (p *Policy) Key() string { return string(p.Kind) + "/" + p.Namespace + "/" + p.Name }

// Rule is one direction of one policy rule, normalised from either manifest kind.
//
// Semantics:
//   - Subject selects the endpoints the rule applies to.
//   - If EnableDefaultDeny is true, every selected endpoint enforces policy in Direction
//     (traffic not allowed by some rule is dropped) even when Peers/Ports allow nothing.
//   - Peers empty and AllPeers false: the rule selects no peer (allows nothing; it may still
//     switch on default deny). AllPeers: any peer at all, including world.
//   - Ports empty: all protocols and ports. Otherwise the union of the listed ports.
//   - Deny: the traffic matched is dropped, and deny wins over any allow.
type Rule struct {
	// ID is unique within the agent's policy set; filled by the repository, not the parser.
	ID          uint32
	Index       int    // rule position inside the policy (ClusterNetworkPolicy: within its direction)
	Description string // human readable, e.g. "ingress[0]" or "specs[1].egressDeny[0]"
	Subject     labels.Selector
	// Host: Subject selects nodes by their labels (CiliumClusterwideNetworkPolicy
	// nodeSelector), and the rule applies to the traffic of the node itself (its host
	// endpoint), never to pods; other rules never apply to the host.
	Host      bool
	Direction Direction
	Deny      bool
	// Tier, Priority and Pass are ClusterNetworkPolicy's: a rule of the Admin or Baseline
	// tier decides for the traffic it matches unless a rule before it (a lower Priority,
	// or the same policy's earlier rule: Index) matched first. Accept is !Deny && !Pass;
	// Pass hands the traffic to the next tier. Such rules never set EnableDefaultDeny.
	// Rules of TierNetworkPolicy have Priority 0 and Pass false.
	Tier              Tier
	Priority          int32
	Pass              bool
	EnableDefaultDeny bool
	AllPeers          bool
	Peers             []Peer
	Ports             []PortRule
	// Audit: the rule's policy is in audit mode (AuditAnnotation): it changes no verdict;
	// the traffic it would drop is forwarded and reported as audited.
	Audit bool
}

// AuditAnnotation puts a policy in audit mode when it says "true": its rules are computed
// and looked up beside the enforced ones, but only reported, never enforced.
const AuditAnnotation = "policy.rampart.io/audit"

// PeerKind tells which field of Peer is set.
type PeerKind uint8

const (
	PeerEndpoints PeerKind = 1 // endpoints matching Selector (namespace scoping already folded in)
	PeerCIDR      PeerKind = 2 // addresses inside CIDR and outside every Except
	PeerEntity    PeerKind = 3 // a reserved entity
	// PeerCIDRGroup: addresses inside any prefix of the named CIDR group (a
	// CiliumCIDRGroup, or a set loaded with `rampart cidrset`). A group that does not exist
	// selects nothing until it is created, as in Cilium.
	PeerCIDRGroup PeerKind = 4
	// PeerFQDN: the addresses the node's DNS proxy learnt, from answers it allowed, for
	// names the selector matches (toFQDNs), while their TTL and grace last. Egress only.
	PeerFQDN PeerKind = 5
)

// Entity names, as written in fromEntities/toEntities.
const (
	EntityWorld         = "world"
	EntityHost          = "host"
	EntityCluster       = "cluster"
	EntityAll           = "all"
	EntityRemoteNode    = "remote-node"
	EntityHealth        = "health"
	EntityInit          = "init"
	EntityUnmanaged     = "unmanaged"
	EntityKubeAPIServer = "kube-apiserver"
	EntityIngress       = "ingress"
)

type Peer struct {
	Kind     PeerKind
	Selector labels.Selector // PeerEndpoints
	CIDR     netip.Prefix    // PeerCIDR (masked)
	Except   []netip.Prefix  // PeerCIDR (masked, each inside CIDR)
	Entity   string          // PeerEntity
	Group    string          // PeerCIDRGroup: the group's name (cidrGroupRef)
	FQDN     fqdn.Selector   // PeerFQDN
}

// CIDRGroup is a parsed CiliumCIDRGroup: a cluster-scoped, named list of prefixes.
type CIDRGroup struct {
	Name   string
	Source string         // file (or "-") and document index, for messages
	CIDRs  []netip.Prefix // masked, in manifest order (duplicates kept)
	// Raw is the document as read (JSON); parsing it again yields the same group.
	Raw []byte
}

// Key identifies a CIDR group across apply/delete, like Policy.Key.
func (g *CIDRGroup) Key() string { return string(KindCiliumCIDRGroup) + "//" + g.Name }

// PortRule is one entry of ports/toPorts. Exactly one of Port (with optional EndPort) or
// Name is set, or neither (all ports of Protocol).
type PortRule struct {
	Protocol Protocol // ProtoAny means TCP, UDP and SCTP (Cilium "ANY"); K8s default is TCP
	Port     uint16   // 0 = all ports
	EndPort  uint16   // 0 = single port; else inclusive range Port..EndPort
	Name     string   // named port, resolved against endpoints' declared ports
	// ICMP: for ProtoICMP/ProtoICMPv6 rules from Cilium icmps, Port holds the ICMP type and
	// ICMPType is true.
	ICMPType bool
	// HTTP, when non-nil, makes this an L7 port: connections to it are steered through the
	// L7 proxy and each request must match at least one HTTPRule (an empty HTTPRule
	// matches every request). Only TCP single ports carry L7 rules.
	HTTP []HTTPRule
	// DNS, when non-nil, makes this a DNS port (Cilium's rules.dns, egress only): the
	// endpoint's queries to it (UDP, TCP or both, one port) are steered through the agent's
	// DNS proxy, which forwards those whose name one of the selectors matches and refuses
	// the others; the answers it forwards are what toFQDNs peers learn from.
	DNS []fqdn.Selector
}

// HTTPRule is one entry of Cilium's toPorts[].rules.http. Method, Path and Host are
// regular expressions (RE2) matched against the whole value, as Cilium does; "" matches
// anything. Every header match must hold.
type HTTPRule struct {
	Method  string
	Path    string
	Host    string
	Headers []HeaderMatch
}

// HeaderMatch requires a request header. With Value == "" the header must be present;
// otherwise its value must equal Value exactly (Cilium "Name: value" and headerMatches).
type HeaderMatch struct {
	Name  string
	Value string
}
