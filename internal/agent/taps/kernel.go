package taps

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/tap"
)

// Table is the dataplane's tap rules (docs/taps.md): what the resolution of the tap
// contracts against the endpoints (tap.Resolve) asks of each endpoint. The subsystem hands
// it the whole rule set whenever it changes; without one (nil) there are no taps, and tap
// contracts are refused rather than pretended to be tapped.
type Table interface {
	// ReplaceTaps makes the installed rules equal to rules (tap.Resolve's order: by
	// endpoint, then index). A rule whose Effect is tap.EffectDrop must drop what it
	// matches: a redirect whose monitor is unavailable fails closed.
	ReplaceTaps(rules []tap.Rule) error
	// TapCounters returns the counters of the installed rules.
	TapCounters() (map[tap.RuleKey]tap.Counters, error)
	// NodeTapCounters returns the node's counts that belong to no rule.
	NodeTapCounters() (tap.NodeCounters, error)
}

// Monitors gives monitor endpoints their receive and return interfaces in the dataplane
// (docs/taps.md): the tap table needs them to send copies and diverted packets, and to take
// back only what it diverted.
type Monitors interface {
	// AttachMonitor registers the host sides rx and tx (in the node namespace at netnsPath)
	// of monitor endpoint epID's veths, and its address addr, by which other nodes send
	// it copies.
	AttachMonitor(netnsPath, rx, tx string, epID uint32, addr netip.Addr) error
	// DetachMonitor forgets monitor epID's interfaces, its address and the flows diverted
	// to it.
	DetachMonitor(epID uint32) error
	// SetMonitorReading says whether monitor epID reads its receive interface: copies
	// other nodes send to one that does not are dropped and counted lost on arrival
	// (NodeCounters.RemoteLost) rather than handed to an interface nothing reads.
	SetMonitorReading(epID uint32, reading bool) error
}

// Kernel is Table and Monitors over the datapath: it turns the resolution's rules
// (tap.Rule, per endpoint and contract) into the dataplane's (datapath.TapRule, per
// direction, peer prefix and port range) and keeps the monitors' interfaces.
type Kernel struct {
	dp Dataplane

	mu       sync.Mutex
	monitors map[uint32]attachedMonitor // by monitor epID
	ids      map[uint32]tap.RuleKey     // the dataplane's contract ID -> the rule it counts
	rules    map[tap.RuleKey]uint32     // and back
}

// Dataplane is what Kernel needs of the datapath (*datapath.Taps): the
// subsystem's only view of it, so that the datapath's methods may move between its types
// with one change where the agent wires it (kernel.go's openKernel).
type Dataplane interface {
	AttachMonitor(netnsPath, rx, tx string, epID uint32) (rxIndex, txIndex uint32, err error)
	DetachMonitor(rx, tx uint32) error
	SetMonitorKey(addr netip.Addr, rx uint32) error
	DeleteMonitorKey(addr netip.Addr) error
	EndpointIfindex(epID uint32) (uint32, bool)
	TapTunnelIfindex() uint32
	ReplaceTaps(rules []datapath.TapRule) error
	ResetTapCounters(contract uint32) error
	TapCounters(contracts ...uint32) (map[uint32]datapath.TapCounters, error)
}

// attachedMonitor is a local monitor's receive and return interfaces and its address.
type attachedMonitor struct {
	rx, tx uint32
	addr   netip.Addr
	down   bool // not reading (SetMonitorReading): its key is withdrawn
}

// NewKernel is Table and Monitors over dp.
func NewKernel(dp Dataplane) *Kernel {
	return &Kernel{dp: dp, monitors: map[uint32]attachedMonitor{}, ids: map[uint32]tap.RuleKey{}, rules: map[tap.RuleKey]uint32{}}
}

func (k *Kernel) AttachMonitor(netnsPath, rx, tx string, epID uint32, addr netip.Addr) error {
	rxi, txi, err := k.dp.AttachMonitor(netnsPath, rx, tx, epID)
	if err != nil {
		return err
	}
	if addr.IsValid() {
		if err := k.dp.SetMonitorKey(addr, rxi); err != nil {
			return err
		}
	}
	k.mu.Lock()
	k.monitors[epID] = attachedMonitor{rx: rxi, tx: txi, addr: addr}
	k.mu.Unlock()
	return nil
}

func (k *Kernel) SetMonitorReading(epID uint32, reading bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	m, ok := k.monitors[epID]
	if !ok || m.down == !reading {
		return nil
	}
	if m.addr.IsValid() {
		var err error
		if reading {
			err = k.dp.SetMonitorKey(m.addr, m.rx)
		} else {
			err = k.dp.DeleteMonitorKey(m.addr)
		}
		if err != nil {
			return err
		}
	}
	m.down = !reading
	k.monitors[epID] = m
	return nil
}

func (k *Kernel) DetachMonitor(epID uint32) error {
	k.mu.Lock()
	m, ok := k.monitors[epID]
	delete(k.monitors, epID)
	k.mu.Unlock()
	if !ok {
		return nil
	}
	if m.addr.IsValid() {
		if err := k.dp.DeleteMonitorKey(m.addr); err != nil {
			return err
		}
	}
	return k.dp.DetachMonitor(m.rx, m.tx)
}

// ReplaceTaps installs rules. Each gets a contract ID of its own in the dataplane (kept
// while its contract stays on its endpoint, whatever other contracts come and go, so its
// counters go on), and expands into one dataplane rule per
// direction, peer prefix and port range. A monitor that is not on this node, or not
// attached, is down: a redirect to it drops (fails open only by its contract's setting),
// a mirror loses its copies. A mirror's monitor on another node gets its copies through
// the tap tunnel (datapath.AttachTapTunnel), addressed to its node and key.
func (k *Kernel) ReplaceTaps(rules []tap.Rule) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	ids := map[uint32]tap.RuleKey{}
	back := map[tap.RuleKey]uint32{}
	next := uint32(1)
	// Rules that stay keep their IDs; new ones take free IDs.
	for _, r := range rules {
		key := r.Key()
		if id, ok := k.rules[key]; ok {
			ids[id], back[key] = key, id
		}
	}
	var out []datapath.TapRule
	var fresh []uint32
	for _, r := range rules {
		key := r.Key()
		id, ok := back[key]
		if !ok {
			for ; ; next++ {
				if next >= datapath.MaxTapContracts {
					return fmt.Errorf("installing taps: more than %d tap rules", datapath.MaxTapContracts-1)
				}
				if _, used := ids[next]; !used {
					break
				}
			}
			id = next
			ids[id], back[key] = key, id
			fresh = append(fresh, id)
		}
		ifindex, ok := k.dp.EndpointIfindex(r.EndpointID)
		if !ok {
			return fmt.Errorf("installing taps: contract %s: endpoint %s is not installed", r.Contract, r.Endpoint)
		}
		base := datapath.TapRule{Ifindex: ifindex, ContractID: id, FailOpen: r.FailMode == tap.FailOpen}
		switch r.Action {
		case tap.Mirror:
			base.Action = datapath.TapMirror
		default:
			base.Action = datapath.TapRedirect
		}
		switch m := r.Monitor; {
		case m == nil || (r.Effect != tap.EffectMirror && r.Effect != tap.EffectRedirect):
		case m.Node == "":
			if at, ok := k.monitors[m.ID]; ok {
				base.MonitorRx, base.MonitorTx, base.MonitorUp = at.rx, at.tx, true
			}
		case r.Effect == tap.EffectMirror && m.NodeAddr.IsValid() && len(m.Addrs) > 0:
			if rx := k.dp.TapTunnelIfindex(); rx != 0 {
				base.MonitorRx, base.MonitorUp = rx, true
				base.RemoteNode, base.MonitorKey = m.NodeAddr, datapath.MonitorKeyOf(m.Addrs[0])
			}
		}
		out = append(out, expandTapRule(base, r.Match)...)
	}
	// A new rule starts from zero, not from the counts of a rule that had its ID before.
	for _, id := range fresh {
		if err := k.dp.ResetTapCounters(id); err != nil {
			return err
		}
	}
	if err := k.dp.ReplaceTaps(out); err != nil {
		return err
	}
	k.ids, k.rules = ids, back
	return nil
}

// expandTapRule is match as dataplane rules: one per direction, peer prefix and pair of
// port ranges (the model's lists are alternatives; a dataplane rule holds one of each).
// The endpoint's own side is the destination of what it receives and the source of what
// it sends.
func expandTapRule(base datapath.TapRule, m tap.Match) []datapath.TapRule {
	peers := m.PeerCIDRs
	if len(peers) == 0 {
		peers = []netip.Prefix{{}}
	}
	own, peer := portRanges(m.Ports), portRanges(m.PeerPorts)
	var out []datapath.TapRule
	for _, dir := range []tap.Direction{tap.Ingress, tap.Egress} {
		if m.Direction&dir == 0 {
			continue
		}
		for _, p := range peers {
			for _, o := range own {
				for _, q := range peer {
					r := base
					r.Protocol = policy.Protocol(m.Protocol)
					r.ICMPType, r.ICMPCode = m.ICMPType, m.ICMPCode
					if dir == tap.Ingress {
						r.Direction = policy.Ingress
						r.Source, r.SourcePorts, r.DestinationPorts = p, q, o
					} else {
						r.Direction = policy.Egress
						r.Destination, r.SourcePorts, r.DestinationPorts = p, o, q
					}
					out = append(out, r)
				}
			}
		}
	}
	return out
}

// portRanges is ranges as the dataplane's, the zero range (any port) when there are none.
func portRanges(ranges []tap.PortRange) []datapath.PortRange {
	if len(ranges) == 0 {
		return []datapath.PortRange{{}}
	}
	out := make([]datapath.PortRange, len(ranges))
	for i, r := range ranges {
		out[i] = datapath.PortRange{Lo: r.First, Hi: r.Last}
	}
	return out
}

// TapCounters reads the installed rules' counters.
func (k *Kernel) TapCounters() (map[tap.RuleKey]tap.Counters, error) {
	k.mu.Lock()
	ids := make([]uint32, 0, len(k.ids))
	keys := make(map[uint32]tap.RuleKey, len(k.ids))
	for id, key := range k.ids {
		ids = append(ids, id)
		keys[id] = key
	}
	k.mu.Unlock()
	got, err := k.dp.TapCounters(ids...)
	if err != nil {
		return nil, err
	}
	out := make(map[tap.RuleKey]tap.Counters, len(got))
	for id, c := range got {
		notBack := c.NotReturned()
		out[keys[id]] = tap.Counters{
			MirroredPackets: c.MirroredPackets, MirroredBytes: c.MirroredBytes,
			RedirectedPackets: c.RedirectedPackets, RedirectedBytes: c.RedirectedBytes,
			DroppedByMonitor: notBack, CopiesLost: c.CopiesLost, DroppedUnavailable: c.UnavailableDrops,
		}
	}
	return out, nil
}

// NodeTapCounters reads contract 0's counters: what monitors sent that was not diverted to
// them, and the copies other nodes sent to this node's monitors.
func (k *Kernel) NodeTapCounters() (tap.NodeCounters, error) {
	got, err := k.dp.TapCounters(0)
	if err != nil {
		return tap.NodeCounters{}, err
	}
	c := got[0]
	return tap.NodeCounters{Rejected: c.Rejected, RemoteDelivered: c.RemoteDelivered, RemoteLost: c.RemoteLost}, nil
}
