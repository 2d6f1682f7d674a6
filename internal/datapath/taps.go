package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/policy"
)

// Taps is the tap table (tap_sets, tap_flows and their IPv6 twins), its counters and the
// monitors' interfaces the taps send copies to and take diverted packets back from.
type Taps struct{ *handle }

// Constants mirrored from bpf/include/rampart.h (checked by TestHeaderConstants).
const (
	epTapIngress = 1 << 2
	epTapEgress  = 1 << 3
	epMonitor    = 1 << 4
	// EP_ADMIN_INGRESS, EP_ADMIN_EGRESS: the endpoint has Admin tier entries.
	epAdminIngress = 1 << 5
	epAdminEgress  = 1 << 6
	// EP_DNS_OBSERVE: the endpoint's allowed DNS queries go to the observing DNS proxy.
	epDNSObserve = 1 << 7
	epTapMask    = epTapIngress | epTapEgress
	// EP_AUDIT_*: a policy in audit mode applies to the endpoint; its audit entries are
	// under ep_id | AUDIT_EP_FLAG (auditEpFlag), and enforce the direction or not.
	epAuditIngress        = 1 << 9
	epAuditEgress         = 1 << 10
	epAuditEnforceIngress = 1 << 11
	epAuditEnforceEgress  = 1 << 12
	auditEpFlag           = 1 << 31

	tapActionMirror   = 1
	tapActionRedirect = 2

	tapFMonitorUp = 1 << 0
	tapFFailOpen  = 1 << 1
	tapFICMPType  = 1 << 2
	tapFICMPCode  = 1 << 3
	tapFRemote    = 1 << 4

	tapIfRx = 1
	tapIfTx = 2

	// MaxTapRules is how many tap rules one endpoint may have (RAMPART_TAP_RULES): the
	// dataplane tries them in order on every packet of a tapped endpoint, so the number
	// is small and fixed, which bounds both the per-packet cost and the verifier's.
	MaxTapRules = 16
	// MaxTapContracts bounds contract IDs (RAMPART_TAP_CONTRACTS): 1 .. MaxTapContracts-1.
	MaxTapContracts = 4096
)

// TapAction is what a tap does with the packets it matches.
type TapAction uint8

const (
	// TapMirror sends a copy to the monitor; the original is delivered unchanged.
	TapMirror TapAction = tapActionMirror
	// TapRedirect sends the packet through the monitor, which sends what it passes back
	// on its return interface; only then does the packet go on to its destination.
	TapRedirect TapAction = tapActionRedirect
)

func (a TapAction) String() string {
	switch a {
	case TapMirror:
		return "mirror"
	case TapRedirect:
		return "redirect"
	}
	return fmt.Sprintf("tap-action-%d", uint8(a))
}

// PortRange is an inclusive range of ports; the zero value means any port.
type PortRange struct{ Lo, Hi uint16 }

func (r PortRange) bounds() (uint16, uint16) {
	if r == (PortRange{}) {
		return 0, 0xffff
	}
	return r.Lo, r.Hi
}

// TapRule is one tap of one endpoint as the dataplane holds it: which of the endpoint's
// packets (in one direction, after its policy passed them) go to which monitor, and how.
// An endpoint's rules are tried in the order ReplaceTaps gets them; the first that matches
// decides.
type TapRule struct {
	// Ifindex is the source endpoint's host-side veth (ApplyEndpoint's key). The endpoint
	// must be installed.
	Ifindex uint32
	// Direction is policy.Egress for packets the endpoint sends, policy.Ingress for those
	// it receives.
	Direction policy.Direction
	// Protocol: policy.ProtoAny matches every protocol (and then no ports or ICMP fields).
	Protocol policy.Protocol
	// Source and Destination are the packet's addresses; the zero Prefix matches any.
	Source, Destination netip.Prefix
	// SourcePorts and DestinationPorts are the packet's ports (TCP, UDP, SCTP).
	SourcePorts, DestinationPorts PortRange
	// ICMPType and ICMPCode (ICMP only): nil matches any.
	ICMPType, ICMPCode *uint8
	Action             TapAction
	// MonitorRx is the host side of the monitor's receive veth (AttachMonitor): copies and
	// diverted packets leave the node through it. MonitorTx is the host side of its return
	// veth, required for TapRedirect.
	MonitorRx, MonitorTx uint32
	// MonitorUp says the monitor is ready. A redirect whose monitor is not up drops what it
	// matches (flow.ReasonTapMonitorUnavailable) unless FailOpen, when it passes untapped;
	// a mirror with the monitor down counts its copies as lost.
	MonitorUp bool
	FailOpen  bool
	// ContractID names the contract in TapCounters: 1 .. MaxTapContracts-1.
	ContractID uint32
	// RemoteNode, when valid, is the address of the node the monitor runs on (TapMirror
	// only): copies go there through the tap tunnel device (AttachTapTunnel), which is
	// then MonitorRx, with MonitorKeyOf(the monitor's address) as VNI.
	RemoteNode netip.Addr
	MonitorKey uint32
}

// MonitorKeyOf is the key that names a monitor on its node to the other nodes' copies: the
// low 24 bits of its address, which are unique among a node's pods as long as the node's
// pod CIDR is no wider than a /8.
func MonitorKeyOf(addr netip.Addr) uint32 {
	a := addr.Unmap().As4()
	return uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
}

// tapRulesOf converts r to its map forms: the rule for IPv4 packets and the one for IPv6
// packets (nil where the rule's prefixes are of the other family; a rule with no prefix is
// in both). ICMP is ICMPv6 in the IPv6 rule, with the same type and code: the numbers of
// the packet's family.
func tapRulesOf(r TapRule) (*rampartTapRule, *rampartTapRule6, error) {
	base, err := tapRuleOf(r)
	if err != nil {
		return nil, nil, err
	}
	fam := func(p netip.Prefix) int {
		switch {
		case !p.IsValid():
			return 0
		case p.Addr().Unmap().Is4():
			return 4
		}
		return 6
	}
	sf, df := fam(r.Source), fam(r.Destination)
	if sf != 0 && df != 0 && sf != df {
		return nil, nil, fmt.Errorf("source %v and destination %v: not of one family", r.Source, r.Destination)
	}
	var v4 *rampartTapRule
	var v6 *rampartTapRule6
	if sf != 6 && df != 6 {
		v4 = &rampartTapRule{}
		*v4 = base
		if v4.SrcAddr, v4.SrcMask, err = tapPrefix(r.Source); err != nil {
			return nil, nil, fmt.Errorf("source %w", err)
		}
		if v4.DstAddr, v4.DstMask, err = tapPrefix(r.Destination); err != nil {
			return nil, nil, fmt.Errorf("destination %w", err)
		}
	}
	if sf != 4 && df != 4 {
		v6 = &rampartTapRule6{R: base}
		if r.Protocol == policy.ProtoICMP {
			v6.R.Protocol = unix.IPPROTO_ICMPV6
		}
		v6.SrcAddr, v6.SrcMask = tapPrefix6(r.Source)
		v6.DstAddr, v6.DstMask = tapPrefix6(r.Destination)
	}
	return v4, v6, nil
}

// tapRuleOf converts r to its map form, addresses aside (tapRulesOf).
func tapRuleOf(r TapRule) (rampartTapRule, error) {
	var out rampartTapRule
	if r.Direction != policy.Ingress && r.Direction != policy.Egress {
		return out, fmt.Errorf("direction %d: want ingress or egress", r.Direction)
	}
	if r.ContractID == 0 || r.ContractID >= MaxTapContracts {
		return out, fmt.Errorf("contract ID %d: out of range 1..%d", r.ContractID, MaxTapContracts-1)
	}
	switch r.Action {
	case TapMirror, TapRedirect:
	default:
		return out, fmt.Errorf("action %d: want mirror or redirect", r.Action)
	}
	// A monitor that is down needs no interfaces: its rule drops (or, failing open,
	// passes) what it matches, and a mirror counts its copies as lost.
	if r.MonitorUp {
		if r.MonitorRx == 0 {
			return out, errors.New("no monitor receive interface")
		}
		if r.Action == TapRedirect && r.MonitorTx == 0 {
			return out, errors.New("redirect needs the monitor's return interface")
		}
		if r.Action == TapRedirect && r.MonitorTx == r.MonitorRx {
			return out, errors.New("redirect needs distinct receive and return interfaces")
		}
	}
	if r.RemoteNode.IsValid() {
		if r.Action != TapMirror {
			return out, errors.New("only a mirror sends to a monitor on another node")
		}
		if !r.RemoteNode.Unmap().Is4() {
			return out, fmt.Errorf("monitor node %v: not IPv4", r.RemoteNode)
		}
		if r.MonitorKey > 0xffffff {
			return out, fmt.Errorf("monitor key %#x: wider than a VNI", r.MonitorKey)
		}
		a := r.RemoteNode.Unmap().As4()
		out.RemoteNode = binary.NativeEndian.Uint32(a[:])
		out.MonitorKey = r.MonitorKey
		out.Flags |= tapFRemote
	}
	ports := r.SourcePorts != (PortRange{}) || r.DestinationPorts != (PortRange{})
	switch r.Protocol {
	case policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP:
		if r.ICMPType != nil || r.ICMPCode != nil {
			return out, fmt.Errorf("ICMP type or code with protocol %d", r.Protocol)
		}
	case policy.ProtoICMP:
		if ports {
			return out, errors.New("ports with protocol ICMP")
		}
	default:
		if ports || r.ICMPType != nil || r.ICMPCode != nil {
			return out, fmt.Errorf("ports or ICMP fields with protocol %d (want TCP, UDP, SCTP or ICMP)", r.Protocol)
		}
		if r.Protocol > 255 {
			return out, fmt.Errorf("protocol %d: not an IP protocol number", r.Protocol)
		}
	}
	for _, pr := range []PortRange{r.SourcePorts, r.DestinationPorts} {
		if lo, hi := pr.bounds(); lo > hi {
			return out, fmt.Errorf("port range %d-%d: empty", pr.Lo, pr.Hi)
		}
	}
	out.SportLo, out.SportHi = r.SourcePorts.bounds()
	out.DportLo, out.DportHi = r.DestinationPorts.bounds()
	out.ContractId = r.ContractID
	out.RxIfindex, out.TxIfindex = r.MonitorRx, r.MonitorTx
	out.Direction = uint8(r.Direction)
	out.Protocol = uint8(r.Protocol)
	out.Action = uint8(r.Action)
	if r.MonitorUp {
		out.Flags |= tapFMonitorUp
	}
	if r.FailOpen {
		out.Flags |= tapFFailOpen
	}
	if r.ICMPType != nil {
		out.Flags |= tapFICMPType
		out.IcmpType = *r.ICMPType
	}
	if r.ICMPCode != nil {
		out.Flags |= tapFICMPCode
		out.IcmpCode = *r.ICMPCode
	}
	return out, nil
}

// tapPrefix6 is an IPv6 prefix as address and mask words in network order (the zero
// Prefix: any).
func tapPrefix6(p netip.Prefix) (addr, mask [4]uint32) {
	if !p.IsValid() {
		return addr, mask
	}
	p = p.Masked()
	a := p.Addr().As16()
	var m [16]byte
	for i := range p.Bits() {
		m[i/8] |= 0x80 >> (i % 8)
	}
	for i := range 4 {
		addr[i] = binary.NativeEndian.Uint32(a[4*i:])
		mask[i] = binary.NativeEndian.Uint32(m[4*i:])
	}
	return addr, mask
}

// tapPrefix is an IPv4 prefix as address and mask in network order (the zero Prefix: any).
func tapPrefix(p netip.Prefix) (addr, mask uint32, err error) {
	if !p.IsValid() {
		return 0, 0, nil
	}
	if !p.Addr().Unmap().Is4() {
		return 0, 0, fmt.Errorf("prefix %v: not IPv4", p)
	}
	p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked()
	a := p.Addr().As4()
	var m [4]byte
	binary.BigEndian.PutUint32(m[:], ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		m = [4]byte{}
	}
	return binary.NativeEndian.Uint32(a[:]), binary.NativeEndian.Uint32(m[:]), nil
}

// ReplaceTaps makes rules the dataplane's complete set of tap rules. Each endpoint's rules
// are written as one tap set (a single map update, which the programs see whole) before
// its endpoint_info turns its taps on, and an endpoint that loses all its rules has its
// taps turned off before the set is deleted. Rules are checked first: an invalid rule, an
// endpoint that is not installed or one with more than MaxTapRules rules changes nothing.
// A map write that fails stops where it is, each endpoint with either its old or its new
// taps; calling again with the same rules finishes the job. An endpoint whose veth is
// recreated (another ifindex) gets its taps from the next call.
func (d *Taps) ReplaceTaps(rules []TapRule) error {
	d.mu.Lock()
	defer d.mu.Unlock()

	type epTaps struct {
		ifindex uint32
		set     rampartTapSet
		set6    rampartTapSet6
		flags   uint32
	}
	byEp := make(map[uint32]*epTaps) // by ep_id
	for i, r := range rules {
		info, ok := d.endpoints[r.Ifindex]
		if !ok {
			return fmt.Errorf("replacing taps: rule %d (contract %d): no endpoint installed on ifindex %d", i, r.ContractID, r.Ifindex)
		}
		v4, v6, err := tapRulesOf(r)
		if err != nil {
			return fmt.Errorf("replacing taps: rule %d (contract %d): %w", i, r.ContractID, err)
		}
		et := byEp[info.EpId]
		if et == nil {
			et = &epTaps{ifindex: r.Ifindex}
			byEp[info.EpId] = et
		}
		if et.ifindex != r.Ifindex {
			return fmt.Errorf("replacing taps: endpoint %d: rules on two interfaces (%d, %d)", info.EpId, et.ifindex, r.Ifindex)
		}
		if (v4 != nil && et.set.Count == MaxTapRules) || (v6 != nil && et.set6.Count == MaxTapRules) {
			return fmt.Errorf("replacing taps: endpoint %d (ifindex %d): more than %d tap rules for a family", info.EpId, r.Ifindex, MaxTapRules)
		}
		if v4 != nil {
			et.set.Rules[et.set.Count] = *v4
			et.set.Count++
		}
		if v6 != nil {
			et.set6.Rules[et.set6.Count] = *v6
			et.set6.Count++
		}
		if r.Direction == policy.Ingress {
			et.flags |= epTapIngress
		} else {
			et.flags |= epTapEgress
		}
	}

	// Rules first, then the flags that make the programs look at them.
	ids := make([]uint32, 0, len(byEp))
	for id := range byEp {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		et := byEp[id]
		if err := d.objs.TapSets.Update(&id, &et.set, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("replacing taps: writing the rules of endpoint %d: %w", id, err)
		}
		if err := d.objs.TapSets6.Update(&id, &et.set6, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("replacing taps: writing the IPv6 rules of endpoint %d: %w", id, err)
		}
		info := d.endpoints[et.ifindex]
		if info.Flags&epTapMask != et.flags {
			info.Flags = info.Flags&^epTapMask | et.flags
			if err := d.putEndpoint(et.ifindex, info); err != nil {
				return fmt.Errorf("replacing taps: %w", err)
			}
		}
	}
	// Endpoints that no longer have taps: flags off first.
	for ifindex, info := range d.endpoints {
		if _, keep := byEp[info.EpId]; keep || info.Flags&epTapMask == 0 {
			continue
		}
		info.Flags &^= epTapMask
		if err := d.putEndpoint(ifindex, info); err != nil {
			return fmt.Errorf("replacing taps: %w", err)
		}
	}
	gone := func(id *uint32) bool {
		_, keep := byEp[*id]
		return !keep
	}
	del, err := keysWhere[uint32, rampartTapSet](d.objs.TapSets, gone)
	if err != nil {
		return fmt.Errorf("replacing taps: reading tap sets: %w", err)
	}
	del6, err := keysWhere[uint32, rampartTapSet6](d.objs.TapSets6, gone)
	if err != nil {
		return fmt.Errorf("replacing taps: reading IPv6 tap sets: %w", err)
	}
	for _, m := range []struct {
		m   *ebpf.Map
		ids []uint32
	}{{d.objs.TapSets, del}, {d.objs.TapSets6, del6}} {
		for _, id := range m.ids {
			if err := m.m.Delete(&id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("replacing taps: deleting the rules of endpoint %d: %w", id, err)
			}
		}
	}
	return nil
}

// EndpointIfindex returns the host-side interface endpoint epID is installed on.
func (d *Taps) EndpointIfindex(epID uint32) (uint32, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for ifindex, info := range d.endpoints {
		if info.EpId == epID {
			return ifindex, true
		}
	}
	return 0, false
}

// TapCounters is what the dataplane counted for one tap contract (summed over CPUs).
type TapCounters struct {
	MirroredPackets, MirroredBytes     uint64
	CopiesLost                         uint64 // copies the monitor's interface did not take, or monitor down
	RedirectedPackets, RedirectedBytes uint64 // sent into the monitor
	ReturnedPackets, ReturnedBytes     uint64 // came back from the monitor and went on
	// UnavailableDrops are packets a redirect dropped because its monitor was down or
	// gone; UnavailablePassed the same with FailOpen, passed untapped.
	UnavailableDrops, UnavailablePassed uint64
	// Rejected (contract 0 only) counts packets monitors sent that belong to no flow
	// diverted to them on that interface: dropped.
	Rejected uint64
	// RemoteDelivered and RemoteLost (contract 0 only) count the copies other nodes sent
	// to this node's monitors: handed to the monitor, or dropped because no monitor here
	// has their key.
	RemoteDelivered, RemoteLost uint64
}

// NotReturned is how many diverted packets have not come back (yet): those the monitor
// dropped, and those still in it.
func (c TapCounters) NotReturned() uint64 {
	if c.ReturnedPackets >= c.RedirectedPackets {
		return 0
	}
	return c.RedirectedPackets - c.ReturnedPackets
}

// TapCounters returns the counters of the given contracts (0: packets monitors sent
// back that were not diverted to them).
func (d *Taps) TapCounters(contracts ...uint32) (map[uint32]TapCounters, error) {
	out := make(map[uint32]TapCounters, len(contracts))
	var per []rampartTapStats
	for _, id := range contracts {
		if id >= MaxTapContracts {
			return nil, fmt.Errorf("reading tap counters: contract ID %d out of range", id)
		}
		if err := d.objs.TapCounters.Lookup(&id, &per); err != nil {
			return nil, fmt.Errorf("reading tap counters of contract %d: %w", id, err)
		}
		var c TapCounters
		for _, s := range per {
			c.MirroredPackets += s.MirroredPackets
			c.MirroredBytes += s.MirroredBytes
			c.CopiesLost += s.CopiesLost
			c.RedirectedPackets += s.RedirectedPackets
			c.RedirectedBytes += s.RedirectedBytes
			c.ReturnedPackets += s.ReturnedPackets
			c.ReturnedBytes += s.ReturnedBytes
			c.UnavailableDrops += s.UnavailableDrops
			c.UnavailablePassed += s.UnavailablePassed
			c.Rejected += s.Rejected
			c.RemoteDelivered += s.RemoteDelivered
			c.RemoteLost += s.RemoteLost
		}
		out[id] = c
	}
	return out, nil
}

// ResetTapCounters zeroes a contract's counters (before its ID is given to another one).
func (d *Taps) ResetTapCounters(contract uint32) error {
	if contract >= MaxTapContracts {
		return fmt.Errorf("resetting tap counters: contract ID %d out of range", contract)
	}
	zero := make([]rampartTapStats, ebpf.MustPossibleCPU())
	if err := d.objs.TapCounters.Update(&contract, zero, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("resetting tap counters of contract %d: %w", contract, err)
	}
	return nil
}

const filterFromMonitor = "rampart_from_monitor"

// AttachMonitor puts rampart_from_monitor on the tc ingress of rxName and txName, the host
// sides (in the network namespace at netnsPath) of a monitor endpoint's receive and return
// veths, and registers them as the monitor's (monitorEpID: its endpoint, whose drop
// counters and events the interfaces' drops go to; 0 for none). From then on the node
// takes back from the monitor only packets of flows diverted to it, on txName; everything
// else the monitor sends is dropped. Returns the interfaces' indexes (TapRule.MonitorRx,
// MonitorTx). Attach it before the monitor's veths are up, so that nothing it sends
// passes unchecked.
func (d *Taps) AttachMonitor(netnsPath, rxName, txName string, monitorEpID uint32) (rx, tx uint32, err error) {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return 0, 0, fmt.Errorf("attaching monitor: %w", err)
	}
	defer h.Close()
	var idx [2]uint32
	for i, name := range []string{rxName, txName} {
		lnk, err := h.LinkByName(name)
		if err != nil {
			return 0, 0, fmt.Errorf("attaching monitor: finding %s: %w", name, err)
		}
		idx[i] = uint32(lnk.Attrs().Index)
		// Registered before the program runs on it, so its first packet finds the role.
		role := rampartTapIface{Role: tapIfRx, MonitorEpId: monitorEpID}
		if i == 1 {
			role.Role = tapIfTx
		}
		if err := d.objs.TapIfaces.Update(&idx[i], &role, ebpf.UpdateAny); err != nil {
			return 0, 0, fmt.Errorf("attaching monitor: registering %s: %w", name, err)
		}
		if err := h.QdiscAdd(clsact(lnk.Attrs().Index)); err != nil && !errors.Is(err, unix.EEXIST) {
			return 0, 0, fmt.Errorf("attaching monitor: adding clsact qdisc to %s: %w", name, err)
		}
		f := bpfFilter(lnk.Attrs().Index, netlink.HANDLE_MIN_INGRESS, filterFromMonitor, d.objs.RampartFromMonitor)
		if err := h.FilterReplace(f); err != nil {
			return 0, 0, fmt.Errorf("attaching monitor: attaching to %s: %w", name, err)
		}
	}
	return idx[0], idx[1], nil
}

// DetachMonitor forgets a monitor's interfaces (by index; their veths may be gone already)
// and the flows diverted to it. The program stays on interfaces still there: with no role
// it drops everything they bring (fail closed), until the veths go with the monitor.
func (d *Taps) DetachMonitor(rx, tx uint32) error {
	for _, idx := range []uint32{rx, tx} {
		if idx == 0 {
			continue
		}
		if err := d.objs.TapIfaces.Delete(&idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("detaching monitor: forgetting interface %d: %w", idx, err)
		}
	}
	if err := forgetDiverted[rampartTapFlowKey](d.objs.TapFlows, func(k *rampartTapFlowKey) uint32 { return k.Ifindex }, rx, tx); err != nil {
		return fmt.Errorf("detaching monitor: %w", err)
	}
	if err := forgetDiverted[rampartTapFlowKey6](d.objs.TapFlows6, func(k *rampartTapFlowKey6) uint32 { return k.Ifindex }, rx, tx); err != nil {
		return fmt.Errorf("detaching monitor: %w", err)
	}
	// The datagrams whose later fragments would follow their first to it: they find no
	// decision and are dropped where a redirect could have diverted them.
	var (
		k     rampartFragKey
		v     rampartTapFragValue
		frags []rampartFragKey
	)
	it := d.objs.TapFrags.Iterate()
	for it.Next(&k, &v) {
		if v.Tapped != 0 && ((rx != 0 && v.Rule.RxIfindex == rx) || (tx != 0 && v.Rule.TxIfindex == tx)) {
			frags = append(frags, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("detaching monitor: reading fragment taps: %w", err)
	}
	for i := range frags {
		if err := d.objs.TapFrags.Delete(&frags[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("detaching monitor: forgetting a fragment tap: %w", err)
		}
	}
	return nil
}

// TapTunnelIfindex is the tap tunnel device's index, 0 when AttachTapTunnel has not run.
func (d *Taps) TapTunnelIfindex() uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tapTunnel
}

// SetMonitorKey lets copies from other nodes with addr's key (MonitorKeyOf) reach the
// monitor whose receive veth's host side is rx.
func (d *Taps) SetMonitorKey(addr netip.Addr, rx uint32) error {
	key := MonitorKeyOf(addr)
	if err := d.objs.TapMonitorKeys.Update(&key, &rx, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("registering monitor %v for copies from other nodes: %w", addr, err)
	}
	return nil
}

// DeleteMonitorKey stops copies from other nodes with addr's key; missing is not an error.
func (d *Taps) DeleteMonitorKey(addr netip.Addr) error {
	key := MonitorKeyOf(addr)
	if err := d.objs.TapMonitorKeys.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forgetting monitor %v for copies from other nodes: %w", addr, err)
	}
	return nil
}

// forgetDiverted deletes the records in m (tap_flows or tap_flows6) of packets diverted to
// the monitor with interfaces rx and tx.
func forgetDiverted[K any](m *ebpf.Map, ifindexOf func(*K) uint32, rx, tx uint32) error {
	keys, err := keysWhere[K, rampartTapFlowValue](m, func(k *K) bool {
		i := ifindexOf(k)
		return i == tx || i == rx
	})
	if err != nil {
		return fmt.Errorf("reading diverted flows: %w", err)
	}
	for i := range keys {
		if err := m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forgetting a diverted flow: %w", err)
		}
	}
	return nil
}
