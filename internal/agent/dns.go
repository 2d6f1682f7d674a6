package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/dnsproxy"
	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// DNS-aware policy (docs/policy-language.md, "DNS"): the DNS proxy judges the queries that
// rules.dns applies to and hands the answers it forwards to the agent, which learns the
// names' addresses in the fqdn cache; toFQDNs peers become those addresses, each a /32 (or
// /128) CIDR peer, in the next computation. A learnt address that changes what some
// selector selects is a change like any other (one transaction), and the proxy answers
// the pod only once it is committed, so the pod's first packet to the address passes.

// DNSKernel is what the DNS path needs of the dataplane (dnsKernel, kernel.go).
type DNSKernel interface {
	// SetDNSProxy tells the dataplane where the DNS proxy's sockets are, the judging
	// ones or (observe) the observing ones (zero: nowhere, so such DNS flows are dropped).
	SetDNSProxy(addr netip.AddrPort, observe bool) error
	// ConntrackPeers lists the peer addresses of the flows whose last packet is at most
	// maxIdle old.
	ConntrackPeers(maxIdle time.Duration) (map[netip.Addr]bool, error)
}

// DNSProxy is the running DNS proxy as the agent uses it (*dnsproxy.Proxy).
type DNSProxy interface {
	Addr() netip.AddrPort
	Stats() dnsproxy.Stats
	Close() error
}

// zombieIdle is how long a flow may be idle and still keep the identity of an address
// whose TTL ran out: conntrack's longest timeout (established TCP).
const zombieIdle = 6 * time.Hour

// fqdnView is what a model knows of learnt names: for every toFQDNs selector in force, the
// live addresses it selects, and the addresses kept only for open connections. Immutable.
type fqdnView struct {
	addrs   map[string][]netip.Addr // by fqdn.Selector.String()
	zombies []netip.Addr
}

func (v *fqdnView) equal(o *fqdnView) bool {
	if v == nil || o == nil {
		return v == o
	}
	return maps.EqualFunc(v.addrs, o.addrs, slices.Equal[[]netip.Addr]) && slices.Equal(v.zombies, o.zombies)
}

// dnsState is the agent's DNS machinery: the cache of learnt names, the proxy (started
// when some state has DNS rules) and the expiry timer. Guarded by the agent's mu, except
// the cache, which is safe for concurrent use.
type dnsState struct {
	cache *fqdn.Cache
	proxy DNSProxy
	// observer is the proxy's observing instance: it forwards every query of endpoints
	// with EndpointPolicy.DNSObserve (policy allowed them at L4) and learns the answers.
	observer DNSProxy
	// proxy6 and observer6 are the same on a dual-stack node for IPv6 queries.
	proxy6, observer6 DNSProxy
	err               string // why the proxy could not be started
	stop              context.CancelFunc
	wake              chan struct{} // the expiry loop looks at the cache again
	done              chan struct{}
	once              sync.Once
}

// fqdnSelectors lists the toFQDNs selectors of the model's rules, by key.
func fqdnSelectors(m *model) map[string]fqdn.Selector {
	out := map[string]fqdn.Selector{}
	for _, p := range m.policies {
		for _, r := range p.pol.Rules {
			for _, peer := range r.Peers {
				if peer.Kind == policy.PeerFQDN {
					out[peer.FQDN.String()] = peer.FQDN
				}
			}
		}
	}
	return out
}

// fqdnViewOf computes the view of the cache that model m's selectors see at now.
func fqdnViewOf(c *fqdn.Cache, m *model, now time.Time) *fqdnView {
	v := &fqdnView{addrs: map[string][]netip.Addr{}, zombies: c.Zombies()}
	for key, s := range fqdnSelectors(m) {
		if a := c.Addrs(now, s); len(a) > 0 {
			v.addrs[key] = a
		}
	}
	return v
}

// expandFQDN adds to every toFQDNs (and domainNames) peer of rules CIDR peers of the
// addresses the view gives its selector (none yet: the peer selects nothing). The FQDN
// peer stays, selecting nothing itself, so the computation still knows the rule has one.
// Rules without such peers are kept as they are; the others are copies.
func expandFQDN(rules []policy.Rule, v *fqdnView) []policy.Rule {
	for i := range rules {
		if !slices.ContainsFunc(rules[i].Peers, func(p policy.Peer) bool { return p.Kind == policy.PeerFQDN }) {
			continue
		}
		r := rules[i]
		peers := make([]policy.Peer, 0, len(r.Peers))
		for _, p := range r.Peers {
			peers = append(peers, p)
			if p.Kind != policy.PeerFQDN || v == nil {
				continue
			}
			for _, a := range v.addrs[p.FQDN.String()] {
				peers = append(peers, policy.Peer{Kind: policy.PeerCIDR, CIDR: netip.PrefixFrom(a, a.BitLen())})
			}
		}
		r.Peers = peers
		rules[i] = r
	}
	return rules
}

// zombiePrefixes gives the host prefixes of the view's zombies: they keep their CIDR
// identity in the ipcache, selected by no rule, so that an open connection to one is not
// judged as another identity's (which would drop it).
func zombiePrefixes(v *fqdnView) []netip.Prefix {
	if v == nil {
		return nil
	}
	out := make([]netip.Prefix, 0, len(v.zombies))
	for _, a := range v.zombies {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out
}

// dnsPolicy is the agent as the DNS proxy's Policy.
type dnsPolicy struct{ a *Agent }

// Allow judges a query by the rules.dns of its sender's egress policy for its server, as
// the dataplane looked the server up: its identity, any, and its flagged CIDR identity.
func (p dnsPolicy) Allow(q dnsproxy.Query) (bool, string) {
	v := p.a.view.Load()
	if v == nil {
		return false, ""
	}
	ep, ok := v.byIP[q.Source.Addr().Unmap()]
	if !ok {
		return false, "no endpoint has the query's source address"
	}
	server := q.Server.Addr().Unmap()
	e, _ := mapstate.LookupIPCache(v.ipcache, server)
	ids := []identity.Identity{e.Identity, identity.Any}
	if e.Secondary != 0 {
		ids = append(ids, e.Secondary)
	}
	for _, r := range mapstate.DNSFor(mapstate.State{DNS: v.dns}, ep.EpID, policy.Protocol(q.Protocol), q.Server.Port(), ids) {
		for _, s := range r.Selectors {
			if s.Matches(q.Name) {
				return true, ruleName(v, r.RuleID) + " " + s.String()
			}
		}
	}
	return false, "no rules.dns selector of the endpoint's egress policy matches"
}

func ruleName(v *view, id uint32) string {
	if ref, ok := v.rules[id]; ok {
		return ref.Policy + " " + ref.Rule
	}
	return fmt.Sprintf("rule %d", id)
}

// dnsObserver is the agent as the observing proxy's Policy: the dataplane hands it only
// queries that policy allowed, so it lets every one through and learns the answers.
type dnsObserver struct{ a *Agent }

func (p dnsObserver) Allow(dnsproxy.Query) (bool, string) {
	return true, "observed: allowed by policy, learnt for domainNames"
}

func (p dnsObserver) Learn(q dnsproxy.Query, answers []dnsproxy.Answer) error {
	return p.a.learnNames(time.Now(), answers)
}

// Learn records an allowed answer's names and addresses; when that changes what a
// toFQDNs selector selects, it applies the change and returns once it is in the dataplane.
func (p dnsPolicy) Learn(q dnsproxy.Query, answers []dnsproxy.Answer) error {
	return p.a.learnNames(time.Now(), answers)
}

// learnNames puts answers in the cache and, if a selector's addresses changed, commits
// the new view.
func (a *Agent) learnNames(now time.Time, answers []dnsproxy.Answer) error {
	changed := false
	for _, an := range answers {
		if a.dns.cache.Learn(now, an.Name, an.Addrs, an.TTL) {
			changed = true
		}
	}
	a.wakeExpiry()
	if !changed {
		return nil
	}
	return a.refreshFQDN(now)
}

// refreshFQDN recomputes the model's view of the cache and applies it if it changed.
func (a *Agent) refreshFQDN(now time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := fqdnViewOf(a.dns.cache, a.model, now)
	if v.equal(a.model.fqdn) {
		return nil
	}
	if _, _, err := a.change(func(m *model) error { m.fqdn = v; return nil }); err != nil {
		return fmt.Errorf("applying learnt names: %w", err)
	}
	return nil
}

// startDNS creates the cache (restored from the state file's entries) and the expiry
// loop. The proxy starts with the first state that has DNS rules (dnsProxyUpdate).
func (a *Agent) startDNS(entries []fqdn.Entry) error {
	a.dns = &dnsState{cache: fqdn.NewCache(a.cfg.FQDN), wake: make(chan struct{}, 1), done: make(chan struct{})}
	if err := a.dns.cache.Restore(entries); err != nil {
		return fmt.Errorf("restoring learnt names: %w", err)
	}
	return nil
}

// runExpiry expires learnt names when their time comes, until ctx ends.
func (a *Agent) runExpiry(ctx context.Context) {
	defer close(a.dns.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := a.dns.cache.NextExpiry()
		wait := time.Minute // zombies are looked at again at least this often
		if !next.IsZero() {
			wait = min(wait, time.Until(next))
		}
		timer.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
			return
		case <-a.dns.wake:
			continue
		case <-timer.C:
		}
		a.expireNames(time.Now())
	}
}

func (a *Agent) wakeExpiry() {
	select {
	case a.dns.wake <- struct{}{}:
	default:
	}
}

// expireNames drops what expired, keeping as zombies the addresses open flows use.
func (a *Agent) expireNames(now time.Time) {
	var peers map[netip.Addr]bool
	inUse := func(addr netip.Addr) bool {
		if a.dp.DNS == nil {
			return false
		}
		if peers == nil {
			var err error
			if peers, err = a.dp.DNS.ConntrackPeers(zombieIdle); err != nil {
				a.log.Warn("listing open flows for learnt addresses", "error", err)
				peers = map[netip.Addr]bool{}
			}
		}
		return peers[addr]
	}
	if !a.dns.cache.Expire(now, inUse) {
		return
	}
	if err := a.refreshFQDN(now); err != nil {
		a.log.Error("applying expired names", "error", err)
	}
}

// dnsProxyUpdate starts the DNS proxy (judging, for DNS rules; observing, for endpoints
// whose answers must be learnt) and tells the dataplane where it is, before the first
// state that needs it steers queries to it. Without it those queries are dropped (fail
// closed), and the failure is kept for status.
func (a *Agent) dnsProxyUpdate(new *desired) error {
	judge, observe := len(new.state.DNS) > 0, false
	for _, pol := range new.state.Endpoints {
		observe = observe || pol.DNSObserve
	}
	dual := a.cfg.PodCIDR6.IsValid()
	missing := judge && (a.dns.proxy == nil || dual && a.dns.proxy6 == nil) ||
		observe && (a.dns.observer == nil || dual && a.dns.observer6 == nil)
	if a.dp.DNS == nil || !missing {
		return nil
	}
	if err := a.routeToProxies(); err != nil {
		return fmt.Errorf("routing to the DNS proxy: %w", err)
	}
	open := a.cfg.OpenDNSProxy
	if open == nil {
		open = openDNSProxy
	}
	start := func(listen netip.AddrPort, pol dnsproxy.Policy, observe bool) (DNSProxy, error) {
		p, err := open(a.cfg, a.net.NetnsPath(), listen, pol)
		if err != nil {
			a.dns.err = err.Error()
			a.log.Error("DNS rules or domainNames are in force but the DNS proxy cannot run: their queries are dropped", "error", err)
			return nil, nil
		}
		if err := a.dp.DNS.SetDNSProxy(p.Addr(), observe); err != nil {
			p.Close()
			return nil, fmt.Errorf("DNS proxy: %w", err)
		}
		a.dns.err = ""
		return p, nil
	}
	for _, w := range []struct {
		want    bool
		slot    *DNSProxy
		listen  netip.AddrPort
		pol     dnsproxy.Policy
		observe bool
	}{
		{judge, &a.dns.proxy, a.cfg.DNSProxyListen, dnsPolicy{a}, false},
		{observe, &a.dns.observer, a.cfg.dnsObserveListen(), dnsObserver{a}, true},
		{judge && dual, &a.dns.proxy6, ipv6Loopback(a.cfg.DNSProxyListen), dnsPolicy{a}, false},
		{observe && dual, &a.dns.observer6, ipv6Loopback(a.cfg.dnsObserveListen()), dnsObserver{a}, true},
	} {
		if !w.want || *w.slot != nil {
			continue
		}
		p, err := start(w.listen, w.pol, w.observe)
		if err != nil {
			return err
		}
		*w.slot = p
	}
	return nil
}

// dnsObserveListen is where the observing DNS proxy listens: the port after
// DNSProxyListen's.
func (cfg Config) dnsObserveListen() netip.AddrPort {
	return netip.AddrPortFrom(cfg.DNSProxyListen.Addr(), cfg.DNSProxyListen.Port()+1)
}

// ipv6Loopback is the IPv6 loopback address at ap's port: where a dual-stack node's DNS
// proxy takes IPv6 queries.
func ipv6Loopback(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(netip.IPv6Loopback(), ap.Port())
}

// openDNSProxy starts a DNS proxy in the node namespace.
func openDNSProxy(cfg Config, netnsPath string, listen netip.AddrPort, pol dnsproxy.Policy) (DNSProxy, error) {
	p, err := dnsproxy.New(dnsproxy.Config{
		ListenAddr:  listen,
		Transparent: true,
		Netns:       netnsPath,
	}, pol)
	if err != nil {
		return nil, fmt.Errorf("starting the DNS proxy: %w", err)
	}
	go func() {
		if err := p.Serve(context.Background()); err != nil && !errors.Is(err, context.Canceled) {
			cfg.Logger.Error("DNS proxy stopped", "error", err)
		}
	}()
	return p, nil
}

// closeDNS stops the proxy and the expiry loop.
func (a *Agent) closeDNS() error {
	if a.dns == nil {
		return nil
	}
	var err error
	a.dns.once.Do(func() {
		if a.dns.stop != nil {
			a.dns.stop()
			<-a.dns.done
		}
		for _, p := range []DNSProxy{a.dns.proxy, a.dns.observer, a.dns.proxy6, a.dns.observer6} {
			if p != nil {
				err = errors.Join(err, p.Close())
			}
		}
	})
	return err
}

// DefaultDNSProxyListen is where the DNS proxy listens unless Config says otherwise.
var DefaultDNSProxyListen = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 15053)

// comparePrefix orders prefixes as mapstate.Prefixes does: by address, then length.
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// dnsStatus reports the DNS proxy and the learnt names; a.mu must be held.
func (a *Agent) dnsStatus() api.DNSStatus {
	st := api.DNSStatus{State: "not started"}
	switch {
	case a.dns.proxy != nil:
		st.State, st.Listen = "running", a.dns.proxy.Addr().String()
		ps := a.dns.proxy.Stats()
		st.Queries, st.Allowed, st.Refused, st.Forwarded = ps.Queries, ps.Allowed, ps.Refused, ps.Forwarded
		st.UpstreamErrors, st.LearnErrors = ps.UpstreamErrors, ps.LearnErrors
		for r, n := range ps.Drops {
			if st.Drops == nil {
				st.Drops = map[string]uint64{}
			}
			st.Drops[string(r)] = n
		}
	case a.dns.err != "":
		st.State, st.Error = "unavailable", a.dns.err
	}
	if a.dns.observer != nil {
		st.Observing = a.dns.observer.Addr().String()
		st.Observed = a.dns.observer.Stats().Queries
	}
	cs := a.dns.cache.Stats()
	st.Names, st.Entries, st.Addresses, st.Zombies = cs.Names, cs.Entries, cs.Addrs, cs.Zombies
	st.Evicted = cs.EvictedNames + cs.EvictedEntries + cs.EvictedZombies
	return st
}
