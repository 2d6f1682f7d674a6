package api

import (
	"encoding/json"
	"time"
)

// Error is the body of every non-2xx response, and what the client returns for one.
type Error struct {
	Status  int    `json:"-"`
	Message string `json:"error"`
}

func (e *Error) Error() string { return e.Message }

// MonitorsDirName is the directory of the agent's state directory where `rampart monitor
// run` keeps each monitor's files (MonitorsDirName/NAMESPACE/NAME), and which the agent's
// uninstall removes with the rest of its state.
const MonitorsDirName = "monitors"

// Status describes the running agent.
type Status struct {
	// Version is the agent's build (version.Info's one line); empty from agents before it.
	Version    string    `json:"version,omitempty"`
	Instance   string    `json:"instance"`
	PodCIDR    string    `json:"podCIDR"`
	Router     string    `json:"router"`
	PodCIDR6   string    `json:"podCIDR6,omitempty"` // a dual-stack node's IPv6 pod range
	Router6    string    `json:"router6,omitempty"`  // its IPv6 router address
	NodeNetns  string    `json:"nodeNetns"`          // "" = the agent's own namespace
	StateDir   string    `json:"stateDir"`
	BPFDir     string    `json:"bpfDir"`
	StartedAt  time.Time `json:"startedAt"`
	Endpoints  int       `json:"endpoints"`
	Namespaces int       `json:"namespaces"`
	Policies   int       `json:"policies"`
	Identities int       `json:"identities"` // allocated (non-reserved) identities
	CIDRSets   int       `json:"cidrSets"`
	FlowsSeen  uint64    `json:"flowsSeen"`
	FlowsLost  uint64    `json:"flowsLost"` // events a slow observer did not get
	// FlowsBuffered is how many flows the history holds now, of FlowHistory at most (drops
	// and the other flows are kept apart, each in half of it).
	FlowsBuffered int `json:"flowsBuffered"`
	FlowHistory   int `json:"flowHistory"`
	// Degraded is set when a dataplane update failed and could not be rolled back; it
	// names the problem. Enforcement is then fail-closed where it could not be restored.
	Degraded string `json:"degraded,omitempty"`
	// Proxy is the L7 proxy's state.
	Proxy ProxyStatus `json:"proxy"`
	// DNS is the DNS proxy's state and the learnt names (rules.dns, toFQDNs).
	DNS DNSStatus `json:"dns"`
	// SendSide is the send-side L7 verdict's (nil when rampartd runs without
	// --l7-send-side).
	SendSide *SendSideStatus `json:"sendSide,omitempty"`
	// Memory is what the agent and its dataplane hold.
	Memory *MemoryStatus `json:"memory,omitempty"`
	// Kubernetes is the node's view of the cluster in Kubernetes mode (nil outside it).
	Kubernetes *KubernetesStatus `json:"kubernetes,omitempty"`
	// TapPolicy is the tap policy's state (nil without one).
	TapPolicy *TapPolicyStatus `json:"tapPolicy,omitempty"`
	// Host is host policy's state (nil when rampartd runs without --host-firewall).
	Host *HostStatus `json:"host,omitempty"`
	// Monitors is what this node's monitors received and sent outside any contract's
	// counters (nil when the node has no monitor and counted nothing).
	Monitors *MonitorsStatus `json:"monitors,omitempty"`
}

// HostStatus is host policy's state: the node's own endpoint.
type HostStatus struct {
	Devices []string          `json:"devices"` // the interfaces it is enforced on
	Labels  map[string]string `json:"labels"`  // the node's labels nodeSelector matches
	// EnforceIngress and EnforceEgress: a host policy selecting the node isolates it in
	// that direction.
	EnforceIngress bool `json:"enforceIngress"`
	EnforceEgress  bool `json:"enforceEgress"`
	// Safe are the peers the node's connections to are never cut (the API server).
	Safe []string `json:"safe,omitempty"`
}

// DNSStatus is the DNS proxy's state (docs/policy-language.md, "DNS") and the cache of
// names learnt from the answers it forwarded.
type DNSStatus struct {
	// State is "not started" (no DNS rules so far), "running" or "unavailable" (it cannot
	// run: see Error). Queries that DNS rules apply to are dropped unless it is running.
	State  string `json:"state"`
	Listen string `json:"listen,omitempty"`
	Error  string `json:"error,omitempty"`
	// The proxy's counters since it started: queries read, allowed by rules.dns, refused
	// (answered REFUSED), forwarded (answered with the server's response), answered
	// SERVFAIL because the server did not answer or the learnt addresses could not be
	// applied, and dropped by named reason (malformed, oversized, in-flight-limit, ...).
	Queries        uint64            `json:"queries"`
	Allowed        uint64            `json:"allowed"`
	Refused        uint64            `json:"refused"`
	Forwarded      uint64            `json:"forwarded"`
	UpstreamErrors uint64            `json:"upstreamErrors"`
	LearnErrors    uint64            `json:"learnErrors"`
	Drops          map[string]uint64 `json:"drops,omitempty"`
	// The learnt names: names, name-address pairs, distinct addresses, addresses kept
	// only for open connections (zombies), and what the cache's bounds evicted.
	// Observing is where the observing instance listens (domainNames peers: it forwards
	// every query policy allowed and learns the answers), and Observed what it received;
	// empty and 0 while no endpoint needs it.
	Observing string `json:"observing,omitempty"`
	Observed  uint64 `json:"observed,omitempty"`
	Names     int    `json:"names"`
	Entries   int    `json:"entries"`
	Addresses int    `json:"addresses"`
	Zombies   int    `json:"zombies"`
	Evicted   uint64 `json:"evicted"`
}

// MonitorsStatus is the node's monitor endpoints and the tap counts of no contract.
type MonitorsStatus struct {
	Monitors int `json:"monitors"` // monitor endpoints on this node
	// Down is the monitors here that are down, "namespace/name: why" (a monitor that is
	// not reading its receive interface): their copies are lost, and what a fail-closed
	// redirect would divert to them is dropped.
	Down []string `json:"down,omitempty"`
	// CopiesFromOtherNodes: copies other nodes' mirror taps sent to monitors here, handed
	// to the monitor; CopiesFromOtherNodesLost: dropped, no monitor here has their key.
	CopiesFromOtherNodes     uint64 `json:"copiesFromOtherNodes"`
	CopiesFromOtherNodesLost uint64 `json:"copiesFromOtherNodesLost"`
	// NotDiverted: packets monitors sent back that belong to no flow diverted to them
	// (dropped: a monitor cannot inject traffic).
	NotDiverted uint64 `json:"notDiverted"`
	// Error is why the counters could not be read.
	Error string `json:"error,omitempty"`
}

// TapPolicyStatus is the tap policy's state in the agent's status.
type TapPolicyStatus struct {
	File      string `json:"file"`
	Contracts int    `json:"contracts"` // compiled contracts installed
	Unplaced  int    `json:"unplaced"`
	// Error is why the last recompilation failed (the last good contracts stand).
	Error   string    `json:"error,omitempty"`
	ErrorAt time.Time `json:"errorAt,omitzero"`
}

// KubernetesStatus is an agent's view of the cluster in Kubernetes mode.
type KubernetesStatus struct {
	NodeName        string `json:"nodeName"`
	NodeAddress     string `json:"nodeAddress,omitempty"`
	Nodes           int    `json:"nodes"`           // other nodes
	RemoteEndpoints int    `json:"remoteEndpoints"` // pods on other nodes
	// Synced: the informers have synced and the last view was applied (Failing: it could
	// not be, and the dataplane enforces the last one that was).
	Synced  bool `json:"synced"`
	Failing bool `json:"failing,omitempty"`
	// Clean: synced, and nothing of the view refused, left out or unresolved.
	Clean    bool      `json:"clean"`
	Syncs    uint64    `json:"syncs"`
	LastSync time.Time `json:"lastSync,omitzero"`
	// WatchErrors counts the watch's errors (e.g. the API server unreachable), and
	// SyncFailures the views that could not be built or applied, since the agent started.
	WatchErrors  uint64 `json:"watchErrors"`
	SyncFailures uint64 `json:"syncFailures"`
	// LastError is the last sync's or watch's error ("" once a sync succeeded after it).
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
	// Refused are the policy objects the parser refused.
	Refused []RefusedObject `json:"refused,omitempty"`
	// Problems are the objects left out of the view, and why.
	Problems []string `json:"problems,omitempty"`
	// Unresolved are the pods whose cluster identity disagrees with another pod's: this
	// node's own are denied all traffic, the others' addresses are left out.
	Unresolved []RefusedObject `json:"unresolved,omitempty"`
	// Quarantined are the addresses of deleted pods not handed out again yet.
	Quarantined []QuarantinedAddress `json:"quarantined,omitempty"`
}

// QuarantinedAddress is an address of a deleted pod that is not reused until every node
// has dropped it (docs/cluster.md, "Pod addresses").
type QuarantinedAddress struct {
	Address string `json:"address"`
	Pod     string `json:"pod"`
	// Since is the pods resourceVersion from which the API shows no pod with the address
	// ("" while it still does).
	Since string `json:"since,omitempty"`
	// WaitingFor are the nodes that have not acknowledged Since yet.
	WaitingFor []string `json:"waitingFor,omitempty"`
}

// RefusedObject is a policy object the agent did not apply.
type RefusedObject struct {
	Object string `json:"object"`
	Error  string `json:"error"`
}

// MemoryStatus is the memory of the agent's BPF maps, as the kernel accounts it, and of
// the agent process.
type MemoryStatus struct {
	// Maps lists every map of the dataplane (pinned in the BPF directory) and the tables
	// inside its map-in-maps (named OUTER[i]), by name.
	Maps []MapMemory `json:"maps"`
	// MapBytes is the sum of Maps' bytes.
	MapBytes uint64 `json:"mapBytes"`
	// RSSBytes is the agent's resident memory (VmRSS); mmapped BPF arrays count in it (as
	// file pages) while it maps them. RSSAnonBytes is its anonymous part (RssAnon: the Go
	// heap and stacks).
	RSSBytes     uint64 `json:"rssBytes"`
	RSSAnonBytes uint64 `json:"rssAnonBytes"`
	// Error says why the memory could not be read (the rest of the status stands).
	Error string `json:"error,omitempty"`
}

// MapMemory is one BPF map's memory.
type MapMemory struct {
	Name       string `json:"name"`
	ID         uint32 `json:"id"`
	Type       string `json:"type"` // the kernel's map type: Array, Hash, LRUHash, LPMTrie...
	MaxEntries uint32 `json:"maxEntries"`
	// Bytes is the map's memlock in /proc/PID/fdinfo: exact for arrays and preallocated
	// hashes; for an LPM trie it counts only its nodes' keys and values (the kernel's real
	// memory is several times that).
	Bytes uint64 `json:"bytes"`
}

// SendSideStatus counts what the send-side L7 verdict did since it was loaded (its
// counters outlive agent restarts, like its pins).
type SendSideStatus struct {
	Pairs         int    `json:"pairs"`         // pairs of local endpoints and ports it checks now
	Passed        uint64 `json:"passed"`        // requests let through
	Refused       uint64 `json:"refused"`       // answered 403 from the client's socket
	OutsideSubset uint64 `json:"outsideSubset"` // answered 400, connection shut
	SendFailed    uint64 `json:"sendFailed"`    // refused by failing the send (no answer could go in order)
	EventsLost    uint64 `json:"eventsLost"`    // requests not reported: the event ring was full
}

// ProxyStatus describes the L7 proxy (Envoy), which the agent starts once some policy has
// L7 rules and supervises from then on.
type ProxyStatus struct {
	// State is "not started" (no L7 rules so far), "running", "starting" (not yet
	// configured), "restarting" (Envoy exited; the supervisor starts it again) or
	// "unavailable" (it cannot run: see Error). Connections that need L7 checks are refused
	// by the dataplane unless it is running.
	State        string    `json:"state"`
	PID          int       `json:"pid,omitempty"`
	StartedAt    time.Time `json:"startedAt,omitzero"`
	Restarts     int       `json:"restarts"`
	Version      uint64    `json:"version"`      // latest configuration version published
	AckedVersion uint64    `json:"ackedVersion"` // latest version Envoy applied
	Chains       int       `json:"chains"`       // listener filter chains (endpoint, direction, port)
	Listen       string    `json:"listen,omitempty"`
	Binary       string    `json:"binary,omitempty"`
	Log          string    `json:"log,omitempty"`
	LastExit     string    `json:"lastExit,omitempty"`
	Error        string    `json:"error,omitempty"`
	// FastPath is the agent's own check of plain HTTP/1.1 requests (nil when it is off):
	// it serves the listener the dataplane steers to and hands everything else to Envoy.
	FastPath *FastPathStatus `json:"fastPath,omitempty"`
}

// FastPathStatus counts what the L7 fast path did since the agent started.
type FastPathStatus struct {
	Listen     string `json:"listen"`
	Requests   uint64 `json:"requests"`   // requests it checked
	Denied     uint64 `json:"denied"`     // of those, refused with 403
	HandedOver uint64 `json:"handedOver"` // connections handed to Envoy
	Open       int    `json:"open"`       // connections open now
}

// NamedPort is a port an endpoint declares by name (--port http=80/TCP).
type NamedPort struct {
	Name     string `json:"name"`
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"` // TCP, UDP, SCTP
}

// EndpointSpec is what `endpoint add` asks for.
type EndpointSpec struct {
	Namespace      string            `json:"namespace"`
	Name           string            `json:"name"`
	Labels         map[string]string `json:"labels"`
	IP             string            `json:"ip,omitempty"` // "" = next free address
	Ports          []NamedPort       `json:"ports,omitempty"`
	ServiceAccount string            `json:"serviceAccount,omitempty"`
	// Monitor makes the endpoint a monitor for tap contracts (docs/taps.md): it is never
	// tapped itself, and only a monitor can be a contract's monitor.
	Monitor bool `json:"monitor,omitempty"`
	// Audit puts the endpoint in audit mode: its policies are not enforced; what they
	// would drop is forwarded and reported with verdict AUDIT.
	Audit bool `json:"audit,omitempty"`
}

// AuditMode is what `endpoint audit` asks for: the endpoint in audit mode or not.
type AuditMode struct {
	Audit bool `json:"audit"`
}

// Counters are an endpoint's dataplane counters (ingress = into the endpoint).
type Counters struct {
	IngressPackets uint64 `json:"ingressPackets"`
	IngressBytes   uint64 `json:"ingressBytes"`
	IngressDrops   uint64 `json:"ingressDrops"`
	EgressPackets  uint64 `json:"egressPackets"`
	EgressBytes    uint64 `json:"egressBytes"`
	EgressDrops    uint64 `json:"egressDrops"`
}

// Endpoint is an endpoint as the agent knows it.
type Endpoint struct {
	Namespace      string            `json:"namespace"`
	Name           string            `json:"name"`
	Labels         map[string]string `json:"labels"`
	IP             string            `json:"ip"`
	IP6            string            `json:"ip6,omitempty"` // a dual-stack node's endpoints' IPv6 address
	Ports          []NamedPort       `json:"ports,omitempty"`
	ServiceAccount string            `json:"serviceAccount,omitempty"`
	EpID           uint32            `json:"epID"`
	Identity       uint32            `json:"identity"`
	// IdentityLabels is the full label set the identity stands for (own labels plus
	// namespace, namespace labels, cluster and service account), sorted k=v.
	IdentityLabels []string `json:"identityLabels,omitempty"`
	HostInterface  string   `json:"hostInterface"`
	Netns          string   `json:"netns"` // path, for nsenter --net
	// CNI is set for an endpoint a CNI ADD made: in the runtime's namespace Netns, under
	// the runtime's interface name.
	CNI            *CNIAttachment `json:"cni,omitempty"`
	Monitor        bool           `json:"monitor,omitempty"`
	Audit          bool           `json:"audit,omitempty"`
	EnforceIngress bool           `json:"enforceIngress"`
	EnforceEgress  bool           `json:"enforceEgress"`
	Counters       *Counters      `json:"counters,omitempty"` // only from Get
}

// Key returns "namespace/name".
func (e Endpoint) Key() string { return e.Namespace + "/" + e.Name }

// LabelChange sets and removes labels (`namespace label NS k=v k-`).
type LabelChange struct {
	Set    map[string]string `json:"set,omitempty"`
	Remove []string          `json:"remove,omitempty"`
}

// Namespace is a namespace and its labels (kubernetes.io/metadata.name included).
type Namespace struct {
	Name      string            `json:"name"`
	Labels    map[string]string `json:"labels"`
	Endpoints int               `json:"endpoints"`
}

// Identity is one identity: reserved, endpoint (labels), CIDR (prefix) or CIDR set
// (labels: cidrgroup:NAME).
type Identity struct {
	ID        uint32   `json:"id"`
	Kind      string   `json:"kind"` // reserved, endpoint, cidr, cidrset
	Labels    []string `json:"labels,omitempty"`
	Prefix    string   `json:"prefix,omitempty"`
	Endpoints []string `json:"endpoints,omitempty"` // ns/name of endpoints that have it
}

// Document is one manifest file (or stdin) as read by the CLI. Source names it in errors.
type Document struct {
	Source string `json:"source"`
	Data   string `json:"data"`
}

// ApplyRequest applies every policy in every document, or none of them.
type ApplyRequest struct {
	Documents []Document `json:"documents"`
}

// DeleteRequest deletes the policies named by the documents (kind, namespace and name are
// what counts), all or none.
type DeleteRequest struct {
	Documents      []Document `json:"documents"`
	IgnoreNotFound bool       `json:"ignoreNotFound,omitempty"`
}

// PolicyChange reports what happened to one policy.
type PolicyChange struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Action    string `json:"action"` // created, configured, unchanged, deleted, not found
	// Source is the manifest (file and document) that named the object, in the answer
	// to delete: a "not found" names where the object was asked for.
	Source string `json:"source,omitempty"`
}

// ChangeResult is the answer to apply and delete. A CiliumCIDRGroup shows as a change of
// kind CiliumCIDRGroup (its CIDR set created, configured, unchanged or deleted).
type ChangeResult struct {
	Changes []PolicyChange `json:"changes"`
}

// Rule summarises one rule of a policy.
type Rule struct {
	ID          uint32 `json:"id"`
	Description string `json:"description"`
	Direction   string `json:"direction"`
	Deny        bool   `json:"deny,omitempty"`
	Selector    string `json:"selector"`
}

// Policy is a stored policy.
type Policy struct {
	Kind      string          `json:"kind"`
	Namespace string          `json:"namespace,omitempty"`
	Name      string          `json:"name"`
	Source    string          `json:"source"`
	Rules     []Rule          `json:"rules"`
	Raw       json.RawMessage `json:"raw,omitempty"`
	// MissingCIDRGroups are CIDR groups the policy names that do not exist: those peers
	// select nothing until the group is created.
	MissingCIDRGroups []string `json:"missingCIDRGroups,omitempty"`
	// Audit: the policy is in audit mode (policy.rampart.io/audit): reported, not enforced.
	Audit bool `json:"audit,omitempty"`
}

// Ref names a policy: Kind/namespace/name (namespace empty for clusterwide ones).
func (p Policy) Ref() string { return p.Kind + "/" + p.Namespace + "/" + p.Name }

// TraceRequest asks how the dataplane decides a new connection.
type TraceRequest struct {
	From     string `json:"from"` // ns/name or IP
	To       string `json:"to"`
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"` // TCP, UDP, SCTP, ICMP
}

// RuleRef points at a rule of a policy.
type RuleRef struct {
	ID     uint32 `json:"id"`
	Policy string `json:"policy"` // Kind/namespace/name
	Rule   string `json:"rule"`   // e.g. ingress[0]
}

// TraceSide is the verdict at one enforcement point: the source's egress or the
// destination's ingress.
type TraceSide struct {
	Direction string `json:"direction"` // egress (at From) or ingress (at To)
	Endpoint  string `json:"endpoint"`  // ns/name
	// Node names the node that decides this side when it is not the answering one (a pod
	// on another node): the decision is computed from what the answering node knows of
	// the cluster (every policy, the pods' labels and named ports). Empty: this node.
	Node     string   `json:"node,omitempty"`
	Enforced bool     `json:"enforced"` // default deny in this direction
	Allowed  bool     `json:"allowed"`
	Reason   string   `json:"reason"` // e.g. "allowed by rule", "denied by rule", "no rule allows (default deny)", "not enforced"
	Rule     *RuleRef `json:"rule,omitempty"`
	// Tier is the ClusterNetworkPolicy tier of the rule that decided, "Admin" or
	// "Baseline"; empty for the NetworkPolicy tier (NetworkPolicy, Cilium policies).
	Tier string `json:"tier,omitempty"`
	// Redirected: allowed only through the L7 proxy, where each request must match one of
	// the HTTP rules of L7 (Allowed is true).
	Redirected bool      `json:"redirected,omitempty"`
	L7         []TraceL7 `json:"l7,omitempty"`
	// CIDRGroup names the CIDR set that decided: the deciding entry is a cidrGroupRef
	// peer's (e.g. egressDeny toCIDRSet cidrGroupRef=threats).
	CIDRGroup string `json:"cidrGroup,omitempty"`
	// DefaultDenyBy names, for a default deny, the policies that make the endpoint
	// enforce this direction (Kind/namespace/name).
	DefaultDenyBy []string `json:"defaultDenyBy,omitempty"`
	// Audit is, for a flow this side lets through, what the policies in audit mode that
	// apply to the endpoint would do when they would drop it: the dataplane forwards the
	// flow and reports it with verdict AUDIT.
	Audit *TraceAudit `json:"audit,omitempty"`
}

// TraceAudit is a would-be drop by policies in audit mode.
type TraceAudit struct {
	Reason        string   `json:"reason"` // denied-by-rule, default-deny
	Rule          *RuleRef `json:"rule,omitempty"`
	Tier          string   `json:"tier,omitempty"`
	DefaultDenyBy []string `json:"defaultDenyBy,omitempty"`
}

// TraceL7 is one rule whose HTTP rules the proxy applies to a redirected connection.
type TraceL7 struct {
	Rule *RuleRef `json:"rule"`
	// HTTP are the rule's HTTP rules, rendered (e.g. `method "GET" path "/v1"`).
	HTTP []string `json:"http"`
}

// TraceResult is the answer to a trace. Sides has one entry per managed endpoint on the
// path (traffic from or to a non-endpoint address has one side).
type TraceResult struct {
	From      string `json:"from"`
	To        string `json:"to"`
	FromIdent uint32 `json:"fromIdentity"`
	ToIdent   uint32 `json:"toIdentity"`
	Allowed   bool   `json:"allowed"`
	// Redirected: the connection is steered to the L7 proxy, which checks each request
	// (see the sides' L7 rules).
	Redirected bool        `json:"redirected,omitempty"`
	Sides      []TraceSide `json:"sides"`
	Protocol   string      `json:"protocol"`
	Port       uint16      `json:"port"`
	Diagnostic string      `json:"diagnostic,omitempty"`
	// FromCIDRGroups and ToCIDRGroups name the CIDR sets the addresses are in.
	FromCIDRGroups []string `json:"fromCIDRGroups,omitempty"`
	ToCIDRGroups   []string `json:"toCIDRGroups,omitempty"`
}

// FlowPeer is one side of a flow, decorated with what the agent knows of the address.
type FlowPeer struct {
	IP        string   `json:"ip"`
	Port      uint16   `json:"port,omitempty"`
	Identity  uint32   `json:"identity"`
	Namespace string   `json:"namespace,omitempty"`
	Name      string   `json:"name,omitempty"`
	Labels    []string `json:"labels,omitempty"` // identity labels, sorted k=v (reserved:x for reserved)
	// Node is the node that hosts a remote endpoint (a pod on another node).
	Node string `json:"node,omitempty"`
}

// Flow is one flow event: a new allowed connection, a drop, or (type l7) one HTTP request
// the L7 proxy handled.
type Flow struct {
	Time time.Time `json:"time"`
	// Type, Verdict and Reason are the names of flow.EventType (new, drop; or l7, a
	// request the L7 proxy or the send-side verdict handled), flow.Verdict (FORWARDED,
	// DROPPED, REDIRECTED: a new connection steered to the L7 proxy) and flow.Reason (or
	// l7-denied, l7-error for l7 flows); Reason is empty when there is none
	// (flow.ReasonNone).
	Type      string   `json:"type"`
	Verdict   string   `json:"verdict"`
	Reason    string   `json:"reason,omitempty"`
	Direction string   `json:"direction"` // ingress, egress (at Endpoint)
	Protocol  string   `json:"protocol"`  // TCP, UDP, ICMP, ... (ARP: a dropped ARP frame, sender and target address)
	ICMPType  *uint8   `json:"icmpType,omitempty"`
	Source    FlowPeer `json:"source"`
	Dest      FlowPeer `json:"destination"`
	// Endpoint is the endpoint whose veth saw the packet (ns/name).
	Endpoint string   `json:"endpoint"`
	Length   uint32   `json:"length"`
	Rule     *RuleRef `json:"rule,omitempty"`
	// CIDRGroup names the CIDR set whose cidrGroupRef peer decided (the rule's entry was
	// the set's).
	CIDRGroup string `json:"cidrGroup,omitempty"`
	// DefaultDenyBy names, for a flow dropped (or, verdict AUDIT, that would have been
	// dropped) by default deny, the policies that make the endpoint enforce the
	// direction (Kind/namespace/name); for AUDIT those in audit mode included.
	DefaultDenyBy []string `json:"defaultDenyBy,omitempty"`
	// FromProxy: the L7 proxy's upstream connection (it carries the client's address),
	// admitted at the destination because the proxy applied the L7 rules.
	FromProxy bool `json:"fromProxy,omitempty"`
	// Flags are the names of the event's flow.Flags: how the L7 proxy or the send-side
	// verdict is involved (l7-egress, l7-ingress, from-proxy, send-side) and arp. An l7
	// flow the send-side verdict decided has send-side.
	Flags []string `json:"flags,omitempty"`
	// L7 is the request, for flows of type l7. Endpoint, Direction and Rule are then the
	// side whose L7 policy decided (for a denial, the side that refused).
	L7 *L7Flow `json:"l7,omitempty"`
	// Node is the node whose agent saw the flow, in the cluster's view (rampart observe
	// --cluster); empty from one agent.
	Node string `json:"node,omitempty"`
}

// L7Flow is one HTTP request through the L7 proxy.
type L7Flow struct {
	Protocol  string  `json:"protocol"` // HTTP/1.1, HTTP/2
	Method    string  `json:"method"`
	Path      string  `json:"path"` // without the query
	Host      string  `json:"host"`
	Status    uint32  `json:"status"` // sent to the client; 0 if none (reset)
	LatencyMs float64 `json:"latencyMs"`
	// Detail is the proxy's reason for the response (e.g. "via_upstream",
	// "rbac_access_denied_matched_policy[none]", "http1.codec_error").
	Detail string `json:"detail,omitempty"`
}

// FlowFilter selects flows for observe. Empty fields match everything.
type FlowFilter struct {
	Endpoint  string            `json:"endpoint,omitempty"`  // ns/name: either side
	Namespace string            `json:"namespace,omitempty"` // either side
	Labels    map[string]string `json:"labels,omitempty"`    // either side's identity labels contain all
	Verdict   string            `json:"verdict,omitempty"`   // forwarded, dropped, redirected
	Port      uint16            `json:"port,omitempty"`      // either port
	Protocol  string            `json:"protocol,omitempty"`  // tcp, udp, icmp
	// Type is l7 (proxy requests), l3l4 (dataplane events), or one event type: new
	// (new connections), drop; "" all.
	Type string `json:"type,omitempty"`
	// From and To match one side only, as hubble's --from-pod and --to-pod do: NS/ (every
	// endpoint of namespace NS), NS/PREFIX (endpoints whose name starts with PREFIX) or
	// PREFIX (in namespace default, as hubble reads it).
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	// Since and Until bound the flows' times (either may be zero: no bound).
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
}

// ObserveRequest asks for recent flows and, with Follow, new ones as they come.
type ObserveRequest struct {
	Filter FlowFilter `json:"filter"`
	Follow bool       `json:"follow,omitempty"`
	// Last is how many recent matching flows to send first; SinceStart sends every
	// buffered flow since the agent started (up to the history size).
	Last       int  `json:"last,omitempty"`
	SinceStart bool `json:"sinceStart,omitempty"`
	// Match, when set, is a further filter of a caller in the agent's process (the Hubble
	// server's, whose filters FlowFilter cannot express); it does not cross the API.
	Match func(Flow) bool `json:"-"`
	// Lost, when set, is told how many new flows this follower missed since it was last
	// told (its queue was full: the reader was slower than the flows); a caller in the
	// agent's process only, like Match.
	Lost func(n uint64) `json:"-"`
}

// Matches reports whether a flow passes both the request's filter and its Match.
func (r ObserveRequest) Matches(f Flow) bool {
	return r.Filter.Match(f) && (r.Match == nil || r.Match(f))
}

// CIDRSet describes a named CIDR set: a CiliumCIDRGroup or a list loaded with
// `rampart cidrset load`. Policies refer to it with toCIDRSet/fromCIDRSet cidrGroupRef.
type CIDRSet struct {
	Name     string `json:"name"`
	Index    uint8  `json:"index"`    // dataplane set index, 0-31, stable for the set's life
	Identity uint32 `json:"identity"` // identity.CIDRSet(Index)
	// Source says where the current content came from: "file LIST", "CiliumCIDRGroup
	// FILE: document N", or "cidrset add/remove" after in-place changes.
	Source   string    `json:"source"`
	LoadedAt time.Time `json:"loadedAt"` // last full load (load, apply)
	// ChangedAt is the last change of any kind (load, add, remove).
	ChangedAt time.Time `json:"changedAt"`
	Prefixes  int       `json:"prefixes"` // distinct prefixes
	IPv4      int       `json:"ipv4"`
	IPv6      int       `json:"ipv6"`
	// ByLength counts the prefixes of each length, "v4/24" -> n (only from Get).
	ByLength map[string]int `json:"byLength,omitempty"`
	// AgentBytes is what the agent keeps of the set in memory (and about what its file in
	// the state directory takes).
	AgentBytes uint64 `json:"agentBytes"`
	// MemoryBytes is what holding the set costs: the dataplane's set tables as of the last
	// full load (shared by all sets; LastLoad.DataplaneBytes) plus AgentBytes.
	MemoryBytes uint64 `json:"memoryBytes"`
	// ReferencedBy lists the policies that name the set (Kind/namespace/name).
	ReferencedBy []string `json:"referencedBy,omitempty"`
	// LastLoad is the cost of the last full load (only from Get and load results).
	LastLoad *CIDRSetLoad `json:"lastLoad,omitempty"`
}

// CIDRSetLoad is what a full load of the set tables cost: the dataplane rebuilds the
// tables of all sets aside and switches to them.
type CIDRSetLoad struct {
	// TotalPrefixes is the number of prefixes of all sets in the tables.
	TotalPrefixes int `json:"totalPrefixes"`
	// HostEntries are the addresses of /25../32 IPv4 prefixes in the host table.
	HostEntries int `json:"hostEntries"`
	// DataplaneBytes is the memory of the dataplane's set tables, shared by all sets: the
	// tables in the kernel (KernelBytes: the IPv4 tables of the active bank as the kernel
	// accounts them, and the IPv6 trie, estimated) and the dataplane's copy of the
	// prefixes in the agent (8 bytes per IPv4 prefix). BytesPerPrefix and
	// KernelBytesPerPrefix divide them by TotalPrefixes.
	DataplaneBytes       uint64  `json:"dataplaneBytes"`
	BytesPerPrefix       float64 `json:"bytesPerPrefix"`
	KernelBytes          uint64  `json:"kernelBytes"`
	KernelBytesPerPrefix float64 `json:"kernelBytesPerPrefix"`
	// Build: computing the tables; Write: writing them and switching; Agent: the rest of
	// the request up to the switch and the policy update (sorting, waiting, policy). Total
	// is from the decoded request to the tables and policy in place, before the files are
	// written (CIDRSetChange.Timing has every stage of the last change).
	AgentMs float64 `json:"agentMs"`
	BuildMs float64 `json:"buildMs"`
	WriteMs float64 `json:"writeMs"`
	TotalMs float64 `json:"totalMs"`
}

// CIDRSetChange is the answer to a load, add, remove or delete.
type CIDRSetChange struct {
	Set    CIDRSet `json:"set"`
	Action string  `json:"action"` // created, replaced, unchanged, changed, deleted
	// Given counts the prefixes of the request; Duplicates those given twice (or, for
	// add, already in the set); Added and Removed what changed; NotFound the prefixes a
	// remove named that were not in the set.
	Given      int `json:"given"`
	Duplicates int `json:"duplicates,omitempty"`
	Added      int `json:"added"`
	Removed    int `json:"removed"`
	NotFound   int `json:"notFound,omitempty"`
	// InPlace: the dataplane was updated in place (add/remove) rather than rebuilt.
	InPlace bool `json:"inPlace,omitempty"`
	// Timing says where the agent spent the change's time (load, add and remove).
	Timing *CIDRSetTiming `json:"timing,omitempty"`
}

// CIDRSetTiming is where one set change spent its time in the agent, in milliseconds,
// so that a slow load can be explained: the stages follow one another, and TotalMs is
// from when the agent began reading the request to when it answered.
type CIDRSetTiming struct {
	ReceiveMs   float64 `json:"receiveMs"`   // reading and decoding the request body
	SortMs      float64 `json:"sortMs"`      // sorting the prefixes and dropping duplicates
	WaitMs      float64 `json:"waitMs"`      // waiting for other changes to finish
	DataplaneMs float64 `json:"dataplaneMs"` // building and writing the set tables, or the in-place change
	PolicyMs    float64 `json:"policyMs"`    // computing and applying the policy state
	PersistMs   float64 `json:"persistMs"`   // writing the set's file and the state file (fsync)
	TotalMs     float64 `json:"totalMs"`
}

// CNIAddRequest asks the agent to make an endpoint in a network namespace a container
// runtime made (a CNI ADD). The runtime owns the namespace: the agent adds its veth there
// and never deletes the namespace.
type CNIAddRequest struct {
	// ContainerID is CNI_CONTAINERID; the endpoint is keyed by it and IfName.
	ContainerID string `json:"containerID"`
	// Netns is CNI_NETNS, the path of the namespace.
	Netns string `json:"netns"`
	// IfName is CNI_IFNAME, the endpoint's interface in the namespace.
	IfName string `json:"ifName"`
	// PodNamespace and PodName are K8S_POD_NAMESPACE and K8S_POD_NAME from CNI_ARGS: the
	// endpoint's namespace and name. Without them the endpoint is default/cni-<hash of
	// the container ID>.
	PodNamespace string `json:"podNamespace,omitempty"`
	PodName      string `json:"podName,omitempty"`
}

// CNIAttachment names one CNI attachment: a container's interface.
type CNIAttachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// CNICheckRequest asks whether an attachment is as the agent made it (a CNI CHECK).
type CNICheckRequest struct {
	CNIAttachment
	Netns string `json:"netns"`
}

// CNIResult is an attachment as the agent made it: what a CNI result reports.
type CNIResult struct {
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	ContainerID string `json:"containerID"`
	Netns       string `json:"netns"`
	IfName      string `json:"ifName"`
	MAC         string `json:"mac,omitempty"`
	// HostInterface and HostMAC are the veth's node side.
	HostInterface string `json:"hostInterface"`
	HostMAC       string `json:"hostMAC,omitempty"`
	// IP is the endpoint's address with its prefix length (a /32).
	IP string `json:"ip"`
	// Gateway is the node's router address; Routes are the destinations routed through
	// it, and on a dual-stack node also the IPv6 ones, routed through Gateway6: each
	// through the gateway of its family.
	Gateway  string   `json:"gateway"`
	Routes   []string `json:"routes"`
	Identity uint32   `json:"identity"`
	// IP6 is a dual-stack endpoint's IPv6 address with its prefix length (a /128), and
	// Gateway6 its IPv6 router, the host veth's link-local address; both "" on an
	// IPv4-only node.
	IP6      string `json:"ip6,omitempty"`
	Gateway6 string `json:"gateway6,omitempty"`
}

// CNIGCRequest lists the attachments the runtime still has (a CNI GC): the agent deletes
// every other endpoint made through CNI, and no endpoint made otherwise.
type CNIGCRequest struct {
	Valid []CNIAttachment `json:"valid"`
}

// CNIGCResult lists the attachments a GC deleted.
type CNIGCResult struct {
	Deleted []CNIAttachment `json:"deleted"`
}

// NodeSpec declares another node of the cluster: its address on the fabric (where the
// overlay sends packets for its pods, and the only outer source the overlay accepts) and
// its pod CIDR, and on a dual-stack cluster its IPv6 pod CIDR: its pods' IPv6 addresses are
// derived from their IPv4 ones as this node's are (podaddr), and travel in the VXLAN
// overlay, or natively routed via the node's IPv6 address on the fabric, Address6
// (docs/architecture.md, "IPv6 between nodes").
type NodeSpec struct {
	Address  string `json:"address"`
	PodCIDR  string `json:"podCIDR,omitempty"`
	PodCIDR6 string `json:"podCIDR6,omitempty"`
	Address6 string `json:"address6,omitempty"`
}

// Node is another node as the agent knows it.
type Node struct {
	Name            string `json:"name"`
	Address         string `json:"address"`
	PodCIDR         string `json:"podCIDR,omitempty"`
	PodCIDR6        string `json:"podCIDR6,omitempty"`
	Address6        string `json:"address6,omitempty"`
	RemoteEndpoints int    `json:"remoteEndpoints"`
}

// RemoteEndpointSpec declares a pod on another node: its address, the node that hosts it,
// and its labels, from which the agent derives its identity as for a local endpoint
// (namespace labels included), so that policy selects it by labels.
type RemoteEndpointSpec struct {
	Node           string            `json:"node"`
	IP             string            `json:"ip"`
	Labels         map[string]string `json:"labels,omitempty"`
	ServiceAccount string            `json:"serviceAccount,omitempty"`
	// Identity is the number the pod's own node gave its labels (0: this agent allocates
	// one). The overlay carries the sender's number, so both nodes must agree on it until
	// identities are allocated cluster-wide.
	Identity uint32 `json:"identity,omitempty"`
	// Monitor: the pod is a monitor endpoint of its node, which tap contracts of this
	// node may name (its copies go through the overlay).
	Monitor bool `json:"monitor,omitempty"`
	// Ports are the pod's named ports: this node's egress rules that name a port resolve
	// it against them when the pod is the peer.
	Ports []NamedPort `json:"ports,omitempty"`
}

// RemoteEndpoint is a pod on another node as the agent knows it.
type RemoteEndpoint struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Node      string            `json:"node"`
	IP        string            `json:"ip"`
	IP6       string            `json:"ip6,omitempty"` // derived from IP and its node's pod CIDRs
	Labels    map[string]string `json:"labels"`
	Identity  uint32            `json:"identity"`
	Monitor   bool              `json:"monitor,omitempty"`
	Ports     []NamedPort       `json:"ports,omitempty"`
}

// ServiceSpec declares a Service (docs/services.md): its cluster address and ports, and
// its backends: the endpoints (local and remote) of its namespace whose labels match the
// selector, and the addresses listed.
type ServiceSpec struct {
	ClusterIP string `json:"clusterIP"`
	// ClusterIPs, for a dual-stack Service: ClusterIP, then the address of the other
	// family (as Kubernetes' spec.clusterIPs).
	ClusterIPs []string          `json:"clusterIPs,omitempty"`
	Ports      []ServicePort     `json:"ports"`
	Selector   map[string]string `json:"selector,omitempty"`
	Addresses  []string          `json:"addresses,omitempty"`
}

// ServicePort is one port of a Service: its protocol (TCP, UDP), the port clients address
// at the cluster IP, the backends' port (0: the same) and the port clients address at
// every node's address (0: none).
type ServicePort struct {
	Name       string `json:"name,omitempty"`
	Protocol   string `json:"protocol"`
	Port       uint16 `json:"port"`
	TargetPort uint16 `json:"targetPort,omitempty"`
	NodePort   uint16 `json:"nodePort,omitempty"`
}

// ServiceEntry is a Service as the agent holds it, with the backends it translates to.
type ServiceEntry struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	ServiceSpec
	// Backends are the backend pods' addresses now (sorted).
	Backends []string `json:"backends"`
}

// Tap is a tap contract as the agent holds it (docs/taps.md).
type Tap struct {
	Kind   string `json:"kind"` // TapContract or TrafficControl
	Name   string `json:"name"`
	Source string `json:"source"` // where it was read from
	// Tapped is what the contract taps: an endpoint (namespace/name) or a selector.
	Tapped  string `json:"tapped"`
	Monitor string `json:"monitor"`
	Match   string `json:"match"`
	// MatchSpec is Match as data.
	MatchSpec *TapMatch `json:"matchSpec,omitempty"`
	Action    string    `json:"action"`             // mirror or redirect
	FailMode  string    `json:"failMode,omitempty"` // closed or open (redirect only)
	// Endpoints are the local endpoints it taps now.
	Endpoints []string `json:"endpoints"`
	// MonitorNode is the node of the monitor when it is on another node.
	MonitorNode string `json:"monitorNode,omitempty"`
	// MonitorProblem says why the monitor is unavailable: a redirect then drops what it
	// matches (fail closed) or passes it untapped (fail open); a mirror's copies are lost.
	MonitorProblem string `json:"monitorProblem,omitempty"`
	// Conflicts name the contracts this one overlaps on some endpoint (a relabel can make
	// accepted contracts meet; the first by name takes the packet).
	Conflicts []string        `json:"conflicts,omitempty"`
	Counters  *TapCounters    `json:"counters,omitempty"`
	Raw       json.RawMessage `json:"raw,omitempty"`
}

// TapCounters are a contract's packet counts over its endpoints' rules, from the
// dataplane.
type TapCounters struct {
	MirroredPackets    uint64 `json:"mirroredPackets"`
	MirroredBytes      uint64 `json:"mirroredBytes"`
	RedirectedPackets  uint64 `json:"redirectedPackets"`
	RedirectedBytes    uint64 `json:"redirectedBytes"`
	DroppedByMonitor   uint64 `json:"droppedByMonitor"`
	CopiesLost         uint64 `json:"copiesLost"`
	DroppedUnavailable uint64 `json:"droppedUnavailable"`
}

// TapPolicyRequest carries a tap policy (Datalog, docs/taps.md "Tap policy (Datalog)") to
// apply or to compile as a dry run.
type TapPolicyRequest struct {
	File   string `json:"file"`   // the file name, for messages and contract origins
	Source string `json:"source"` // the policy's text
	// Explain (compile) adds each contract's derivations; Facts the facts compiled against.
	Explain bool `json:"explain,omitempty"`
	Facts   bool `json:"facts,omitempty"`
}

// TapPolicy is a tap policy and what it yields: the agent's policy (`tap policy get`) or
// a dry run's (`tap compile`).
type TapPolicy struct {
	File      string        `json:"file"`
	Source    string        `json:"source,omitempty"`
	Strategy  string        `json:"strategy"` // per-node or per-app
	Contracts []CompiledTap `json:"contracts"`
	Unplaced  []UnplacedTap `json:"unplaced,omitempty"`
	// Missing says why the policy yields nothing: the premises no fact matches.
	Missing []string `json:"missing,omitempty"`
	Facts   []string `json:"facts,omitempty"`
	// Error is why the last compilation against a changed model failed; Contracts are
	// then those of the last good compilation, which stay installed.
	Error   string    `json:"error,omitempty"`
	ErrorAt time.Time `json:"errorAt,omitzero"`
}

// CompiledTap is a contract a tap policy derived and the tap contracts it became (two for
// direction both with a port: see docs/taps.md).
type CompiledTap struct {
	Name      string          `json:"name"`
	Source    string          `json:"source"`
	Monitor   string          `json:"monitor"`
	Direction string          `json:"direction"`
	Protocol  string          `json:"protocol"`
	Port      uint16          `json:"port"` // 0: any
	Action    string          `json:"action"`
	Taps      []string        `json:"taps"` // the tap contracts' names
	Placement string          `json:"placement,omitempty"`
	Why       []TapDerivation `json:"why,omitempty"`
}

// TapDerivation is one way a fact was derived: the rule, its line, the facts its premises
// matched, and the derived premises explained in turn.
type TapDerivation struct {
	Rule    string       `json:"rule"`
	Line    int          `json:"line"`
	Facts   []string     `json:"facts"`
	Derived []TapPremise `json:"derived,omitempty"`
}

// TapPremise is a derived premise of a derivation and its own derivations.
type TapPremise struct {
	Fact string          `json:"fact"`
	Why  []TapDerivation `json:"why,omitempty"`
}

// UnplacedTap is an inspect request no monitor could take, and why.
type UnplacedTap struct {
	Request string          `json:"request"`
	Reason  string          `json:"reason"`
	Why     []TapDerivation `json:"why,omitempty"`
}
