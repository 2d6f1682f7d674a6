package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// Trace explains how the dataplane decides a new connection, from the state it was given.
func (a *Agent) Trace(ctx context.Context, req api.TraceRequest) (api.TraceResult, error) {
	proto, err := parseProtocol(req.Protocol)
	if err != nil {
		return api.TraceResult{}, api.BadRequest("%v", err)
	}
	if req.Port == 0 && proto != policy.ProtoICMP && proto != policy.ProtoICMPv6 {
		return api.TraceResult{}, api.BadRequest("port: want 1-65535")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	from, err := a.tracePeer(req.From)
	if err != nil {
		return api.TraceResult{}, err
	}
	to, err := a.tracePeer(req.To)
	if err != nil {
		return api.TraceResult{}, err
	}
	if key, why := a.unresolvedPeer(req.From, req.To); key != "" {
		// Its policy could not be computed: the dataplane denies it both ways.
		return api.TraceResult{Diagnostic: fmt.Sprintf("endpoint %s is denied all traffic: %s", key, why)}, nil
	}
	if from.Endpoint == nil && from.Node == "" && to.Endpoint == nil && to.Node == "" {
		return api.TraceResult{}, api.BadRequest("neither %s nor %s is an endpoint: no policy applies", req.From, req.To)
	}
	in := a.cur.input
	member, note := a.membership(a.model.cidrsets)
	in.CIDRSetMembership = member
	res, err := a.eng.Trace(in, a.cur.state, TraceQuery{From: from, To: to, Protocol: proto, Port: req.Port})
	if err != nil {
		return api.TraceResult{}, err
	}
	v := a.view.Load()
	var elsewhere []string
	ingressRedirected := false
	for i := range res.Sides {
		s := &res.Sides[i]
		ingressRedirected = ingressRedirected || s.Direction == policy.Ingress.String() && s.Redirected
		if s.Node != "" {
			s.Node = a.nodeNamed(s.Node)
			elsewhere = append(elsewhere, fmt.Sprintf("%s at %s by node %s", s.Direction, s.Endpoint, s.Node))
		}
		if r := res.Sides[i].Rule; r != nil {
			if full, ok := v.rules[r.ID]; ok {
				res.Sides[i].Rule = &full
			}
		}
		for j := range res.Sides[i].L7 {
			if r := res.Sides[i].L7[j].Rule; r != nil {
				if full, ok := v.rules[r.ID]; ok {
					res.Sides[i].L7[j].Rule = &full
				}
			}
		}
	}
	if from.Endpoint == nil && ingressRedirected {
		// Only endpoint veths steer connections to the proxy: one from elsewhere reaches
		// the destination without the proxy's mark and is dropped there.
		res.Allowed, res.Redirected = false, false
		res.Diagnostic = "L7 rules apply, but only connections from endpoints are steered to the L7 proxy: the dataplane drops this one (proxy-bypass)"
	}
	if res.Redirected && traceIPv6(req, proto) {
		// The IPv6 path drops what it would have to steer (REASON_PROXY_UNAVAILABLE).
		res.Allowed, res.Redirected = false, false
		res.Diagnostic = strings.TrimSpace(res.Diagnostic + " L7 or DNS rules apply, and the L7 and DNS proxies take IPv4 only: the dataplane drops this IPv6 connection (proxy-unavailable).")
	}
	if len(elsewhere) > 0 {
		// Say plainly which decisions are not this node's own.
		res.Diagnostic = strings.TrimSpace(res.Diagnostic + " Decided on another node, judged here from the policies and pods this node knows: " +
			strings.Join(elsewhere, ", ") + ".")
	}
	if *note != "" {
		res.Diagnostic = strings.TrimSpace(res.Diagnostic + " " + *note)
	}
	if missing := in.MissingCIDRGroups(); len(missing) > 0 {
		res.Diagnostic = strings.TrimSpace(res.Diagnostic + fmt.Sprintf(" Policies name CIDR groups that do not exist, whose peers select nothing: %s.", strings.Join(missing, ", ")))
	}
	res.From, res.To = req.From, req.To
	res.Protocol, res.Port = protocolName(uint8(proto)), req.Port
	return res, nil
}

// traceIPv6 says whether a trace is of an IPv6 connection: a peer given by an IPv6 address,
// or ICMPv6.
func traceIPv6(req api.TraceRequest, proto policy.Protocol) bool {
	for _, s := range []string{req.From, req.To} {
		if a, err := netip.ParseAddr(s); err == nil && a.Is6() && !a.Is4In6() {
			return true
		}
	}
	return proto == policy.ProtoICMPv6
}

// tracePeer resolves "ns/name" (a local endpoint, or a pod on another node: its address,
// which the ipcache maps to its identity) or an address.
func (a *Agent) tracePeer(s string) (TracePeer, error) {
	host := a.hostEndpoint()
	if s == mapstate.HostEndpointName {
		if host == nil {
			return TracePeer{}, api.NotFound("host: this agent enforces no host policy (rampartd --host-firewall)")
		}
		return TracePeer{Endpoint: host, IP: host.IP}, nil
	}
	if strings.Contains(s, "/") {
		if rec, ok := a.model.endpoints[s]; ok {
			return TracePeer{Endpoint: a.mapstateEndpoint(rec), IP: rec.IP}, nil
		}
		if r, ok := a.model.remotes[s]; ok {
			return TracePeer{IP: r.IP, Node: r.Node}, nil
		}
		return TracePeer{}, api.NotFound("endpoint %s not found, on this node or another", s)
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return TracePeer{}, api.BadRequest("%q: want NAMESPACE/NAME or an IP address", s)
	}
	for _, rec := range a.model.endpoints {
		if rec.IP == ip || rec.IP6.IsValid() && rec.IP6 == ip {
			return TracePeer{Endpoint: a.mapstateEndpoint(rec), IP: ip}, nil
		}
	}
	for _, r := range a.model.remotes {
		if r.IP == ip {
			return TracePeer{IP: ip, Node: r.Node}, nil
		}
	}
	if host != nil && slices.Contains(a.cur.input.HostIPs, ip) {
		return TracePeer{Endpoint: host, IP: ip}, nil
	}
	return TracePeer{IP: ip}, nil
}

// hostEndpoint is the host endpoint of the current computation (nil without the host
// firewall).
func (a *Agent) hostEndpoint() *mapstate.Endpoint {
	for i := range a.cur.input.Endpoints {
		if a.cur.input.Endpoints[i].Host {
			return &a.cur.input.Endpoints[i]
		}
	}
	return nil
}

// unresolvedPeer returns the first of the peers (namespace/name or address) that is a
// local endpoint whose identity is unresolved, and why; "" if none is.
func (a *Agent) unresolvedPeer(peers ...string) (key, why string) {
	for _, s := range peers {
		for k, w := range a.cur.unresolved.endpoints {
			if rec := a.model.endpoints[k]; rec != nil && (s == k || s == rec.IP.String() || rec.IP6.IsValid() && s == rec.IP6.String()) {
				return k, w
			}
		}
	}
	return "", ""
}

// nodeNamed names the other node with address addr (addr itself if none has it).
func (a *Agent) nodeNamed(addr string) string {
	for _, n := range a.model.nodes {
		if n.Address.String() == addr {
			return n.Name
		}
	}
	return addr
}

func (a *Agent) mapstateEndpoint(rec *EndpointRecord) *mapstate.Endpoint {
	for i := range a.cur.input.Endpoints {
		if a.cur.input.Endpoints[i].ID == rec.EpID {
			return &a.cur.input.Endpoints[i]
		}
	}
	return nil
}
