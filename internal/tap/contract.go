package tap

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/rampartnet/rampart/internal/labels"
)

// Manifest kinds that become contracts.
const (
	// KindTapContract is Rampart's own kind (APIVersion).
	KindTapContract = "TapContract"
	// KindTrafficControl is Antrea's (crd.antrea.io/v1alpha2), accepted where it maps
	// onto a contract.
	KindTrafficControl = "TrafficControl"
	// APIVersion serves KindTapContract.
	APIVersion = "rampart.io/v1alpha1"
	// AntreaAPIVersion serves KindTrafficControl.
	AntreaAPIVersion = "crd.antrea.io/v1alpha2"
)

// Direction is a set of directions, seen from the tapped (source) endpoint.
type Direction uint8

const (
	Ingress Direction = 1 << iota // packets arriving at the endpoint
	Egress                        // packets leaving the endpoint
	Both    = Ingress | Egress
)

func (d Direction) String() string {
	switch d {
	case Ingress:
		return "ingress"
	case Egress:
		return "egress"
	case Both:
		return "both"
	}
	return "none"
}

// ParseDirection reads ingress, egress or both (any case).
func ParseDirection(s string) (Direction, error) {
	switch strings.ToLower(s) {
	case "ingress":
		return Ingress, nil
	case "egress":
		return Egress, nil
	case "both":
		return Both, nil
	}
	return 0, fmt.Errorf("unknown direction %q (want ingress, egress or both)", s)
}

// Protocol is an IP protocol number; ProtoAny (0) matches every protocol.
type Protocol uint8

const (
	ProtoAny  Protocol = 0
	ProtoICMP Protocol = 1
	ProtoTCP  Protocol = 6
	ProtoUDP  Protocol = 17
)

func (p Protocol) String() string {
	switch p {
	case ProtoAny:
		return "any"
	case ProtoICMP:
		return "ICMP"
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	}
	return strconv.Itoa(int(p))
}

// ParseProtocol reads TCP, UDP, ICMP or any (any case).
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToLower(s) {
	case "any", "":
		return ProtoAny, nil
	case "icmp":
		return ProtoICMP, nil
	case "tcp":
		return ProtoTCP, nil
	case "udp":
		return ProtoUDP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q (want TCP, UDP, ICMP or any)", s)
}

// PortRange is an inclusive range of ports, First <= Last, First >= 1.
type PortRange struct {
	First, Last uint16
}

func (r PortRange) String() string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// ParsePortRange reads "80" or "8000-8080".
func ParsePortRange(s string) (PortRange, error) {
	first, last, isRange := strings.Cut(s, "-")
	f, err := parsePort(first)
	if err != nil {
		return PortRange{}, fmt.Errorf("port %q: %w", s, err)
	}
	l := f
	if isRange {
		if l, err = parsePort(last); err != nil {
			return PortRange{}, fmt.Errorf("port %q: %w", s, err)
		}
	}
	r := PortRange{First: f, Last: l}
	if err := r.validate(); err != nil {
		return PortRange{}, err
	}
	return r, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("want a port number from 1 to 65535")
	}
	return uint16(n), nil
}

func (r PortRange) validate() error {
	switch {
	case r.First == 0:
		return fmt.Errorf("port 0 is not a port (want 1 to 65535)")
	case r.Last < r.First:
		return fmt.Errorf("port range %d-%d ends before it starts", r.First, r.Last)
	}
	return nil
}

// Match is the flow syntax of a contract. Its sides are the tapped endpoint and its peer,
// whatever the direction of the packet: Ports are the endpoint's own ports (the
// destination port of a packet it receives, the source port of one it sends), PeerPorts
// and PeerCIDRs the other side's. So "TCP, ports 80, both directions" taps the requests to
// a web server and its answers alike. An empty list matches everything in its field;
// within a list any element may match, and all fields must match.
type Match struct {
	Direction Direction
	Protocol  Protocol
	PeerCIDRs []netip.Prefix // IPv4 or IPv6, masked
	Ports     []PortRange    // the endpoint's side; TCP or UDP only
	PeerPorts []PortRange    // the peer's side; TCP or UDP only
	// ICMPType and ICMPCode (ICMP only); nil: any.
	ICMPType *uint8
	ICMPCode *uint8
}

// String renders the match for lists and messages, e.g.
// "both TCP ports 80,8000-8080 peers 198.18.0.0/15".
func (m Match) String() string {
	parts := []string{m.Direction.String(), m.Protocol.String()}
	if len(m.Ports) > 0 {
		parts = append(parts, "ports "+rangesString(m.Ports))
	}
	if len(m.PeerPorts) > 0 {
		parts = append(parts, "peer-ports "+rangesString(m.PeerPorts))
	}
	if len(m.PeerCIDRs) > 0 {
		ps := make([]string, len(m.PeerCIDRs))
		for i, p := range m.PeerCIDRs {
			ps[i] = p.String()
		}
		parts = append(parts, "peers "+strings.Join(ps, ","))
	}
	if m.ICMPType != nil {
		parts = append(parts, "type "+strconv.Itoa(int(*m.ICMPType)))
	}
	if m.ICMPCode != nil {
		parts = append(parts, "code "+strconv.Itoa(int(*m.ICMPCode)))
	}
	return strings.Join(parts, " ")
}

func rangesString(rs []PortRange) string {
	ss := make([]string, len(rs))
	for i, r := range rs {
		ss[i] = r.String()
	}
	return strings.Join(ss, ",")
}

// Action is what happens to a matched packet.
type Action uint8

const (
	// Mirror: a copy goes to the monitor; the original is delivered as if untapped.
	Mirror Action = iota + 1
	// Redirect: the packet goes through the monitor, which passes or drops it.
	Redirect
)

func (a Action) String() string {
	switch a {
	case Mirror:
		return "mirror"
	case Redirect:
		return "redirect"
	}
	return "none"
}

// ParseAction reads mirror or redirect (any case).
func ParseAction(s string) (Action, error) {
	switch strings.ToLower(s) {
	case "mirror":
		return Mirror, nil
	case "redirect":
		return Redirect, nil
	}
	return 0, fmt.Errorf("unknown action %q (want mirror or redirect)", s)
}

// FailMode says what a redirect does with matched packets while its monitor is
// unavailable. The zero value is FailClosed.
type FailMode uint8

const (
	// FailClosed drops them: nothing passes that the monitor did not see.
	FailClosed FailMode = iota
	// FailOpen delivers them untapped. Only ever by an explicit setting.
	FailOpen
)

func (f FailMode) String() string {
	if f == FailOpen {
		return "open"
	}
	return "closed"
}

// ParseFailMode reads closed or open (any case; "" is closed).
func ParseFailMode(s string) (FailMode, error) {
	switch strings.ToLower(s) {
	case "", "closed", "fail-closed":
		return FailClosed, nil
	case "open", "fail-open":
		return FailOpen, nil
	}
	return 0, fmt.Errorf("unknown failure mode %q (want closed or open)", s)
}

// Source is what a contract taps: one endpoint by its key, or every endpoint whose full
// label set (labels.ForPod: its labels and its namespace's) the selector matches.
type Source struct {
	Endpoint string // "namespace/name"; "" when Selector is used
	Selector labels.Selector
}

func (s Source) String() string {
	if s.Endpoint != "" {
		return s.Endpoint
	}
	return "selector " + s.Selector.String()
}

// Contract is one tap contract: FlowTap(Source, Monitor, Match, Action).
type Contract struct {
	Kind    string // KindTapContract or KindTrafficControl
	Name    string // unique among contracts of every kind
	Origin  string // where it was read from (file and document), for messages
	Source  Source
	Monitor string // the monitor endpoint, "namespace/name"
	Match   Match
	Action  Action
	// FailMode applies to Redirect (a mirror never blocks the original traffic).
	FailMode FailMode
	// Raw is the manifest as compact JSON, when the contract was read from one; parsing
	// it again yields the same contract.
	Raw []byte
}

// FieldError is an invalid field of a contract. Field is the manifest's path
// (spec.match.ports[1]), so that the parser and the command line name the same thing.
type FieldError struct {
	Contract string
	Field    string
	Reason   string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("tap contract %s: %s: %s", e.Contract, e.Field, e.Reason)
}

// SplitKey splits "namespace/name" or "name" (namespace "default").
func SplitKey(s string) (namespace, name string, err error) {
	ns, n, ok := strings.Cut(s, "/")
	if !ok {
		ns, n = "default", s
	}
	if !validDNSLabel(ns) || !validDNSSubdomain(n) {
		return "", "", fmt.Errorf("endpoint %q: want NAMESPACE/NAME or NAME, lowercase alphanumerics, '-' (and '.' in a name)", labels.Shorten(s))
	}
	return ns, n, nil
}

// NormalizeKey returns s as "namespace/name".
func NormalizeKey(s string) (string, error) {
	ns, n, err := SplitKey(s)
	if err != nil {
		return "", err
	}
	return ns + "/" + n, nil
}

// Validate checks what a contract must hold whatever its origin: names, a source, a
// monitor, a well-formed match and an action. It returns the first problem as a
// *FieldError.
func (c *Contract) Validate() error {
	fail := func(field, format string, args ...any) error {
		return &FieldError{Contract: c.Name, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if !validDNSSubdomain(c.Name) {
		return fail("metadata.name", "invalid name %q: must be lowercase alphanumerics, '-' and '.', at most 253 characters", labels.Shorten(c.Name))
	}
	switch {
	case c.Source.Endpoint != "" && len(c.Source.Selector.Requirements) > 0:
		return fail("spec.source", "give an endpoint or a selector, not both")
	case c.Source.Endpoint != "":
		if _, err := NormalizeKey(c.Source.Endpoint); err != nil {
			return fail("spec.source.endpoint", "%v", err)
		}
	case c.Source.Selector.IsNone():
		return fail("spec.source", "the selector selects nothing")
	}
	if c.Monitor == "" {
		return fail("spec.monitor", "required field missing")
	}
	if _, err := NormalizeKey(c.Monitor); err != nil {
		return fail("spec.monitor", "%v", err)
	}
	if c.Source.Endpoint != "" && mustKey(c.Source.Endpoint) == mustKey(c.Monitor) {
		return fail("spec.monitor", "the monitor cannot tap itself")
	}
	if err := c.Match.validate(); err != nil {
		err.Contract = c.Name
		return err
	}
	switch c.Action {
	case Mirror:
		if c.FailMode != FailClosed {
			return fail("spec.failMode", "a mirror never blocks traffic: a failure mode is for redirect only")
		}
	case Redirect:
	default:
		return fail("spec.action", "required field missing (mirror or redirect)")
	}
	return nil
}

func mustKey(s string) string {
	k, _ := NormalizeKey(s)
	return k
}

func (m Match) validate() *FieldError {
	fail := func(field, format string, args ...any) *FieldError {
		return &FieldError{Field: "spec.match." + field, Reason: fmt.Sprintf(format, args...)}
	}
	if m.Direction == 0 || m.Direction&^Both != 0 {
		return fail("direction", "want ingress, egress or both")
	}
	switch m.Protocol {
	case ProtoAny, ProtoICMP, ProtoTCP, ProtoUDP:
	default:
		return fail("protocol", "protocol %d: want TCP, UDP, ICMP or any", m.Protocol)
	}
	for i, p := range m.PeerCIDRs {
		field := fmt.Sprintf("peerCIDRs[%d]", i)
		switch {
		case !p.IsValid():
			return fail(field, "invalid prefix")
		case p.Addr().Is4In6():
			// The dataplane matches IPv6 packets by IPv6 prefixes and IPv4 packets by
			// IPv4 ones: a mapped prefix would match neither as it says.
			return fail(field, "%v: an IPv4-mapped IPv6 prefix (write it as IPv4)", p)
		case p.Masked() != p:
			return fail(field, "%v has host bits set (want %v)", p, p.Masked())
		}
	}
	if (len(m.Ports) > 0 || len(m.PeerPorts) > 0) && m.Protocol != ProtoTCP && m.Protocol != ProtoUDP {
		field := "ports"
		if len(m.Ports) == 0 {
			field = "peerPorts"
		}
		return fail(field, "ports need protocol TCP or UDP (protocol is %v)", m.Protocol)
	}
	for i, r := range m.Ports {
		if err := r.validate(); err != nil {
			return fail(fmt.Sprintf("ports[%d]", i), "%v", err)
		}
	}
	for i, r := range m.PeerPorts {
		if err := r.validate(); err != nil {
			return fail(fmt.Sprintf("peerPorts[%d]", i), "%v", err)
		}
	}
	if m.ICMPType == nil && m.ICMPCode != nil {
		return fail("icmpCode", "an ICMP code needs an ICMP type")
	}
	if m.ICMPType != nil && m.Protocol != ProtoICMP {
		return fail("icmpType", "an ICMP type needs protocol ICMP (protocol is %v)", m.Protocol)
	}
	return nil
}

// Normalize sorts and deduplicates the match's lists, so that equal matches compare equal
// and render the same.
func (m *Match) Normalize() {
	slices.SortFunc(m.PeerCIDRs, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	m.PeerCIDRs = slices.Compact(m.PeerCIDRs)
	for _, rs := range []*[]PortRange{&m.Ports, &m.PeerPorts} {
		slices.SortFunc(*rs, func(a, b PortRange) int {
			if a.First != b.First {
				return int(a.First) - int(b.First)
			}
			return int(a.Last) - int(b.Last)
		})
		*rs = slices.Compact(*rs)
	}
}

func validDNSLabel(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(s)-1) {
			return false
		}
	}
	return true
}

func validDNSSubdomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if !validDNSLabel(part) {
			return false
		}
	}
	return true
}
