package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/proxy"
)

// The L7 proxy's life in the agent:
//
//   - The dataplane is told where the proxy listens when the agent starts (SetupProxy),
//     whether or not any policy has L7 rules: a connection that needs the proxy while
//     nothing listens there is dropped (fail closed).
//   - The proxy (control plane, then Envoy) starts the first time the desired state has
//     L7 rules, and then runs until the agent stops, even if the L7 rules go away: starting
//     Envoy again for the next L7 rule would cost a second or so of refused connections.
//   - Every change gives the proxy the new state before the dataplane gets it (and waits
//     until a running Envoy applied it), keeping the old state's chains so that
//     connections the dataplane still steers under the old state are judged by the new
//     one; once the dataplane moved, chains no longer needed go.
//   - The agent stops Envoy when it stops: L7 connections are then refused until it is
//     back, while L3/L4 enforcement carries on from the pinned maps.

// ProxyRouting hands connections to the L7 proxy.
type ProxyRouting interface {
	// SetupProxy prepares the node namespace at netnsPath for the L7 proxy and tells the
	// dataplane where the proxy's transparent listener is. Idempotent.
	SetupProxy(netnsPath string, listen, listen6 netip.AddrPort) error
	// RouteToProxy makes the node namespace at netnsPath deliver locally the packets the
	// dataplane hands to the proxy (a policy route, which costs all forwarded traffic a
	// little, so the agent adds it only once L7 rules are in force). Idempotent.
	RouteToProxy(netnsPath string) error
}

// proxyListen6 is the proxy's listener for IPv6 connections on a dual-stack node (the fast
// path's, or with --l7-envoy-only Envoy's): on the IPv6 loopback at the IPv4 listener's
// port.
func (cfg Config) proxyListen6() netip.AddrPort {
	if !cfg.PodCIDR6.IsValid() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(netip.IPv6Loopback(), cfg.ProxyListen.Port())
}

// proxyRunDir is where the proxy's sockets, bootstrap and log live: in the state
// directory, unless that path is too long for Unix sockets.
func (cfg Config) proxyRunDir() string {
	d := filepath.Join(cfg.StateDir, "proxy")
	if len(d) <= 80 {
		return d
	}
	return filepath.Join("/run/rampart", "proxy-"+cfg.Instance)
}

func openProxy(cfg Config, netnsPath string, onLog func(flow.AccessLog)) (Proxy, error) {
	bin, err := proxy.FindEnvoy(cfg.Envoy)
	if err != nil {
		return nil, err
	}
	return proxy.New(proxy.Config{
		Instance:    cfg.Instance,
		Concurrency: cfg.ProxyConcurrency,
		Envoy:       bin,
		NetnsPath:   netnsPath,
		RunDir:      cfg.proxyRunDir(),
		// The dataplane admits the proxy's upstream connections by this socket mark.
		Options: proxy.Options{
			Listen:       cfg.ProxyListen,
			Listen6:      cfg.proxyListen6(),
			UpstreamMark: datapath.ProxyUpstreamMark,
			FastPath:     !cfg.ProxyEnvoyOnly,
		},
		Logger:      cfg.Logger.With("instance", cfg.Instance),
		OnAccessLog: onLog,
	})
}

// ensureProxy returns the proxy, creating it on first use; a.mu must be held. A failure is
// kept for status.
func (a *Agent) ensureProxy() (Proxy, error) {
	if a.prox != nil {
		return a.prox, nil
	}
	open := a.cfg.OpenProxy
	if open == nil {
		open = openProxy
	}
	p, err := open(a.cfg, a.net.NetnsPath(), a.onAccessLog)
	if err != nil {
		a.proxyErr = err.Error()
		return nil, fmt.Errorf("starting the L7 proxy: %w", err)
	}
	a.prox, a.proxyErr = p, ""
	return p, nil
}

// l7Plans are the L7 plans of one change from old to new, built once and handed to the
// proxy and to the send-side verdict, so that both judge by the same values.
type l7Plans struct {
	plan *l7plan.Plan // new's
	// kept is new's plan with old's chains kept (see l7plan.BuildPlan): what the proxy
	// enforces while the dataplane moves from old to new. It is plan itself when old has
	// no chain that new lacks.
	kept *l7plan.Plan
}

func buildL7Plans(old, new *desired) l7Plans {
	if len(new.state.L7) == 0 && len(old.state.L7) == 0 {
		empty := &l7plan.Plan{}
		return l7Plans{plan: empty, kept: empty}
	}
	plan := l7plan.BuildPlan(new.state, nil)
	p := l7Plans{plan: &plan, kept: &plan}
	if retiredChains(old.state.L7, new.state.L7) {
		kept := l7plan.BuildPlan(new.state, &old.state)
		p.kept = &kept
	}
	return p
}

// proxyUpdate gives the proxy new (keeping old's chains: pl.kept) before the dataplane
// moves from old to new. With L7 rules and no proxy to be had, it goes on without: the
// dataplane refuses what needs the proxy.
func (a *Agent) proxyUpdate(old, new *desired, pl l7Plans) error {
	if a.prox == nil && len(new.state.L7) == 0 {
		return nil
	}
	if len(new.state.L7) > 0 {
		if err := a.routeToProxies(); err != nil {
			return fmt.Errorf("routing to the L7 proxy: %w", err)
		}
	}
	p, err := a.ensureProxy()
	if err != nil {
		a.log.Error("L7 rules are in force but the proxy cannot run: connections that need it are refused", "error", err)
		return nil
	}
	if err := p.Update(context.Background(), pl.kept); err != nil {
		return fmt.Errorf("L7 proxy: %w", err)
	}
	p.Start()
	return nil
}

// routeToProxies makes the node namespace deliver steered packets locally, once: before
// the dataplane steers anything to a proxy (the L7 proxy or the DNS proxy). Without the
// route, steered packets would be forwarded to their destination, which drops them (proxy
// bypass): closed, but broken.
func (a *Agent) routeToProxies() error {
	if a.proxyRouted {
		return nil
	}
	if a.host {
		if err := a.own.recordProxyRouting(a.net.NetnsPath()); err != nil {
			return err
		}
	}
	if err := a.dp.RouteToProxy(a.net.NetnsPath()); err != nil {
		return err
	}
	a.proxyRouted = true
	return nil
}

// proxyPrune drops the chains that only the previous state needed, once the dataplane no
// longer steers to them. Failing is harmless (the extra chains judge by the new state), so
// it is only logged.
func (a *Agent) proxyPrune(old, new *desired, pl l7Plans) {
	if a.prox == nil || !retiredChains(old.state.L7, new.state.L7) {
		return
	}
	if err := a.prox.Update(context.Background(), pl.plan); err != nil {
		a.log.Warn("removing unused L7 proxy chains", "error", err)
	}
}

// retiredChains reports whether old has an (endpoint, direction, port) with L7 rules that
// new has not.
func retiredChains(old, new []mapstate.L7Rule) bool {
	type key struct {
		ep   uint32
		dir  policy.Direction
		port uint16
	}
	keep := map[key]bool{}
	for _, r := range new {
		keep[key{r.EndpointID, r.Direction, r.Port}] = true
	}
	for _, r := range old {
		if !keep[key{r.EndpointID, r.Direction, r.Port}] {
			return true
		}
	}
	return false
}

// requireProxy refuses a change that brings L7 rules when the proxy cannot run (Envoy
// missing, say): better to say so than to accept rules whose traffic would all be refused.
func (a *Agent) requireProxy(ps []*policy.Policy) error {
	if err := a.requireHostPolicy(ps); err != nil {
		return err
	}
	if !hasL7(ps) {
		return nil
	}
	if _, err := a.ensureProxy(); err != nil {
		return api.Errorf(http.StatusServiceUnavailable, "policy has L7 (HTTP) rules, but %v", err)
	}
	return nil
}

func hasL7(ps []*policy.Policy) bool {
	for _, p := range ps {
		for _, r := range p.Rules {
			for _, pr := range r.Ports {
				if pr.HTTP != nil {
					return true
				}
			}
		}
	}
	return false
}

// proxyStatus is the proxy part of status; a.mu must be held.
func (a *Agent) proxyStatus() api.ProxyStatus {
	if a.prox == nil {
		if a.proxyErr != "" {
			return api.ProxyStatus{State: "unavailable", Error: a.proxyErr}
		}
		return api.ProxyStatus{State: "not started"}
	}
	s := a.prox.Status()
	out := api.ProxyStatus{
		PID: s.PID, StartedAt: s.StartedAt, Restarts: s.Restarts, Version: s.Version, AckedVersion: s.AckedVersion,
		Chains: s.Chains, Listen: s.Listen, Binary: s.Binary, Log: s.Log, LastExit: s.LastExit, Error: s.LastError,
	}
	if f := s.FastPath; f != nil {
		out.FastPath = &api.FastPathStatus{Listen: f.Listen, Requests: f.Requests, Denied: f.Denied, HandedOver: f.HandedOver, Open: f.Open}
	}
	switch {
	case s.Running && s.Connected:
		out.State = "running"
	case !s.Running && s.Restarts == 0 && s.LastError == "" && s.Version <= 1:
		// Created (an L7 policy was being applied) but never given a configuration: the
		// change did not go through.
		out.State = "not started"
	case !s.Running && s.Restarts > 0:
		out.State = "restarting"
	default:
		out.State = "starting"
	}
	return out
}

func (a *Agent) closeProxy() error {
	a.mu.Lock()
	p := a.prox
	a.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Close()
}

// onAccessLog turns a request the proxy handled into a flow. It runs on the request's
// path (the fast path calls it after each request), so the flow is kept as the proxy's
// record with the view of this moment, and decorated only when someone reads it (see
// flowHub.publishL7).
func (a *Agent) onAccessLog(l flow.AccessLog) {
	a.flows.publishL7(&l7Record{log: l, view: a.view.Load()})
}

// l7Dropped says whether a request's flow has the verdict DROPPED (as decorateL7 sets
// it): refused by an L7 rule, or never forwarded upstream.
func l7Dropped(l *flow.AccessLog) bool { return l.Denied || !l.Upstream }

// decorateL7 turns the proxy's record of a request into a flow, with the names, identities
// and rules of view v.
func decorateL7(v *view, l flow.AccessLog) api.Flow {
	f := api.Flow{
		Time:     l.Time,
		Type:     api.FlowTypeL7,
		Protocol: "TCP",
		Source:   v.peer(l.Src.Addr(), l.Src.Port(), v.identityOf(l.Src.Addr())),
		Dest:     v.peer(l.Dst.Addr(), l.Dst.Port(), v.identityOf(l.Dst.Addr())),
		L7: &api.L7Flow{
			Protocol:  l.Protocol,
			Method:    l.Method,
			Path:      l.Path,
			Host:      l.Host,
			Status:    l.Status,
			LatencyMs: float64(l.Latency.Microseconds()) / 1000,
			Detail:    l.Details,
		},
	}
	switch {
	case l.Denied:
		f.Verdict, f.Reason = flow.VerdictDropped.String(), ReasonL7Denied
	case l.Upstream:
		f.Verdict = flow.VerdictForwarded.String()
	default:
		f.Verdict, f.Reason = flow.VerdictDropped.String(), ReasonL7Error
	}
	// The send-side verdict's records name their chain after it (sockAccessLog).
	if l.Chain == flow.FlagSendSide.String() {
		f.Flags = []string{flow.FlagSendSide.String()}
	}
	// The side that decided: the one that refused; else the one whose L7 rule let the
	// request through (ingress first); else whichever ran.
	var d *flow.Decision
	switch {
	case l.Egress != nil && !l.Egress.Allowed:
		d = l.Egress
	case l.Ingress != nil && !l.Ingress.Allowed:
		d = l.Ingress
	case l.Ingress != nil && l.Ingress.RuleID != 0:
		d = l.Ingress
	case l.Egress != nil && l.Egress.RuleID != 0:
		d = l.Egress
	case l.Ingress != nil:
		d = l.Ingress
	case l.Egress != nil:
		d = l.Egress
	}
	if d != nil {
		f.Direction = d.Direction.String()
		if e, ok := v.byEpID[d.EndpointID]; ok {
			f.Endpoint = e.Key()
		}
		if d.RuleID != 0 {
			if r, ok := v.rules[d.RuleID]; ok {
				f.Rule = &r
			} else {
				f.Rule = &api.RuleRef{ID: d.RuleID}
			}
		}
	} else {
		// No check ran (e.g. a malformed request): name the chain's endpoint.
		switch {
		case strings.HasPrefix(l.Chain, "out:"):
			f.Direction = policy.Egress.String()
			if e, ok := v.byIP[l.Src.Addr()]; ok {
				f.Endpoint = e.Key()
			}
		default:
			f.Direction = policy.Ingress.String()
			if e, ok := v.byIP[l.Dst.Addr()]; ok {
				f.Endpoint = e.Key()
			}
		}
	}
	return f
}

// identityOf is the identity the dataplane gives an address (ipcache longest prefix).
func (v *view) identityOf(a netip.Addr) identity.Identity {
	if !a.IsValid() {
		return 0
	}
	e, _ := mapstate.LookupIPCache(v.ipcache, a)
	return e.Identity
}
