package tappolicy

import (
	"fmt"

	"github.com/rampartnet/rampart/internal/tap"
)

// OriginPrefix starts the Origin of every contract a tap policy yields: "tap policy <file>".
const OriginPrefix = "tap policy "

// Name suffixes of the two contracts a direction "both" with a port becomes.
const (
	SuffixIngress = "-in"
	SuffixEgress  = "-out"
)

// TapContracts converts a compiled contract into the tap contracts the agent installs
// (Kind TapContract, Origin "tap policy <file>", failing closed), each checked by
// tap.Contract.Validate.
//
// A policy's port is the server side's port of the connections, the way a policy names a
// service (port("dvd/db", "TCP", 5432)), and its direction says who opens them; a
// contract's ports are per side and its direction per packet (tap.Match). A monitor needs
// both directions of a connection to follow its stream, so a contract with a port takes
// every packet of the connections it names:
//   - ingress, port P: the connections to the endpoint's own port P, both ways
//     (Match.Ports, direction both);
//   - egress, port P: the connections the endpoint opens to a peer's port P, both ways
//     (Match.PeerPorts, direction both);
//   - both, port P: two contracts, the ingress one (name suffixed "-in") and the egress
//     one ("-out"), the egress one leaving out the endpoint's own port P so that the two
//     never overlap (a packet between port P and port P belongs to the ingress one);
//   - port 0: any port, one contract for the packets of the given direction.
func (k Contract) TapContracts(file string) ([]*tap.Contract, error) {
	dir, err := tap.ParseDirection(k.Direction)
	if err != nil {
		return nil, k.fail(err)
	}
	proto, err := tap.ParseProtocol(k.Protocol)
	if err != nil {
		return nil, k.fail(err)
	}
	action, err := tap.ParseAction(k.Action)
	if err != nil {
		return nil, k.fail(err)
	}
	base := tap.Contract{
		Kind:     tap.KindTapContract,
		Name:     k.Name,
		Origin:   OriginPrefix + file,
		Source:   tap.Source{Endpoint: k.Source},
		Monitor:  k.Monitor,
		Match:    tap.Match{Direction: dir, Protocol: proto},
		Action:   action,
		FailMode: tap.FailClosed,
	}
	port := []tap.PortRange{{First: k.Port, Last: k.Port}}
	var out []*tap.Contract
	switch {
	case k.Port == 0:
		c := base
		out = append(out, &c)
	case dir == tap.Ingress:
		c := base
		c.Match.Direction, c.Match.Ports = tap.Both, port
		out = append(out, &c)
	case dir == tap.Egress:
		c := base
		c.Match.Direction, c.Match.PeerPorts = tap.Both, port
		out = append(out, &c)
	default:
		in, eg := base, base
		in.Name, in.Match.Ports = k.Name+SuffixIngress, port
		eg.Name, eg.Match.PeerPorts, eg.Match.Ports = k.Name+SuffixEgress, port, allBut(k.Port)
		out = append(out, &in, &eg)
	}
	for _, c := range out {
		if err := c.Validate(); err != nil {
			return nil, k.fail(err)
		}
	}
	return out, nil
}

func (k Contract) fail(err error) error {
	return fmt.Errorf("derived contract %s (%s -> %s): %w", k.Name, k.Source, k.Monitor, err)
}

// TapContracts converts every contract of the result (Contract.TapContracts), in order.
func (r *Result) TapContracts(file string) ([]*tap.Contract, error) {
	var out []*tap.Contract
	for _, k := range r.Contracts {
		cs, err := k.TapContracts(file)
		if err != nil {
			return nil, fmt.Errorf("tap policy %s: %w", file, err)
		}
		out = append(out, cs...)
	}
	return out, nil
}

// allBut is every port but p (p > 0).
func allBut(p uint16) []tap.PortRange {
	var out []tap.PortRange
	if p > 1 {
		out = append(out, tap.PortRange{First: 1, Last: p - 1})
	}
	if p < 65535 {
		out = append(out, tap.PortRange{First: p + 1, Last: 65535})
	}
	return out
}
