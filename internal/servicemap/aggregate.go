package servicemap

import (
	"cmp"
	"container/list"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rampartnet/rampart/internal/api"
)

// Default bounds of the aggregation.
const (
	DefaultMaxEdges = 1000
	DefaultMaxFlows = 500
	// maxEdgeDetails bounds the distinct details (ports, reasons, rules, L7 requests) one
	// edge keeps over all its verdicts: with MaxEdges it bounds the map's memory whatever
	// the traffic (a scan of every port, a crawler's every path). Later ones are counted
	// in the edge's Omitted.
	maxEdgeDetails = 32
	// maxText bounds a string kept from a flow (an L7 path, a rule's description).
	maxText = 160
	// maxVerdicts bounds the verdicts an edge keeps apart (the dataplane has four).
	maxVerdicts = 8
)

// Verdicts in the order the page ranks an edge by: an edge with any drop is a dropped
// edge, whatever else went through.
var severity = []string{"DROPPED", "AUDIT", "REDIRECTED", "FORWARDED"}

func rank(verdict string) int {
	if i := slices.Index(severity, verdict); i >= 0 {
		return i
	}
	return len(severity) // a verdict newer than this build: after the known ones
}

// Edge is the traffic from one peer to another seen in recent flows.
type Edge struct {
	ID     string `json:"id"` // "SOURCE->DESTINATION", node IDs
	Source string `json:"source"`
	Dest   string `json:"destination"`
	// Verdict is the most severe of the edge's verdicts: DROPPED, AUDIT, REDIRECTED,
	// FORWARDED.
	Verdict  string    `json:"verdict"`
	Flows    uint64    `json:"flows"`
	LastSeen time.Time `json:"lastSeen"`
	// Verdicts break the flows down by verdict, most severe first.
	Verdicts []VerdictDetail `json:"verdicts"`
	// Omitted counts the details not kept past the edge's bound (the flows are counted).
	Omitted uint64 `json:"omitted,omitempty"`
}

// VerdictDetail is what an edge's flows of one verdict had in common.
type VerdictDetail struct {
	Verdict string  `json:"verdict"`
	Flows   uint64  `json:"flows"`
	Ports   []Count `json:"ports,omitempty"`   // destination port/protocol, e.g. "80/TCP"
	Reasons []Count `json:"reasons,omitempty"` // drop reasons, e.g. policy-deny
	// Rules are the rules that decided, with their policy (Kind/namespace/name). A
	// default deny names no rule: the flows it dropped have none.
	Rules []RuleCount `json:"rules,omitempty"`
	L7    []L7Count   `json:"l7,omitempty"` // HTTP requests the L7 proxy handled
}

// Count is how many flows had a value.
type Count struct {
	Value string `json:"value"`
	Count uint64 `json:"count"`
}

// RuleCount is how many flows a rule decided.
type RuleCount struct {
	Policy string `json:"policy"`
	Rule   string `json:"rule,omitempty"`
	Count  uint64 `json:"count"`
}

// L7Count is how many requests had a method, path and status.
type L7Count struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Status uint32 `json:"status"`
	Count  uint64 `json:"count"`
}

// Peer is one side of a flow as the map shows it: an endpoint or what stands for a peer
// that is not one (a reserved identity, a CIDR, an address).
type Peer struct {
	ID        string `json:"id"`                  // "ns/name" for endpoints
	Namespace string `json:"namespace,omitempty"` // "" outside the pods
	Name      string `json:"name"`
	Kind      string `json:"kind"` // endpoint, remote-endpoint, reserved, cidr, address
	IP        string `json:"ip,omitempty"`
	Node      string `json:"node,omitempty"` // the node of a remote endpoint
}

// peerOf names a flow's side: endpoints by namespace and name, other peers by their
// identity's first label (reserved:world, cidr:PREFIX) or else their address, so that an
// edge to the world is one edge, not one per address.
func peerOf(p api.FlowPeer) Peer {
	if p.Name != "" {
		kind := "endpoint"
		if p.Node != "" {
			kind = "remote-endpoint"
		}
		return Peer{ID: p.Namespace + "/" + p.Name, Namespace: p.Namespace, Name: p.Name, Kind: kind, IP: p.IP, Node: p.Node}
	}
	for _, l := range p.Labels {
		switch {
		case strings.HasPrefix(l, "reserved:"):
			return Peer{ID: l, Name: strings.TrimPrefix(l, "reserved:"), Kind: "reserved"}
		case strings.HasPrefix(l, "cidr:"):
			c, _, _ := strings.Cut(strings.TrimPrefix(l, "cidr:"), " ")
			return Peer{ID: "cidr:" + c, Name: c, Kind: "cidr"}
		}
	}
	if p.IP != "" {
		return Peer{ID: "ip:" + p.IP, Name: p.IP, Kind: "address", IP: p.IP}
	}
	return Peer{ID: "unknown", Name: "unknown", Kind: "address"}
}

// FlowRow is a flow in the page's table.
type FlowRow struct {
	Seq        uint64    `json:"seq"`
	Time       time.Time `json:"time"`
	Type       string    `json:"type"`
	Verdict    string    `json:"verdict"`
	Reason     string    `json:"reason,omitempty"`
	Direction  string    `json:"direction,omitempty"`
	Protocol   string    `json:"protocol"`
	Source     Peer      `json:"source"`
	Dest       Peer      `json:"destination"`
	SourcePort uint16    `json:"sourcePort,omitempty"`
	DestPort   uint16    `json:"destinationPort,omitempty"`
	Policy     string    `json:"policy,omitempty"`
	Rule       string    `json:"rule,omitempty"`
	L7         *L7Count  `json:"l7,omitempty"` // Count is 0
}

// Stats say how much the aggregation saw and what its bounds left out.
type Stats struct {
	FlowsSeen uint64 `json:"flowsSeen"`
	Edges     int    `json:"edges"`
	MaxEdges  int    `json:"maxEdges"`
	// EdgesEvicted counts the edges removed to make room for new ones (the least
	// recently seen first).
	EdgesEvicted uint64 `json:"edgesEvicted"`
	// DetailsOmitted counts details no edge kept (Edge.Omitted, summed, also of evicted edges).
	DetailsOmitted uint64 `json:"detailsOmitted"`
	FlowsKept      int    `json:"flowsKept"`
	MaxFlows       int    `json:"maxFlows"`
	// FlowsEvicted counts the flows the table no longer holds (FlowsSeen - FlowsKept).
	FlowsEvicted uint64 `json:"flowsEvicted"`
	// FlowsLost counts the flows the map never got: the agent's flow hub drops them for a
	// follower slower than the flows (a flood), and the map, like every follower, is told.
	FlowsLost uint64 `json:"flowsLost"`
}

// Aggregator folds flows into edges and keeps the last flows, within its bounds. It is
// safe for concurrent use.
type Aggregator struct {
	mu       sync.Mutex
	maxEdges int
	edges    map[string]*edge
	lru      *list.List // of *edge, most recently seen at the front
	rows     []FlowRow  // ring of the last flows
	next     int        // where the next row goes
	stats    Stats
}

type edge struct {
	src, dst Peer
	elem     *list.Element
	flows    uint64
	last     time.Time
	details  int // distinct details kept, over all verdicts
	omitted  uint64
	verdicts map[string]*verdictAgg
}

type ruleKey struct{ policy, rule string }

type l7Key struct {
	method, path string
	status       uint32
}

type verdictAgg struct {
	flows   uint64
	ports   map[string]uint64
	reasons map[string]uint64
	rules   map[ruleKey]uint64
	l7      map[l7Key]uint64
}

// NewAggregator returns an aggregator with room for maxEdges edges and maxFlows flows (0:
// the defaults).
func NewAggregator(maxEdges, maxFlows int) *Aggregator {
	if maxEdges <= 0 {
		maxEdges = DefaultMaxEdges
	}
	if maxFlows <= 0 {
		maxFlows = DefaultMaxFlows
	}
	return &Aggregator{
		maxEdges: maxEdges,
		edges:    map[string]*edge{},
		lru:      list.New(),
		rows:     make([]FlowRow, 0, maxFlows),
		stats:    Stats{MaxEdges: maxEdges, MaxFlows: maxFlows},
	}
}

// Add counts f in its edge and the flow table.
func (a *Aggregator) Add(f api.Flow) {
	row := rowOf(f)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.FlowsSeen++
	row.Seq = a.stats.FlowsSeen
	if len(a.rows) < cap(a.rows) {
		a.rows = append(a.rows, row)
	} else {
		a.rows[a.next] = row
		a.stats.FlowsEvicted++
	}
	a.next = (a.next + 1) % cap(a.rows)

	e := a.edgeLocked(row.Source, row.Dest)
	e.flows++
	if row.Time.After(e.last) {
		e.last = row.Time
	}
	v := e.verdicts[row.Verdict]
	if v == nil {
		if len(e.verdicts) >= maxVerdicts {
			// Only a flood of verdicts newer than this build can get here; their flows
			// still count in the edge.
			a.omitLocked(e)
			return
		}
		v = &verdictAgg{ports: map[string]uint64{}, reasons: map[string]uint64{}, rules: map[ruleKey]uint64{}, l7: map[l7Key]uint64{}}
		e.verdicts[row.Verdict] = v
	}
	v.flows++
	if row.DestPort != 0 {
		countDetail(a, e, v.ports, strconv.Itoa(int(row.DestPort))+"/"+row.Protocol)
	}
	if row.Reason != "" {
		countDetail(a, e, v.reasons, row.Reason)
	}
	if row.Policy != "" {
		countDetail(a, e, v.rules, ruleKey{row.Policy, row.Rule})
	}
	if row.L7 != nil {
		countDetail(a, e, v.l7, l7Key{row.L7.Method, row.L7.Path, row.L7.Status})
	}
}

// Lost counts n flows the map never got.
func (a *Aggregator) Lost(n uint64) {
	a.mu.Lock()
	a.stats.FlowsLost += n
	a.mu.Unlock()
}

// countDetail counts k in m, within the edge's bound on details; a.mu must be held.
func countDetail[K comparable](a *Aggregator, e *edge, m map[K]uint64, k K) {
	if _, ok := m[k]; !ok {
		if !e.room(1) {
			a.omitLocked(e)
			return
		}
		e.details++
	}
	m[k]++
}

func (a *Aggregator) omitLocked(e *edge) {
	e.omitted++
	a.stats.DetailsOmitted++
}

func (e *edge) room(n int) bool { return e.details+n <= maxEdgeDetails }

// edgeLocked returns the edge src->dst, created (the least recently seen one evicted when
// the map is full) if it is new, and marks it the most recently seen.
func (a *Aggregator) edgeLocked(src, dst Peer) *edge {
	id := src.ID + "->" + dst.ID
	if e, ok := a.edges[id]; ok {
		a.lru.MoveToFront(e.elem)
		// The latest names win: an address that became an endpoint's is shown as it.
		e.src, e.dst = src, dst
		return e
	}
	if len(a.edges) >= a.maxEdges {
		old := a.lru.Back().Value.(*edge)
		a.lru.Remove(old.elem)
		delete(a.edges, old.src.ID+"->"+old.dst.ID)
		a.stats.EdgesEvicted++
	}
	e := &edge{src: src, dst: dst, verdicts: map[string]*verdictAgg{}}
	e.elem = a.lru.PushFront(e)
	a.edges[id] = e
	return e
}

// Edges returns the edges, the most severe first and then by ID, with the peers they
// name, and the stats.
func (a *Aggregator) Edges() ([]Edge, []Peer, Stats) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Edge, 0, len(a.edges))
	peers := map[string]Peer{}
	for id, e := range a.edges {
		peers[e.src.ID], peers[e.dst.ID] = e.src, e.dst
		ed := Edge{ID: id, Source: e.src.ID, Dest: e.dst.ID, Flows: e.flows, LastSeen: e.last, Omitted: e.omitted}
		for verdict, v := range e.verdicts {
			ed.Verdicts = append(ed.Verdicts, v.detail(verdict))
		}
		slices.SortFunc(ed.Verdicts, func(x, y VerdictDetail) int {
			return cmp.Or(cmp.Compare(rank(x.Verdict), rank(y.Verdict)), cmp.Compare(x.Verdict, y.Verdict))
		})
		if len(ed.Verdicts) > 0 {
			ed.Verdict = ed.Verdicts[0].Verdict
		}
		out = append(out, ed)
	}
	slices.SortFunc(out, func(x, y Edge) int {
		return cmp.Or(cmp.Compare(rank(x.Verdict), rank(y.Verdict)), cmp.Compare(x.ID, y.ID))
	})
	st := a.stats
	st.Edges, st.FlowsKept = len(a.edges), len(a.rows)
	ps := make([]Peer, 0, len(peers))
	for _, p := range peers {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(x, y Peer) int { return cmp.Compare(x.ID, y.ID) })
	return out, ps, st
}

func (v *verdictAgg) detail(verdict string) VerdictDetail {
	d := VerdictDetail{Verdict: verdict, Flows: v.flows, Ports: counts(v.ports), Reasons: counts(v.reasons)}
	for k, n := range v.rules {
		d.Rules = append(d.Rules, RuleCount{Policy: k.policy, Rule: k.rule, Count: n})
	}
	slices.SortFunc(d.Rules, func(x, y RuleCount) int {
		return cmp.Or(cmp.Compare(y.Count, x.Count), cmp.Compare(x.Policy, y.Policy), cmp.Compare(x.Rule, y.Rule))
	})
	for k, n := range v.l7 {
		d.L7 = append(d.L7, L7Count{Method: k.method, Path: k.path, Status: k.status, Count: n})
	}
	slices.SortFunc(d.L7, func(x, y L7Count) int {
		return cmp.Or(cmp.Compare(y.Count, x.Count), cmp.Compare(x.Path, y.Path), cmp.Compare(x.Method, y.Method), cmp.Compare(x.Status, y.Status))
	})
	return d
}

// counts lists m, the largest count first.
func counts(m map[string]uint64) []Count {
	out := make([]Count, 0, len(m))
	for k, n := range m {
		out = append(out, Count{Value: k, Count: n})
	}
	slices.SortFunc(out, func(x, y Count) int { return cmp.Or(cmp.Compare(y.Count, x.Count), cmp.Compare(x.Value, y.Value)) })
	return out
}

// FlowQuery selects rows of the flow table; empty fields match everything.
type FlowQuery struct {
	Namespace string // either side's namespace
	Pod       string // part of either side's ID ("ns/name", "reserved:world", ...)
	Verdict   string // case does not matter
	Port      uint16 // either port
	Limit     int    // the newest Limit rows (0: all kept)
}

func (q FlowQuery) match(r *FlowRow) bool {
	if q.Namespace != "" && r.Source.Namespace != q.Namespace && r.Dest.Namespace != q.Namespace {
		return false
	}
	if q.Pod != "" && !strings.Contains(r.Source.ID, q.Pod) && !strings.Contains(r.Dest.ID, q.Pod) {
		return false
	}
	if q.Verdict != "" && !strings.EqualFold(q.Verdict, r.Verdict) {
		return false
	}
	return q.Port == 0 || r.SourcePort == q.Port || r.DestPort == q.Port
}

// Flows returns the kept flows q selects, the newest first, and the stats.
func (a *Aggregator) Flows(q FlowQuery) ([]FlowRow, Stats) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []FlowRow
	n := len(a.rows)
	for i := 0; i < n; i++ {
		// Newest first: the row before next, backwards around the ring.
		r := &a.rows[(a.next-1-i+2*n)%n]
		if !q.match(r) {
			continue
		}
		out = append(out, *r)
		if q.Limit > 0 && len(out) == q.Limit {
			break
		}
	}
	st := a.stats
	st.Edges, st.FlowsKept = len(a.edges), len(a.rows)
	return out, st
}

func rowOf(f api.Flow) FlowRow {
	r := FlowRow{
		Time: f.Time, Type: f.Type, Verdict: f.Verdict, Reason: f.Reason, Direction: f.Direction,
		Protocol: f.Protocol, Source: peerOf(f.Source), Dest: peerOf(f.Dest),
		SourcePort: f.Source.Port, DestPort: f.Dest.Port,
	}
	if f.Rule != nil {
		r.Policy, r.Rule = clip(f.Rule.Policy), clip(f.Rule.Rule)
		if r.Policy == "" {
			// A rule the agent no longer knows (its policy was deleted since).
			r.Policy = "rule " + strconv.FormatUint(uint64(f.Rule.ID), 10)
		}
	}
	if f.Rule == nil && len(f.DefaultDenyBy) > 0 {
		// A default deny decided by no rule: the policies that make the endpoint enforce
		// the direction are what decided.
		r.Policy, r.Rule = clip(strings.Join(f.DefaultDenyBy, ", ")), "default deny"
	}
	if f.L7 != nil {
		r.L7 = &L7Count{Method: clip(f.L7.Method), Path: clip(f.L7.Path), Status: f.L7.Status}
	}
	return r
}

// clip bounds a string taken from traffic (an L7 path) to maxText bytes.
func clip(s string) string {
	if len(s) <= maxText {
		return s
	}
	return strings.ToValidUTF8(s[:maxText], "") + "…"
}
