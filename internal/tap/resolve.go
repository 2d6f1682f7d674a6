package tap

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/rampartnet/rampart/internal/labels"
)

// Endpoint is what resolution needs to know of an endpoint, local or on another node.
type Endpoint struct {
	Namespace string
	Name      string
	// Labels is the full label set (labels.ForPod): selectors match it.
	Labels labels.Labels
	Addrs  []netip.Addr
	// Monitor: the endpoint was made a monitor (it receives and returns tapped traffic on
	// interfaces of its own, and is never tapped itself).
	Monitor bool
	// Node is the node it runs on; "" is this node. NodeAddr is that node's address
	// (remote endpoints: where copies for a monitor go).
	Node     string
	NodeAddr netip.Addr
	// ID is the dataplane's endpoint id (local endpoints), carried into rules as is.
	ID uint32
	// Down says why a monitor that exists cannot take what is sent to it ("" when it
	// can), such as a monitor process that is not reading: it is then unavailable.
	Down string
}

// Key is "namespace/name".
func (e *Endpoint) Key() string { return e.Namespace + "/" + e.Name }

// Effect is what the dataplane does with a packet a rule matches.
type Effect uint8

const (
	// EffectMirror: deliver the packet and send a copy to the monitor.
	EffectMirror Effect = iota + 1
	// EffectRedirect: send the packet through the monitor (receive interface); what the
	// monitor returns (return interface) continues to its destination.
	EffectRedirect
	// EffectDrop: a redirect whose monitor is unavailable, failing closed.
	EffectDrop
	// EffectPass: deliver untapped: a redirect whose monitor is unavailable, failing open
	// by explicit setting, or a mirror without its monitor (each packet is a copy lost).
	EffectPass
)

func (e Effect) String() string {
	switch e {
	case EffectMirror:
		return "mirror"
	case EffectRedirect:
		return "redirect"
	case EffectDrop:
		return "drop"
	case EffectPass:
		return "pass"
	}
	return "none"
}

// MonitorRef is a contract's monitor as resolved.
type MonitorRef struct {
	Namespace string
	Name      string
	Node      string     // "" this node
	NodeAddr  netip.Addr // the node's address (another node)
	ID        uint32     // the dataplane's endpoint id when local
	Addrs     []netip.Addr
}

// Rule is one contract on one endpoint, what a dataplane installs. An endpoint's rules are
// numbered from 0 in the order of their contracts' names; a packet takes the first rule
// it matches (contracts on one endpoint are refused when their matches overlap, so the
// order only matters after a relabel made two of them meet, see Resolution.Conflicts).
type Rule struct {
	Endpoint   string // "namespace/name"
	EndpointID uint32
	Index      int
	Contract   string
	Match      Match
	Action     Action
	FailMode   FailMode
	// Monitor is nil when the monitor is unavailable (missing, or not a monitor).
	Monitor *MonitorRef
	Effect  Effect
}

// Conflict is two contracts that can both match one packet of an endpoint.
type Conflict struct {
	Endpoint string
	A, B     string // contract names, A < B
}

func (c Conflict) String() string {
	return fmt.Sprintf("tap contracts %s and %s overlap on endpoint %s", c.A, c.B, c.Endpoint)
}

// Status is a contract's state after resolution.
type Status struct {
	// Endpoints are the local endpoints it taps, sorted.
	Endpoints []string
	// Monitor is the monitor, nil when unavailable.
	Monitor *MonitorRef
	// MonitorProblem says why the monitor is unavailable ("" when it is available).
	MonitorProblem string
}

// Resolution is the contracts resolved against the endpoints of a moment.
type Resolution struct {
	// Rules in endpoint key order, then index order.
	Rules []Rule
	// Status by contract name, for every contract given.
	Status map[string]Status
	// Conflicts between contracts whose matches overlap on an endpoint both select, sorted.
	Conflicts []Conflict
}

// RulesEqual reports whether two resolutions would install the same rules.
func (r Resolution) RulesEqual(o Resolution) bool {
	return slices.EqualFunc(r.Rules, o.Rules, ruleEqual)
}

func ruleEqual(a, b Rule) bool {
	if a.Endpoint != b.Endpoint || a.EndpointID != b.EndpointID || a.Index != b.Index || a.Contract != b.Contract ||
		a.Action != b.Action || a.FailMode != b.FailMode || a.Effect != b.Effect || !matchEqual(a.Match, b.Match) {
		return false
	}
	if (a.Monitor == nil) != (b.Monitor == nil) {
		return false
	}
	if a.Monitor == nil {
		return true
	}
	m, n := a.Monitor, b.Monitor
	return m.Namespace == n.Namespace && m.Name == n.Name && m.Node == n.Node && m.NodeAddr == n.NodeAddr && m.ID == n.ID && slices.Equal(m.Addrs, n.Addrs)
}

func matchEqual(a, b Match) bool {
	return a.Direction == b.Direction && a.Protocol == b.Protocol &&
		slices.Equal(a.PeerCIDRs, b.PeerCIDRs) && slices.Equal(a.Ports, b.Ports) && slices.Equal(a.PeerPorts, b.PeerPorts) &&
		ptrEqual(a.ICMPType, b.ICMPType) && ptrEqual(a.ICMPCode, b.ICMPCode)
}

func ptrEqual(a, b *uint8) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// Selects reports whether the contract's source selects e. Monitors are never selected:
// tapping a monitor's traffic would send its own input back to it.
func (c *Contract) Selects(e *Endpoint) bool {
	if e.Monitor {
		return false
	}
	if c.Source.Endpoint != "" {
		return mustKey(c.Source.Endpoint) == e.Key()
	}
	return c.Source.Selector.Matches(e.Labels)
}

// Resolve computes the rules of every local endpoint (Node == node) from the contracts
// and the endpoints (local and remote, for monitors). The result depends only on its
// input, in a deterministic order.
//
// A contract whose monitor is missing, is not a monitor or is down resolves with Monitor nil: its
// rules' Effect is EffectDrop for a redirect failing closed and EffectPass otherwise.
func Resolve(contracts []*Contract, endpoints []Endpoint, node string) Resolution {
	cs := slices.Clone(contracts)
	sort.Slice(cs, func(i, j int) bool { return cs[i].Name < cs[j].Name })
	byKey := make(map[string]*Endpoint, len(endpoints))
	var local []*Endpoint
	for i := range endpoints {
		e := &endpoints[i]
		byKey[e.Key()] = e
		if e.Node == node {
			local = append(local, e)
		}
	}
	sort.Slice(local, func(i, j int) bool { return local[i].Key() < local[j].Key() })

	res := Resolution{Status: make(map[string]Status, len(cs))}
	monitors := make([]*MonitorRef, len(cs))
	for i, c := range cs {
		st := Status{}
		key := mustKey(c.Monitor)
		switch m, ok := byKey[key]; {
		case !ok:
			st.MonitorProblem = fmt.Sprintf("monitor %s does not exist", key)
		case !m.Monitor:
			st.MonitorProblem = fmt.Sprintf("endpoint %s is not a monitor", key)
		case m.Down != "":
			st.MonitorProblem = fmt.Sprintf("monitor %s is %s", key, m.Down)
		case m.Node != node && c.Action == Redirect:
			// Diverted packets come back from the monitor with the identity they left
			// with; only the source's node knows it (the copy's tunnel key has no room).
			st.MonitorProblem = fmt.Sprintf("monitor %s runs on node %s: a redirect goes through a monitor on its source's node only", key, m.Node)
		default:
			monitors[i] = &MonitorRef{Namespace: m.Namespace, Name: m.Name, Node: m.Node, NodeAddr: m.NodeAddr, ID: m.ID, Addrs: slices.Clone(m.Addrs)}
			if m.Node != node {
				monitors[i].ID = 0 // another node's number means nothing here
			} else {
				monitors[i].Node, monitors[i].NodeAddr = "", netip.Addr{}
			}
		}
		st.Monitor = monitors[i]
		res.Status[c.Name] = st
	}
	for _, e := range local {
		var on []int // contracts selecting e, by position in cs
		for i, c := range cs {
			if c.Selects(e) {
				on = append(on, i)
			}
		}
		for n, i := range on {
			c := cs[i]
			st := res.Status[c.Name]
			st.Endpoints = append(st.Endpoints, e.Key())
			res.Status[c.Name] = st
			res.Rules = append(res.Rules, Rule{
				Endpoint:   e.Key(),
				EndpointID: e.ID,
				Index:      n,
				Contract:   c.Name,
				Match:      c.Match,
				Action:     c.Action,
				FailMode:   c.FailMode,
				Monitor:    monitors[i],
				Effect:     effect(c, monitors[i] != nil),
			})
			for _, j := range on[:n] {
				if Overlaps(cs[j].Match, c.Match) {
					res.Conflicts = append(res.Conflicts, Conflict{Endpoint: e.Key(), A: cs[j].Name, B: c.Name})
				}
			}
		}
	}
	return res
}

func effect(c *Contract, monitor bool) Effect {
	switch {
	case monitor && c.Action == Mirror:
		return EffectMirror
	case monitor:
		return EffectRedirect
	case c.Action == Redirect && c.FailMode == FailClosed:
		return EffectDrop
	}
	return EffectPass
}

// OverlapError refuses a change that would make two contracts overlap on an endpoint.
type OverlapError struct {
	Conflicts []Conflict
}

func (e *OverlapError) Error() string {
	c := e.Conflicts[0]
	msg := fmt.Sprintf("tap contracts %s and %s overlap on endpoint %s: both can match one packet (a packet may be tapped by one contract only; make their matches disjoint)", c.A, c.B, c.Endpoint)
	if n := len(e.Conflicts) - 1; n > 0 {
		msg += fmt.Sprintf(" (and %d more overlap%s)", n, plural(n))
	}
	return msg
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// NamedConflicts are the overlaps of contracts that name the same source endpoint,
// whether or not it exists: such contracts will meet whenever it does, so they can be
// refused before it exists. Sorted like Resolution.Conflicts.
func NamedConflicts(contracts []*Contract) []Conflict {
	cs := slices.Clone(contracts)
	sort.Slice(cs, func(i, j int) bool { return cs[i].Name < cs[j].Name })
	var out []Conflict
	for i, a := range cs {
		for _, b := range cs[i+1:] {
			if a.Source.Endpoint != "" && mustKey(a.Source.Endpoint) == mustKey(b.Source.Endpoint) && Overlaps(a.Match, b.Match) {
				out = append(out, Conflict{Endpoint: mustKey(a.Source.Endpoint), A: a.Name, B: b.Name})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Endpoint != out[j].Endpoint {
			return out[i].Endpoint < out[j].Endpoint
		}
		return out[i].A < out[j].A || out[i].A == out[j].A && out[i].B < out[j].B
	})
	return out
}

// CheckChanged returns an *OverlapError for the conflicts of res and of
// NamedConflicts(contracts) that involve a contract named in changed, nil if there is
// none. Conflicts between contracts that were both accepted before (a relabel made them
// meet) do not refuse an unrelated change.
func CheckChanged(res Resolution, contracts []*Contract, changed []string) error {
	var out []Conflict
	for _, c := range append(slices.Clone(res.Conflicts), NamedConflicts(contracts)...) {
		if (slices.Contains(changed, c.A) || slices.Contains(changed, c.B)) && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return &OverlapError{Conflicts: out}
}

// NodeCounters are a node's tap counts that belong to no contract.
type NodeCounters struct {
	// Rejected: packets monitors here sent that were not of a flow diverted to them
	// (dropped).
	Rejected uint64
	// RemoteDelivered and RemoteLost: copies other nodes sent to monitors here, handed to
	// the monitor or dropped (no monitor here has their key).
	RemoteDelivered, RemoteLost uint64
}

// Counters are a rule's or a contract's packet counts, as the dataplane keeps them.
type Counters struct {
	MirroredPackets   uint64
	MirroredBytes     uint64
	RedirectedPackets uint64
	RedirectedBytes   uint64
	// DroppedByMonitor: redirected packets the monitor did not return.
	DroppedByMonitor uint64
	// CopiesLost: copies the monitor could not take (mirror without monitor, or its
	// queue full).
	CopiesLost uint64
	// DroppedUnavailable: packets dropped because a fail-closed redirect's monitor was
	// unavailable.
	DroppedUnavailable uint64
}

// Add adds o's counts to c.
func (c *Counters) Add(o Counters) {
	c.MirroredPackets += o.MirroredPackets
	c.MirroredBytes += o.MirroredBytes
	c.RedirectedPackets += o.RedirectedPackets
	c.RedirectedBytes += o.RedirectedBytes
	c.DroppedByMonitor += o.DroppedByMonitor
	c.CopiesLost += o.CopiesLost
	c.DroppedUnavailable += o.DroppedUnavailable
}

// RuleKey names a rule in the dataplane's counters: the endpoint's id and the rule's
// contract (one rule per contract and endpoint). Not the rule's index, which a contract
// whose name sorts earlier shifts: counters belong to their contract.
type RuleKey struct {
	EndpointID uint32
	Contract   string
}

// Key is the rule's RuleKey.
func (r Rule) Key() RuleKey { return RuleKey{EndpointID: r.EndpointID, Contract: r.Contract} }

// PerContract sums rule counters into contract counters, by the rules of res.
func PerContract(res Resolution, rules map[RuleKey]Counters) map[string]Counters {
	out := map[string]Counters{}
	for _, r := range res.Rules {
		c := out[r.Contract]
		c.Add(rules[r.Key()])
		out[r.Contract] = c
	}
	return out
}

// String renders a rule for logs and tests.
func (r Rule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s[%d] %s %s %s", r.Endpoint, r.Index, r.Contract, r.Match, r.Effect)
	if r.Monitor != nil {
		fmt.Fprintf(&b, " -> %s/%s", r.Monitor.Namespace, r.Monitor.Name)
		if r.Monitor.Node != "" {
			b.WriteString("@" + r.Monitor.Node)
		}
	}
	return b.String()
}
