package suggest

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rampartnet/rampart/internal/labels"
)

// Verdicts and flow types as the agent names them (flow.Verdict, flow.EventType); this
// package does not import the agent's vocabulary, to stay below it.
const (
	VerdictForwarded  = "FORWARDED"
	VerdictRedirected = "REDIRECTED"
	VerdictAudit      = "AUDIT"
	VerdictDropped    = "DROPPED"
)

// AuditAnnotation puts a policy in audit mode (docs/observability.md, "Audit mode").
const AuditAnnotation = "policy.rampart.io/audit"

// PerPodKeys are label keys whose values differ between the pods of one workload (set by
// Deployments, StatefulSets, DaemonSets and Jobs for each pod or each revision): a
// selector over them would select one pod, or one rollout, rather than the workload.
// They are never chosen for a selector, except in the last fallback (each endpoint by all
// its labels).
var PerPodKeys = []string{
	"pod-template-hash",
	"controller-revision-hash",
	"pod-template-generation",
	"statefulset.kubernetes.io/pod-name",
	"apps.kubernetes.io/pod-index",
	"batch.kubernetes.io/controller-uid",
	"batch.kubernetes.io/job-completion-index",
	"controller-uid",
}

// preferredKeys are tried first, in this order, when selectors of one size tie: the keys
// people write workloads' selectors with.
var preferredKeys = []string{
	"app.kubernetes.io/name", "app", "k8s-app", "name", "class", "org",
	"app.kubernetes.io/component", "component", "tier", "role", "app.kubernetes.io/instance",
}

// Endpoint is an endpoint the agent knows: its own labels (not the namespace's).
type Endpoint struct {
	Namespace, Name string
	Labels          map[string]string
}

// Key is "namespace/name".
func (e Endpoint) Key() string { return e.Namespace + "/" + e.Name }

// Peer is one side of a flow.
type Peer struct {
	// Namespace and Name are set when the address is an endpoint's (a pod).
	Namespace, Name string
	IP              string
	// Labels are the identity's labels as the agent writes them: k=v, reserved:NAME,
	// cidr:PREFIX.
	Labels []string
}

func (p Peer) isEndpoint() bool { return p.Name != "" }

func (p Peer) String() string {
	if p.isEndpoint() {
		return p.Namespace + "/" + p.Name
	}
	if e := p.entity(); e != "" && e != "world" {
		return e
	}
	if p.IP != "" {
		return p.IP
	}
	return "?"
}

// entity is the reserved identity's name (host, world, remote-node, ...), or "".
func (p Peer) entity() string {
	for _, l := range p.Labels {
		if n, ok := strings.CutPrefix(l, "reserved:"); ok {
			return n
		}
	}
	return ""
}

// HTTP is one request the L7 proxy saw.
type HTTP struct {
	Method, Path string
}

// Flow is one flow event: a new connection (forwarded, redirected to the L7 proxy, or
// forwarded in audit), a drop, or an HTTP request (HTTP set).
type Flow struct {
	Time     time.Time
	Verdict  string
	Reason   string
	Protocol string // TCP, UDP, SCTP, ICMP, ICMPv6 (others are not admitted by policy)
	// Port is the destination port (TCP, UDP, SCTP) or the ICMP type.
	Port uint16
	// SourcePort is the source port (0 for ICMP): with the addresses, protocol and Port it
	// names the connection, which each end of it may report.
	SourcePort   uint16
	Source, Dest Peer
	HTTP         *HTTP
}

// Options choose what to suggest policy for, and how.
type Options struct {
	// Namespace, when set, limits the policies to workloads of that namespace (their
	// peers may be anywhere).
	Namespace string
	// Endpoints (ns/name), when set, limits the policies to the workloads of those
	// endpoints.
	Endpoints []string
	// L7 adds the HTTP requests seen as CiliumNetworkPolicy HTTP rules, on the
	// destinations' ingress, for the ports where the L7 proxy saw requests.
	L7 bool
	// Audit annotates every policy with AuditAnnotation.
	Audit bool
	// CIDRs are prefixes to admit an address outside the cluster by, instead of its /32
	// (or /128): an address in one of them is admitted by the smallest that holds it.
	CIDRs []netip.Prefix
}

// Policy is one suggested policy.
type Policy struct {
	Kind, Namespace, Name string
	// YAML is the manifest, one document.
	YAML []byte
}

// Result is what Suggest found.
type Result struct {
	Policies []Policy
	// Dropped lists the distinct drops in the flows given ("SRC -> DST PORT/PROTO
	// (reason, N times)"): the policies do not admit them.
	Dropped []string
	// Notes list what was left out, and why.
	Notes []string
	// Flows is how many flows were read; From and To bound their times.
	Flows    int
	From, To time.Time
}

// Suggest computes policies that admit exactly the allowed traffic among flows.
func Suggest(flows []Flow, endpoints []Endpoint, opts Options) (Result, error) {
	for _, k := range opts.Endpoints {
		if ns, name, ok := strings.Cut(k, "/"); !ok || ns == "" || name == "" {
			return Result{}, fmt.Errorf("endpoint %q: want NAMESPACE/NAME", k)
		}
	}
	for _, p := range opts.CIDRs {
		if !p.IsValid() {
			return Result{}, fmt.Errorf("invalid prefix %v", p)
		}
	}
	s := newState(endpoints, opts)
	res := Result{Flows: len(flows)}
	drops := map[string]int{}
	notes := map[string]bool{}
	for _, f := range flows {
		if res.From.IsZero() || f.Time.Before(res.From) {
			res.From = f.Time
		}
		if f.Time.After(res.To) {
			res.To = f.Time
		}
		if f.Source.isEndpoint() {
			s.learn(f.Source)
		}
		if f.Dest.isEndpoint() {
			s.learn(f.Dest)
		}
	}
	s.group()
	// A connection is one flow at each end that has policy: forwarded out of its source
	// and dropped into its destination, it did not happen, and admitting it from the
	// forwarded end would open what policy denied.
	droppedConns := map[connKey]bool{}
	for _, f := range flows {
		if f.Verdict == VerdictDropped && f.HTTP == nil {
			droppedConns[connOf(f)] = true
		}
	}
	for _, f := range flows {
		if f.Verdict != VerdictDropped && f.HTTP == nil && droppedConns[connOf(f)] {
			notes["connections forwarded at one end and dropped at the other are not admitted (they are listed as drops)"] = true
			continue
		}
		if f.Verdict == VerdictDropped {
			drops[dropLine(f)]++
			if f.HTTP != nil && !opts.L7 {
				notes["HTTP requests were refused by L7 rules (listed above), yet these policies admit their ports at L3/L4: suggest with --l7 to keep them refused"] = true
			}
			continue
		}
		if note := s.add(f); note != "" {
			notes[note] = true
		}
	}
	for l, n := range drops {
		if n > 1 {
			l += fmt.Sprintf(", %d times", n)
		}
		res.Dropped = append(res.Dropped, l+")")
	}
	sort.Strings(res.Dropped)
	for n := range notes {
		res.Notes = append(res.Notes, n)
	}
	pols, more := s.policies()
	res.Notes = append(res.Notes, more...)
	sort.Strings(res.Notes)
	res.Policies = pols
	return res, nil
}

// connKey names a connection by its addresses, ports and protocol.
type connKey struct {
	proto            string
	src, dst         string
	srcPort, dstPort uint16
}

func connOf(f Flow) connKey {
	return connKey{f.Protocol, f.Source.IP, f.Dest.IP, f.SourcePort, f.Port}
}

// dropLine describes a drop, without its count and closing parenthesis.
func dropLine(f Flow) string {
	what := portString(port{f.Protocol, f.Port})
	if f.HTTP != nil {
		what += " " + f.HTTP.Method + " " + f.HTTP.Path
	}
	reason := f.Reason
	if reason == "" {
		reason = "dropped"
	}
	return fmt.Sprintf("%s -> %s %s (%s", f.Source, f.Dest, what, reason)
}

// port is a destination port of a protocol, or an ICMP type.
type port struct {
	Proto string
	Port  uint16
}

func (p port) icmp() bool { return p.Proto == "ICMP" || p.Proto == "ICMPv6" }

func portString(p port) string {
	if p.icmp() {
		return fmt.Sprintf("%s type %d", p.Proto, p.Port)
	}
	return fmt.Sprintf("%d/%s", p.Port, p.Proto)
}

func comparePorts(a, b port) int {
	if c := strings.Compare(a.Proto, b.Proto); c != 0 {
		return c
	}
	return int(a.Port) - int(b.Port)
}

// workload is the endpoints of one namespace with the same stable labels.
type workload struct {
	ns        string
	stable    map[string]string
	endpoints []string // names, sorted
	id        string   // ns + "/" + stable labels, sorted
}

// peerKey is a peer of a policy: a workload, an entity or a prefix.
type peerKey struct {
	workload string // workload id
	entity   string
	cidr     string
}

// state is the workloads and what was seen of each.
type state struct {
	opts      Options
	endpoints map[string]Endpoint // by key
	workloads map[string]*workload
	byEp      map[string]*workload // endpoint key -> its workload
	// ingress[w][peer][port] and egress likewise: the HTTP requests seen ("METHOD PATH"),
	// empty for traffic seen at L3/L4 only.
	ingress, egress map[string]map[peerKey]map[port]map[HTTP]bool
	// l7Ports[w] are the ports of workload w where the proxy saw requests.
	l7Ports map[string]map[port]bool
}

func newState(eps []Endpoint, opts Options) *state {
	s := &state{opts: opts, endpoints: map[string]Endpoint{}, workloads: map[string]*workload{}, byEp: map[string]*workload{},
		ingress: map[string]map[peerKey]map[port]map[HTTP]bool{}, egress: map[string]map[peerKey]map[port]map[HTTP]bool{},
		l7Ports: map[string]map[port]bool{}}
	for _, e := range eps {
		s.endpoints[e.Key()] = e
	}
	return s
}

// learn adds an endpoint seen in a flow that the endpoint list lacks (deleted since, or on
// another node), with its own labels from its identity's.
func (s *state) learn(p Peer) {
	k := p.Namespace + "/" + p.Name
	if _, ok := s.endpoints[k]; ok {
		return
	}
	own := map[string]string{}
	for _, l := range p.Labels {
		key, v, ok := strings.Cut(l, "=")
		if !ok || strings.HasPrefix(key, "io.kubernetes.") || strings.HasPrefix(key, "io.cilium.") {
			continue // namespace, namespace labels, service account, cluster
		}
		own[key] = v
	}
	s.endpoints[k] = Endpoint{Namespace: p.Namespace, Name: p.Name, Labels: own}
}

// stableLabels are an endpoint's labels less the per-pod keys.
func stableLabels(l map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		if !slices.Contains(PerPodKeys, k) {
			out[k] = v
		}
	}
	return out
}

// labelString is k=v,k=v, sorted.
func labelString(l map[string]string) string { return labels.Labels(l).String() }

// sortedKeys keeps every walk over a map in one order: the output must not depend on
// Go's map order.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// group puts every endpoint in its workload.
func (s *state) group() {
	for _, k := range sortedKeys(s.endpoints) {
		e := s.endpoints[k]
		st := stableLabels(e.Labels)
		id := e.Namespace + "/" + labelString(st)
		w, ok := s.workloads[id]
		if !ok {
			w = &workload{ns: e.Namespace, stable: st, id: id}
			s.workloads[id] = w
		}
		w.endpoints = append(w.endpoints, e.Name)
		s.byEp[k] = w
	}
}

// wanted reports whether policies are asked for workload w.
func (s *state) wanted(w *workload) bool {
	if s.opts.Namespace != "" && w.ns != s.opts.Namespace {
		return false
	}
	if len(s.opts.Endpoints) == 0 {
		return true
	}
	for _, k := range s.opts.Endpoints {
		if s.byEp[k] == w {
			return true
		}
	}
	return false
}

// peerOf is the policy peer for one side of a flow; note says why there is none.
func (s *state) peerOf(p Peer) (peerKey, string) {
	if p.isEndpoint() {
		return peerKey{workload: s.byEp[p.Namespace+"/"+p.Name].id}, ""
	}
	switch e := p.entity(); e {
	case "world", "":
		a, err := netip.ParseAddr(p.IP)
		if err != nil {
			return peerKey{}, fmt.Sprintf("a peer with no address or identity (%s) is left out", p)
		}
		return peerKey{cidr: s.prefixOf(a).String()}, ""
	case "unmanaged":
		return peerKey{}, fmt.Sprintf("traffic of unmanaged addresses (%s) is left out: no policy names them but by address", p.IP)
	default:
		return peerKey{entity: e}, ""
	}
}

// prefixOf is the smallest of the user's prefixes that holds a, else a alone.
func (s *state) prefixOf(a netip.Addr) netip.Prefix {
	best := netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
	found := false
	for _, p := range s.opts.CIDRs {
		if p.Contains(a.Unmap()) && (!found || p.Bits() > best.Bits()) {
			best, found = p.Masked(), true
		}
	}
	return best
}

// add records an allowed flow; it returns a note when the flow cannot be admitted.
func (s *state) add(f Flow) string {
	p := port{f.Protocol, f.Port}
	switch f.Protocol {
	case "TCP", "UDP", "SCTP", "ICMP", "ICMPv6":
	default:
		return fmt.Sprintf("%s traffic (%s -> %s) is left out: policies admit TCP, UDP, SCTP and ICMP only", f.Protocol, f.Source, f.Dest)
	}
	if f.HTTP != nil && !s.opts.L7 {
		return "" // the request's connection was seen as a flow of its own
	}
	if f.Dest.isEndpoint() {
		w := s.byEp[f.Dest.Namespace+"/"+f.Dest.Name]
		peer, note := s.peerOf(f.Source)
		if note != "" {
			return note
		}
		record(s.ingress, w.id, peer, p, f.HTTP)
		if f.HTTP != nil {
			if s.l7Ports[w.id] == nil {
				s.l7Ports[w.id] = map[port]bool{}
			}
			s.l7Ports[w.id][p] = true
		}
	}
	if f.Source.isEndpoint() && f.HTTP == nil {
		w := s.byEp[f.Source.Namespace+"/"+f.Source.Name]
		peer, note := s.peerOf(f.Dest)
		if note != "" {
			return note
		}
		record(s.egress, w.id, peer, p, nil)
	}
	return ""
}

func record(m map[string]map[peerKey]map[port]map[HTTP]bool, w string, peer peerKey, p port, h *HTTP) {
	if m[w] == nil {
		m[w] = map[peerKey]map[port]map[HTTP]bool{}
	}
	if m[w][peer] == nil {
		m[w][peer] = map[port]map[HTTP]bool{}
	}
	if m[w][peer][p] == nil {
		m[w][peer][p] = map[HTTP]bool{}
	}
	if h != nil {
		m[w][peer][p][*h] = true
	}
}
