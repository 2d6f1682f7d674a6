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
// A policy's port is the server side's port of the flows, the way a policy names a service
// (port("dvd/db", "TCP", 5432)); a contract's ports are per side (tap.Match). So:
//   - ingress, port P: packets arriving at the endpoint on its own port P (Match.Ports);
//   - egress, port P: packets the endpoint sends to a peer's port P (Match.PeerPorts);
//   - both, port P: two contracts, the ingress one (name suffixed "-in") and the egress
//     one ("-out"); their directions are disjoint, so they never overlap each other;
//   - port 0: any port, one contract in the given direction.
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
		c.Match.Ports = port
		out = append(out, &c)
	case dir == tap.Egress:
		c := base
		c.Match.PeerPorts = port
		out = append(out, &c)
	default:
		in, eg := base, base
		in.Name, in.Match.Direction, in.Match.Ports = k.Name+SuffixIngress, tap.Ingress, port
		eg.Name, eg.Match.Direction, eg.Match.PeerPorts = k.Name+SuffixEgress, tap.Egress, port
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
