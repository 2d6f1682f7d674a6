package flow

import (
	"net/netip"
	"time"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// Event is one event from the dataplane (struct flow_event in rampart.h), decoded: a new
// allowed flow (forwarded, or redirected to the L7 proxy), or a dropped packet.
type Event struct {
	Time      time.Time     // wall-clock time, converted from the monotonic timestamp
	Monotonic time.Duration // CLOCK_MONOTONIC timestamp from the kernel
	Type      EventType
	Verdict   Verdict
	Reason    Reason // ReasonNone for forwarded packets
	Direction policy.Direction
	Protocol  policy.Protocol
	// Source and Destination are invalid when the packet had no IP header. For an ARP
	// frame (FlagARP) they are its sender and target addresses, ICMPType its opcode and
	// Protocol 0.
	Source      netip.Addr
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
	// Flags say how the L7 proxy or the send-side verdict is involved (any event type):
	// FlagL7Egress, the source endpoint's egress policy sends the flow through the proxy;
	// FlagL7Ingress, the destination endpoint's ingress policy does; FlagFromProxy, the
	// flow is the proxy's upstream connection, admitted at the destination because the
	// proxy applied the L7 rules; FlagSendSide, the send-side verdict checks the flow's
	// requests on the client's socket (a pair of local endpoints), so it does not go
	// through the proxy; FlagARP, the event is about an ARP frame (a drop).
	Flags Flags
}
