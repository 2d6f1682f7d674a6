package proxy

import (
	"net/netip"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdata "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/policy"
)

// rbacMetadataNS is the dynamic metadata namespace the RBAC filters write to.
const rbacMetadataNS = "envoy.filters.http.rbac"

// decodeLog turns one of Envoy's access log entries into the record of the request.
func (m *Manager) decodeLog(e *accesslogdata.HTTPAccessLogEntry) flow.AccessLog {
	c := e.GetCommonProperties()
	req, resp := e.GetRequest(), e.GetResponse()
	l := flow.AccessLog{
		Chain:   c.GetRouteName(),
		Src:     addrPort(c.GetDownstreamRemoteAddress()),
		Dst:     addrPort(c.GetDownstreamLocalAddress()),
		Method:  req.GetRequestMethod().String(),
		Path:    req.GetPath(),
		Host:    req.GetAuthority(),
		Status:  resp.GetResponseCode().GetValue(),
		Details: resp.GetResponseCodeDetails(),
	}
	if !l.Src.IsValid() {
		l.Src = addrPort(c.GetDownstreamRemoteAddress())
	}
	if l.Method == "METHOD_UNSPECIFIED" {
		l.Method = ""
	}
	if i := strings.IndexByte(l.Path, '?'); i >= 0 {
		l.Path = l.Path[:i]
	}
	if t := c.GetStartTime(); t != nil {
		l.Time = t.AsTime()
	}
	if d := c.GetTimeToLastDownstreamTxByte(); d != nil {
		l.Latency = d.AsDuration()
	} else if d := c.GetDuration(); d != nil {
		l.Latency = d.AsDuration()
	}
	switch e.GetProtocolVersion() {
	case accesslogdata.HTTPAccessLogEntry_HTTP10:
		l.Protocol = "HTTP/1.0"
	case accesslogdata.HTTPAccessLogEntry_HTTP11:
		l.Protocol = "HTTP/1.1"
	case accesslogdata.HTTPAccessLogEntry_HTTP2:
		l.Protocol = "HTTP/2"
	case accesslogdata.HTTPAccessLogEntry_HTTP3:
		l.Protocol = "HTTP/3"
	}
	l.Denied = strings.HasPrefix(l.Details, "rbac_access_denied")
	l.Upstream = c.GetUpstreamRemoteAddress() != nil && strings.HasPrefix(l.Details, "via_upstream")

	// The shadow rules (the same policies) say which grant matched on each side.
	md := c.GetMetadata().GetFilterMetadata()[rbacMetadataNS].GetFields()
	chain := m.chain(l.Chain)
	for _, side := range []struct {
		prefix string
		dir    policy.Direction
		out    **flow.Decision
	}{{shadowPrefixEgress, policy.Egress, &l.Egress}, {shadowPrefixIngress, policy.Ingress, &l.Ingress}} {
		res := md[side.prefix+"shadow_engine_result"].GetStringValue()
		if res == "" {
			continue // this side did not run (absent, or an earlier filter refused)
		}
		d := &flow.Decision{Direction: side.dir, Allowed: res == "allowed"}
		if d.Allowed {
			d.Grant = md[side.prefix+"shadow_effective_policy_id"].GetStringValue()
		}
		if chain != nil {
			z := chain.Ingress
			if side.dir == policy.Egress {
				z = chain.Egress
			}
			if z != nil {
				d.EndpointID = z.EndpointID
				for _, g := range z.Grants {
					if g.Name == d.Grant {
						d.RuleID = g.RuleID
					}
				}
			}
		}
		*side.out = d
	}
	return l
}

// chain finds a chain of the current plan by name.
func (m *Manager) chain(name string) *l7plan.Chain {
	p := m.plan.Load()
	for i := range p.Chains {
		if p.Chains[i].Name == name {
			return &p.Chains[i]
		}
	}
	return nil
}

func addrPort(a *core.Address) netip.AddrPort {
	sa := a.GetSocketAddress()
	if sa == nil {
		return netip.AddrPort{}
	}
	ip, err := netip.ParseAddr(sa.GetAddress())
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(sa.GetPortValue()))
}
