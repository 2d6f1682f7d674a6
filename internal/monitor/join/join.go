package join

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/monitor/suricata"
	"github.com/rampartnet/rampart/internal/tap"
)

// View is what the agent knows, as its API lists it.
type View struct {
	// Monitor is the monitor endpoint ("namespace/name") whose events are joined.
	Monitor    string
	Endpoints  []api.Endpoint
	Remotes    []api.RemoteEndpoint
	Nodes      []api.Node
	Identities []api.Identity
	Taps       []api.Tap
	// Flows are Rampart's flow events that may be the joined connections' (observe).
	Flows []api.Flow
}

// Side is one side of an alert's flow as Rampart knows it.
type Side struct {
	IP   string `json:"ip"`
	Port uint16 `json:"port,omitempty"`
	// Endpoint is the endpoint with the address (namespace/name), local or on Node.
	Endpoint string `json:"endpoint,omitempty"`
	Node     string `json:"node,omitempty"`
	Identity uint32 `json:"identity"`
	// Name is the endpoint, or for other addresses the identity's name: a reserved one
	// (world, host, remote-node) or the CIDR identity's prefix.
	Name   string   `json:"name"`
	Labels []string `json:"labels,omitempty"`
}

// ContractRef is a tap contract that taps the flow, and where.
type ContractRef struct {
	Name   string `json:"name"`
	Action string `json:"action"` // mirror, redirect
	// Endpoint is the tapped endpoint, Direction the direction of the alert's packet there
	// (or, when only the flow's other direction is in the match, that one's).
	Endpoint  string `json:"endpoint"`
	Direction string `json:"direction"`
}

// Alert is an EVE alert or drop joined to Rampart's view.
type Alert struct {
	Time    time.Time `json:"time"`
	Monitor string    `json:"monitor"`
	// Event is alert or drop; Action allowed or blocked (what the monitor did with the
	// packet: a passive monitor only allows).
	Event       string `json:"event"`
	Action      string `json:"action"`
	SignatureID int    `json:"signatureID,omitempty"`
	GID         int    `json:"gid,omitempty"`
	Rev         int    `json:"rev,omitempty"`
	Signature   string `json:"signature,omitempty"`
	Category    string `json:"category,omitempty"`
	Severity    int    `json:"severity,omitempty"`
	DropReason  string `json:"dropReason,omitempty"`
	// Protocol, Source and Destination: the packet's, as the monitor saw it.
	Protocol    string `json:"protocol"`
	Source      Side   `json:"source"`
	Destination Side   `json:"destination"`
	AppProto    string `json:"appProto,omitempty"`
	// Flow is Rampart's flow event of the connection (its first packet, with the tapped
	// flag when a tap rule matched it), when the agent's flow history still holds it.
	Flow *api.Flow `json:"flow,omitempty"`
	// Contracts are this monitor's contracts that tap the flow.
	Contracts []ContractRef `json:"contracts"`
	// FlowID is the monitor's id of the flow (shared by its EVE records).
	FlowID uint64 `json:"flowID,omitempty"`
}

// Join joins an alert or drop record; ok is false for other records.
func Join(v *View, ev suricata.Event) (a Alert, ok bool) {
	switch {
	case ev.Type == suricata.TypeAlert && ev.Alert != nil:
		al := ev.Alert
		a = Alert{Event: ev.Type, Action: string(al.Action), SignatureID: al.SignatureID, GID: al.GID, Rev: al.Rev,
			Signature: al.Signature, Category: al.Category, Severity: al.Severity}
	case ev.Type == suricata.TypeDrop:
		a = Alert{Event: ev.Type, Action: string(suricata.Blocked)}
		if ev.Drop != nil {
			a.DropReason = ev.Drop.Reason
		}
	default:
		return Alert{}, false
	}
	a.Time, a.Monitor, a.Protocol, a.AppProto, a.FlowID = ev.Time, v.Monitor, ev.Tuple.Proto, ev.AppProto, ev.FlowID
	a.Flow = v.flowOf(ev)
	a.Source = v.side(ev.Tuple.Src, a.Flow)
	a.Destination = v.side(ev.Tuple.Dst, a.Flow)
	a.Contracts = v.contracts(ev)
	return a, true
}

// flowOf finds Rampart's event of the connection: a new flow (or a drop) of the same
// protocol between the same two address and port pairs, in either orientation (an
// alert's packet may be an answer). A flow the tap matched is preferred, then the most
// recent one not after the alert (a port pair may be reused), then the most recent.
func (v *View) flowOf(ev suricata.Event) *api.Flow {
	var best *api.Flow
	score := func(f *api.Flow) int {
		s := 0
		if slices.Contains(f.Flags, flow.FlagTapped.String()) {
			s += 2
		}
		if !f.Time.After(ev.Time.Add(time.Second)) { // the two clocks are one, the stamps are not
			s++
		}
		return s
	}
	for i := range v.Flows {
		f := &v.Flows[i]
		if f.Type == api.FlowTypeL7 || !strings.EqualFold(f.Protocol, ev.Tuple.Proto) || !sameConnection(f, ev.Tuple) {
			continue
		}
		if best == nil || score(f) > score(best) || score(f) == score(best) && !f.Time.Before(best.Time) {
			best = f
		}
	}
	if best == nil {
		return nil
	}
	c := *best
	return &c
}

func sameConnection(f *api.Flow, t suricata.FiveTuple) bool {
	src := addrPort(f.Source)
	dst := addrPort(f.Dest)
	return src == t.Src && dst == t.Dst || src == t.Dst && dst == t.Src
}

func addrPort(p api.FlowPeer) netip.AddrPort {
	a, err := netip.ParseAddr(p.IP)
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a, p.Port)
}

// side names one address: from Rampart's flow event when there is one (the identities
// the dataplane judged the connection with), else from the endpoints, the pods on other
// nodes, the nodes and the CIDR identities of now; any other address is the world.
func (v *View) side(ap netip.AddrPort, f *api.Flow) Side {
	s := Side{IP: ap.Addr().String(), Port: ap.Port()}
	if f != nil {
		for _, p := range []api.FlowPeer{f.Source, f.Dest} {
			if addrPort(p) == ap {
				s.Identity, s.Labels, s.Node = p.Identity, p.Labels, p.Node
				if p.Name != "" {
					s.Endpoint = p.Namespace + "/" + p.Name
				}
				s.Name = v.name(s)
				return s
			}
		}
	}
	for _, e := range v.Endpoints {
		if e.IP == s.IP || (e.IP6 != "" && e.IP6 == s.IP) {
			s.Endpoint, s.Identity, s.Labels = e.Key(), e.Identity, e.IdentityLabels
			s.Name = v.name(s)
			return s
		}
	}
	for _, r := range v.Remotes {
		if r.IP == s.IP || (r.IP6 != "" && r.IP6 == s.IP) {
			s.Endpoint, s.Node, s.Identity = r.Namespace+"/"+r.Name, r.Node, r.Identity
			s.Labels = v.labelsOf(r.Identity)
			s.Name = v.name(s)
			return s
		}
	}
	reserved := "world"
	for _, n := range v.Nodes {
		if n.Address == s.IP {
			reserved = "remote-node"
		}
	}
	if reserved == "world" {
		// The CIDR identity of the longest prefix that holds the address.
		bits := -1
		for _, id := range v.Identities {
			p, err := netip.ParsePrefix(id.Prefix)
			if id.Kind != "cidr" || err != nil || !p.Contains(ap.Addr()) || p.Bits() <= bits {
				continue
			}
			bits, s.Identity, s.Labels = p.Bits(), id.ID, id.Labels
			if len(s.Labels) == 0 {
				s.Labels = []string{"cidr:" + p.String()}
			}
		}
		if bits >= 0 {
			s.Name = v.name(s)
			return s
		}
	}
	for _, id := range v.Identities {
		if id.Kind == "reserved" && slices.Contains(id.Labels, "reserved:"+reserved) {
			s.Identity, s.Labels = id.ID, id.Labels
		}
	}
	s.Name = reserved
	return s
}

func (v *View) labelsOf(id uint32) []string {
	for _, i := range v.Identities {
		if i.ID == id {
			return i.Labels
		}
	}
	return nil
}

// name: the endpoint (with its node when remote), a reserved identity's name, a CIDR
// identity's prefix, else the address.
func (v *View) name(s Side) string {
	if s.Endpoint != "" && s.Node != "" {
		return s.Endpoint + "@" + s.Node
	}
	if s.Endpoint != "" {
		return s.Endpoint
	}
	for _, l := range s.Labels {
		if r, ok := strings.CutPrefix(l, "reserved:"); ok {
			return r
		}
		if c, ok := strings.CutPrefix(l, "cidr:"); ok {
			return strings.Fields(c)[0]
		}
	}
	return s.IP
}

// protocols are the EVE protocol names a tap match can name.
// Suricata names ICMPv6 IPV6-ICMP; a contract's ICMP taps both families' (datapath.TapRule).
var protocols = map[string]tap.Protocol{"TCP": tap.ProtoTCP, "UDP": tap.ProtoUDP, "ICMP": tap.ProtoICMP, "IPV6-ICMP": tap.ProtoICMP, "SCTP": 132}

// contracts are the monitor's contracts that tap an endpoint on one side of the flow
// with a match that holds the event's packet, or else the flow's other direction (a
// contract that taps only requests still tapped the connection an alert on an answer is
// about).
func (v *View) contracts(ev suricata.Event) []ContractRef {
	out := []ContractRef{}
	proto, ok := protocols[strings.ToUpper(ev.Tuple.Proto)]
	if !ok {
		return out
	}
	icmpType, icmpCode := icmpOf(ev)
	monitor, err := tap.NormalizeKey(v.Monitor)
	if err != nil {
		return out
	}
	// The endpoint's address of the event's family.
	v6 := ev.Tuple.Src.Addr().Unmap().Is6()
	ips := make(map[string]netip.Addr, len(v.Endpoints))
	for _, e := range v.Endpoints {
		ip := e.IP
		if v6 {
			ip = e.IP6
		}
		if a, err := netip.ParseAddr(ip); err == nil {
			ips[e.Key()] = a
		}
	}
	for _, t := range v.Taps {
		if m, err := tap.NormalizeKey(t.Monitor); err != nil || m != monitor || t.MatchSpec == nil || t.MonitorNode != "" {
			continue
		}
		match, err := t.MatchSpec.Match()
		if err != nil {
			continue
		}
		for _, e := range t.Endpoints {
			ip, ok := ips[e]
			if !ok {
				continue
			}
			for _, tuple := range []suricata.FiveTuple{ev.Tuple, ev.Tuple.Reverse()} {
				p, ok := tap.NewPacket(proto, tuple.Src, tuple.Dst, ip)
				if !ok {
					break
				}
				p.ICMPType, p.ICMPCode = icmpType, icmpCode
				if match.Matches(p) {
					out = append(out, ContractRef{Name: t.Name, Action: t.Action, Endpoint: e, Direction: p.Direction.String()})
					break
				}
			}
		}
	}
	return out
}

// icmpOf reads an ICMP record's type and code, which the typed event leaves in Raw.
func icmpOf(ev suricata.Event) (typ, code uint8) {
	var w struct {
		Type uint8 `json:"icmp_type"`
		Code uint8 `json:"icmp_code"`
	}
	if len(ev.Raw) > 0 && json.Unmarshal(ev.Raw, &w) == nil {
		return w.Type, w.Code
	}
	return 0, 0
}

// Format renders a joined alert on one line, e.g.
//
//	12:00:02.345 alert allowed [1:1000001:1] "rampart-attack" shop/client (id 263) -> shop/web (id 264) TCP 198.18.0.5:40004 -> 198.18.0.6:8080 contract=web-mirror (mirror, ingress at shop/web) flow tapped 12:00:02.301
func Format(a Alert) string {
	var b strings.Builder
	b.WriteString(a.Time.Local().Format("15:04:05.000"))
	fmt.Fprintf(&b, " %s %s", a.Event, a.Action)
	if a.Event == suricata.TypeAlert {
		fmt.Fprintf(&b, " [%d:%d:%d] %q", a.GID, a.SignatureID, a.Rev, a.Signature)
	} else if a.DropReason != "" {
		fmt.Fprintf(&b, " reason=%s", a.DropReason)
	}
	fmt.Fprintf(&b, " %s (id %d) -> %s (id %d) %s", a.Source.Name, a.Source.Identity, a.Destination.Name, a.Destination.Identity, a.Protocol)
	if a.Source.Port != 0 || a.Destination.Port != 0 {
		fmt.Fprintf(&b, " %s:%d -> %s:%d", a.Source.IP, a.Source.Port, a.Destination.IP, a.Destination.Port)
	} else {
		fmt.Fprintf(&b, " %s -> %s", a.Source.IP, a.Destination.IP)
	}
	if len(a.Contracts) == 0 {
		b.WriteString(" contract=none")
	}
	for _, c := range a.Contracts {
		fmt.Fprintf(&b, " contract=%s (%s, %s at %s)", c.Name, c.Action, c.Direction, c.Endpoint)
	}
	if f := a.Flow; f != nil {
		what := "flow"
		if slices.Contains(f.Flags, flow.FlagTapped.String()) {
			what = "flow tapped"
		}
		fmt.Fprintf(&b, " %s %s (%s at %s, %s)", what, f.Time.Local().Format("15:04:05.000"), f.Direction, f.Endpoint, f.Verdict)
	}
	return b.String()
}
