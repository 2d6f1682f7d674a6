package agent

import (
	"fmt"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/l7table"
	"github.com/rampartnet/rampart/internal/sockverdict"
)

// The send-side L7 verdict in the agent (Config.L7SendSide; docs/internals/l7-send-side.md):
//
//   - After every change, sockPairs goes through each pair of local endpoints and port
//     with L7 rules: a pair is listed when l7table compiles what the proxy plan says about
//     its requests into a table the kernel matches exactly. Pairs whose rules it cannot
//     match stay on the proxy.
//   - The dataplane writes a listed pair's table and the targets of its two sockets before
//     tc sends the pair's new connections straight to the server. When a pair stops being
//     listed, tc stops first; its open connections keep their slot, whose table becomes
//     what the proxy would now decide for them (the plan with the old state's chains kept:
//     every request passes when L7 rules no longer apply but L3/L4 still allows, none when
//     nothing allows them or the new rules cannot be matched in the kernel). Such a
//     retired slot is not given to another pair while connections hold it.
//   - Requests the verdict decided on become L7 flows like the proxy's access logs.

// SendSide is the send-side L7 verdict (also used by namespaces.go and memory.go).
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

// sockPairs computes, for every ordered pair of local IPv4 endpoints and port with a
// chain in the plan of the change (pl.kept: new's, keeping old's chains), what the
// send-side verdict does: listed (Listed, with the table of new's plan) when the table
// compiles and restricts something; otherwise the table the pair's open connections get if
// it was listed before (nil: refuse everything).
func sockPairs(m *model, pl l7Plans, net Network) []SockPair {
	plan, kept := pl.plan, pl.kept
	if len(kept.Chains) == 0 {
		return nil
	}
	var ports []uint16
	for _, c := range kept.Chains {
		if !slices.Contains(ports, c.Port) {
			ports = append(ports, c.Port)
		}
	}
	slices.Sort(ports)
	var eps []*EndpointRecord
	for _, k := range sortedKeys(m.endpoints) {
		if e := m.endpoints[k]; e.IP.Is4() {
			eps = append(eps, e)
		}
	}
	var pairs []SockPair
	for _, port := range ports {
		for _, c := range eps {
			for _, s := range eps {
				if c == s || kept.Chain(c.IP, s.IP, port) == nil {
					continue
				}
				p := SockPair{
					Client: c.IP, Server: s.IP, ClientEpID: c.EpID, ServerEpID: s.EpID, Port: port,
					ClientNetns: endpointNetnsPath(net, c),
					ServerNetns: endpointNetnsPath(net, s),
				}
				if t, err := l7table.Compile(plan, c.IP, s.IP, port); err == nil && restricts(t) {
					p.Table, p.Listed = t, true
				} else if t, err := l7table.Compile(kept, c.IP, s.IP, port); err == nil {
					p.Table = t
				}
				pairs = append(pairs, p)
			}
		}
	}
	return pairs
}

// restricts says whether a table is worth listing: some side has rules, and no side
// refuses everything (a peer without grants, whose connections the dataplane refuses at
// L3/L4 before any request).
func restricts(t *l7table.Table) bool {
	some := false
	for side := range t.Rules {
		switch {
		case t.Header.Pass[side] != 0:
		case len(t.Rules[side]) == 0:
			return false
		default:
			some = true
		}
	}
	return some
}

// applySendSide gives the dataplane the pairs of the change's plans (none listed when the
// option is off).
func (a *Agent) applySendSide(m *model, pl l7Plans) error {
	var pairs []SockPair
	if a.cfg.L7SendSide {
		pairs = sockPairs(m, pl, a.net)
	}
	if err := a.dp.ApplySockPairs(pairs); err != nil {
		return fmt.Errorf("send-side L7 verdict: %w", err)
	}
	return nil
}

// readSockRequests publishes the send-side verdict's requests as L7 flows.
func (a *Agent) readSockRequests(done chan<- struct{}) {
	defer close(done)
	for {
		l, err := a.dp.ReadSockRequest()
		if err != nil {
			return
		}
		a.onAccessLog(l)
	}
}
