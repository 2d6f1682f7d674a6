package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// EventType is the kind of a flow event (EVENT_* in rampart.h).
type EventType uint8

const (
	EventNewFlow EventType = 1 // first packet of an allowed connection
	EventDrop    EventType = 2 // a dropped packet
)

func (t EventType) String() string {
	switch t {
	case EventNewFlow:
		return "new-flow"
	case EventDrop:
		return "drop"
	}
	return fmt.Sprintf("event-%d", uint8(t))
}

// Verdict is what happened to the packet (VERDICT_* in rampart.h).
type Verdict uint8

const (
	VerdictForwarded  Verdict = 1
	VerdictDropped    Verdict = 2
	VerdictRedirected Verdict = 3 // a new connection steered to the L7 proxy
)

func (v Verdict) String() string {
	switch v {
	case VerdictForwarded:
		return "forwarded"
	case VerdictDropped:
		return "dropped"
	case VerdictRedirected:
		return "redirected"
	}
	return fmt.Sprintf("verdict-%d", uint8(v))
}

// DropReason says why a packet was dropped (REASON_* in rampart.h).
type DropReason uint8

const (
	ReasonNone            DropReason = 0
	ReasonPolicyDeny      DropReason = 1 // matched a deny rule
	ReasonPolicyDefault   DropReason = 2 // enforcement on, no rule allows
	ReasonMalformed       DropReason = 3 // truncated or invalid header
	ReasonFragUnknown     DropReason = 4 // non-first fragment whose first fragment was not seen
	ReasonUnknownEndpoint DropReason = 5 // interface without endpoint info (fail closed)
	ReasonUnsupportedL3   DropReason = 6 // not IPv4 or ARP
	// ReasonProxyUnavailable: L7 rules apply to the connection but there is no proxy socket
	// to hand it to (proxy not running or not listening, its connection gone).
	ReasonProxyUnavailable DropReason = 7
	// ReasonProxyBypass: L7 rules apply to the connection but the packet did not come from
	// the proxy (a sender whose traffic is not steered, such as the host).
	ReasonProxyBypass DropReason = 8
	// ReasonL7Unchecked: data on a connection whose L7 rules the send-side verdict checks,
	// sent by another socket than the one it checks (a raw socket, say).
	ReasonL7Unchecked DropReason = 9
	// ReasonSpoofedSource: a packet or ARP frame left an endpoint with a source address
	// that is not the endpoint's own (reported as the sending endpoint's), or a new flow
	// entering an endpoint claims a local endpoint's address but did not come from that
	// endpoint's interface.
	ReasonSpoofedSource DropReason = 10
)

var reasonNames = map[DropReason]string{
	ReasonNone:             "none",
	ReasonPolicyDeny:       "policy-deny",
	ReasonPolicyDefault:    "policy-default-deny",
	ReasonMalformed:        "malformed",
	ReasonFragUnknown:      "fragment-unknown",
	ReasonUnknownEndpoint:  "unknown-endpoint",
	ReasonUnsupportedL3:    "unsupported-l3",
	ReasonProxyUnavailable: "proxy-unavailable",
	ReasonProxyBypass:      "proxy-bypass",
	ReasonL7Unchecked:      "l7-unchecked",
	ReasonSpoofedSource:    "spoofed-source",
}

func (r DropReason) String() string {
	if n, ok := reasonNames[r]; ok {
		return n
	}
	return fmt.Sprintf("reason-%d", uint8(r))
}

// flow_event.flags (FLOW_F_* in rampart.h).
const (
	flowL7Egress    = 1 << 0
	flowL7Ingress   = 1 << 1
	flowFromProxy   = 1 << 2
	flowSockVerdict = 1 << 3
	flowARP         = 1 << 4
)

// FlowEvent is one event from the dataplane: a new allowed flow (forwarded, or redirected
// to the L7 proxy), or a dropped packet.
type FlowEvent struct {
	Time        time.Time     // wall-clock time, converted from the monotonic timestamp
	Monotonic   time.Duration // CLOCK_MONOTONIC timestamp from the kernel
	Type        EventType
	Verdict     Verdict
	Reason      DropReason // ReasonNone for forwarded packets
	Direction   policy.Direction
	Protocol    policy.Protocol
	Source      netip.Addr // invalid when the packet had no IPv4 header
	Destination netip.Addr
	// SourcePort and DestinationPort are the L4 ports in host order. For ICMP echo they hold
	// the echo id (request: source port; reply: destination port).
	SourcePort      uint16
	DestinationPort uint16
	ICMPType        uint8 // for ICMP
	EpID            uint32
	SrcIdentity     identity.Identity
	DstIdentity     identity.Identity
	RuleID          uint32 // rule that allowed or denied the flow; 0 when none (default)
	// MatchIdentity is the identity whose policy entry decided: the peer's, any (0), the
	// peer's flagged CIDR identity, or a CIDR set's (identity.IsCIDRSet) when the peer is
	// in a set that a rule names. 0 also when no entry matched (RuleID 0). Later fragments
	// of a datagram carry their first fragment's RuleID but not this.
	MatchIdentity identity.Identity
	IfIndex       uint32
	Length        uint32 // packet length including the Ethernet header
	// L7 proxy involvement (any event type). L7Egress: the source endpoint's egress policy
	// sends the flow through the proxy; L7Ingress: the destination endpoint's ingress
	// policy does. FromProxy: the flow is the proxy's upstream connection, admitted at the
	// destination because the proxy applied the L7 rules.
	L7Egress  bool
	L7Ingress bool
	FromProxy bool
	// SockVerdict: the send-side verdict checks the flow's requests on the client's
	// socket (a pair of local endpoints), so it does not go through the proxy.
	SockVerdict bool
	// ARP: the event is about an ARP frame (a drop): Source and Destination are its
	// sender and target IPv4 addresses, ICMPType its opcode, Protocol 0.
	ARP bool
}

// EventReader reads flow events from the ring buffer. Use one reader at a time per
// Datapath: events are consumed by whoever reads them first.
type EventReader struct {
	ring polledRing
	// wall - monotonic at creation, to convert kernel timestamps.
	offset time.Duration
}

// EventPoll is how late an event may be read: the programs wake the reader only when an
// event fills a quarter of its ring (flow events: bpf/include/events.h, emit_event;
// send-side verdict events: bpf/sockverdict.c, emit), so readers poll.
const EventPoll = 50 * time.Millisecond

// polledRing reads a ring buffer whose producers do not wake the reader for each record:
// it waits at most EventPoll at a time, and reads what arrived meanwhile.
type polledRing struct {
	rd       *ringbuf.Reader
	deadline time.Time // the caller's (zero: none)
	rec      ringbuf.Record
	// drained counts the times a read found the ring empty (see EventReader.Drained).
	drained atomic.Uint64
}

// next returns the next record's bytes (valid until the next call), or
// os.ErrDeadlineExceeded once the deadline has passed without one.
func (p *polledRing) next() ([]byte, error) {
	for {
		wake := time.Now().Add(EventPoll)
		if !p.deadline.IsZero() && p.deadline.Before(wake) {
			wake = p.deadline
		}
		p.rd.SetDeadline(wake)
		err := p.rd.ReadInto(&p.rec)
		if err == nil {
			return p.rec.RawSample, nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, err
		}
		p.drained.Add(1) // the wait timed out and nothing was left to read
		if !p.deadline.IsZero() && !time.Now().Before(p.deadline) {
			return nil, err
		}
	}
}

// Events opens a reader on the flow event ring buffer.
func (d *Datapath) Events() (*EventReader, error) {
	rd, err := ringbuf.NewReader(d.objs.Events)
	if err != nil {
		return nil, fmt.Errorf("opening flow event reader: %w", err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		rd.Close()
		return nil, fmt.Errorf("reading monotonic clock: %w", err)
	}
	offset := time.Duration(time.Now().UnixNano() - ts.Nano())
	return &EventReader{ring: polledRing{rd: rd}, offset: offset}, nil
}

// Read blocks until an event arrives, the deadline passes (os.ErrDeadlineExceeded) or the
// reader is closed (os.ErrClosed, also ringbuf.ErrClosed).
func (r *EventReader) Read() (FlowEvent, error) {
	raw, err := r.ring.next()
	if err != nil {
		return FlowEvent{}, fmt.Errorf("reading flow event: %w", err)
	}
	return decodeEvent(raw, r.offset)
}

// SetDeadline makes Read return os.ErrDeadlineExceeded once t has passed (zero: no deadline).
func (r *EventReader) SetDeadline(t time.Time) { r.ring.deadline = t }

// Drained counts the times Read found the ring empty, which it checks at least every
// EventPoll while it is called. Once the count has grown by two since a moment, every
// event written before that moment has been returned by Read (one more empty ring may
// have been seen just before the moment). Safe to call from any goroutine.
func (r *EventReader) Drained() uint64 { return r.ring.drained.Load() }

// Close stops the reader; a blocked Read returns.
func (r *EventReader) Close() error {
	if err := r.ring.rd.Close(); err != nil {
		return fmt.Errorf("closing flow event reader: %w", err)
	}
	return nil
}

func decodeEvent(raw []byte, offset time.Duration) (FlowEvent, error) {
	var e rampartFlowEvent
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, &e); err != nil {
		return FlowEvent{}, fmt.Errorf("decoding flow event (%d bytes): %w", len(raw), err)
	}
	out := FlowEvent{
		Monotonic:       time.Duration(e.TimestampNs),
		Type:            EventType(e.Type),
		Verdict:         Verdict(e.Verdict),
		Reason:          DropReason(e.Reason),
		Direction:       policy.Direction(e.Direction),
		Protocol:        policy.Protocol(e.Protocol),
		SourcePort:      ntohs(e.Sport),
		DestinationPort: ntohs(e.Dport),
		ICMPType:        e.IcmpType,
		EpID:            e.EpId,
		SrcIdentity:     e.SrcIdentity,
		DstIdentity:     e.DstIdentity,
		RuleID:          e.RuleId,
		MatchIdentity:   e.MatchIdentity,
		IfIndex:         e.Ifindex,
		Length:          e.Length,
		L7Egress:        e.Flags&flowL7Egress != 0,
		L7Ingress:       e.Flags&flowL7Ingress != 0,
		FromProxy:       e.Flags&flowFromProxy != 0,
		SockVerdict:     e.Flags&flowSockVerdict != 0,
		ARP:             e.Flags&flowARP != 0,
	}
	out.Time = time.Unix(0, 0).Add(offset + out.Monotonic)
	switch e.Family {
	case familyV4:
		out.Source = netip.AddrFrom4([4]byte(e.Saddr[:4]))
		out.Destination = netip.AddrFrom4([4]byte(e.Daddr[:4]))
	case familyV6:
		out.Source = netip.AddrFrom16(e.Saddr)
		out.Destination = netip.AddrFrom16(e.Daddr)
	}
	return out, nil
}
