package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/netns"
)

// Proxy is L7 and DNS steering: where the proxies listen (the proxy, proxy6 and dns_proxy
// maps) and the routing that delivers steered flows to them.
type Proxy struct{ *handle }

// The L7 proxy's place in the dataplane (see bpf/README.md, "L7 steering"). The marks and
// the routing table are fixed: the proxy (Envoy's original_src listener filter) must put
// ProxyUpstreamMark on its upstream sockets, and the node namespace must route
// ProxySteerMark to its local table (SetupProxyRouting).
const (
	// ProxySteerMark is set on packets steered to a proxy socket; the routing rule sends
	// them to ProxyRouteTable, which delivers everything locally.
	ProxySteerMark = 0x1
	// ProxyUpstreamMark is the socket mark of the proxy's upstream connections. A packet
	// with it may pass a destination's redirect entry (the proxy applied the L7 rules).
	// It must not share bits with ProxySteerMark.
	ProxyUpstreamMark = 0x2
	// ProxyRouteTable is the routing table with the local default route.
	ProxyRouteTable = 101
	// ProxyRulePriority is the priority of the fwmark rule (before the main table's 32766).
	ProxyRulePriority = 100
)

// DefaultProxyAddr is the proxy listener a new dataplane steers to until SetProxy says
// otherwise.
var DefaultProxyAddr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 15001)

// initProxy writes the default proxy config when the map has never been written (a fresh
// pin directory); a restarted agent keeps what was set.
func (d *Proxy) initProxy() error {
	var (
		zero uint32
		cfg  rampartProxyConfig
	)
	if err := d.objs.Proxy.Lookup(&zero, &cfg); err != nil {
		return fmt.Errorf("reading proxy config: %w", err)
	}
	if cfg.Family != 0 {
		return nil
	}
	return d.SetProxy(DefaultProxyAddr)
}

// SetProxy sets the address of the proxy's transparent listener in the node namespace
// (default DefaultProxyAddr), where the dataplane hands the first packet of every
// connection that L7 rules apply to: an IPv4 address for IPv4 connections, an IPv6 one
// (map proxy6; none by default) for IPv6 connections. A connection that needs the proxy
// is dropped while nothing listens there.
func (d *Proxy) SetProxy(addr netip.AddrPort) error {
	a := addr.Addr()
	if !a.IsValid() || a.Is4In6() || addr.Port() == 0 {
		return fmt.Errorf("setting proxy address %v: need an IPv4 or IPv6 address and a port", addr)
	}
	cfg := rampartProxyConfig{
		Port:         htons(addr.Port()),
		Family:       familyV4,
		SteerMark:    ProxySteerMark,
		UpstreamMark: ProxyUpstreamMark,
	}
	m := d.objs.Proxy
	if a.Is6() {
		cfg.Family, m = familyV6, d.objs.Proxy6
	}
	copy(cfg.Addr[:], a.AsSlice())
	var zero uint32
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := m.Update(&zero, &cfg, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("setting proxy address %v: %w", addr, err)
	}
	return nil
}

// Proxy returns the proxy listener address the dataplane steers to.
func (d *Proxy) Proxy() (netip.AddrPort, error) {
	var (
		zero uint32
		cfg  rampartProxyConfig
	)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.objs.Proxy.Lookup(&zero, &cfg); err != nil {
		return netip.AddrPort{}, fmt.Errorf("reading proxy config: %w", err)
	}
	if cfg.Family != familyV4 {
		return netip.AddrPort{}, nil
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(cfg.Addr[:4])), ntohs(cfg.Port)), nil
}

// SetDNSProxy sets the address of the DNS proxy's UDP socket and TCP listener (one port) in
// the node namespace, where the dataplane hands the queries that DNS rules apply to, and
// with observe, the address of its observing sockets, where it hands the allowed queries
// of endpoints whose answers must be learnt (EndpointPolicy.DNSObserve): an IPv4 address
// for IPv4 queries, an IPv6 one (map dns_proxy6) for IPv6 queries. The zero AddrPort
// clears the IPv4 one: such queries are then dropped.
func (d *Proxy) SetDNSProxy(addr netip.AddrPort, observe bool) error {
	var cfg rampartProxyConfig
	m := d.objs.DnsProxy
	if addr.IsValid() {
		a := addr.Addr()
		if a.Is4In6() || addr.Port() == 0 {
			return fmt.Errorf("setting DNS proxy address %v: need an IPv4 or IPv6 address and a port", addr)
		}
		cfg.Port, cfg.Family = htons(addr.Port()), familyV4
		if a.Is6() {
			cfg.Family, m = familyV6, d.objs.DnsProxy6
		}
		copy(cfg.Addr[:], a.AsSlice())
	}
	var idx uint32
	if observe {
		idx = 1
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := m.Update(&idx, &cfg, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("setting DNS proxy address %v: %w", addr, err)
	}
	return nil
}

func proxyRule(family int) *netlink.Rule {
	r := netlink.NewRule()
	mask := uint32(ProxySteerMark)
	r.Family = family
	r.Priority = ProxyRulePriority
	r.Mark = ProxySteerMark
	r.Mask = &mask
	r.Table = ProxyRouteTable
	return r
}

func isProxyRule(r netlink.Rule) bool {
	return r.Table == ProxyRouteTable && r.Mark == ProxySteerMark && r.Mask != nil && *r.Mask == ProxySteerMark
}

// proxyFamilies are the address families proxy routing covers in a namespace: IPv4, and
// IPv6 unless the namespace has it off (no ::1 on lo).
func proxyFamilies(h *netlink.Handle, lo int) []int {
	families := []int{unix.AF_INET}
	if l, err := h.LinkByIndex(lo); err == nil {
		if addrs, err := h.AddrList(l, unix.AF_INET6); err == nil && len(addrs) > 0 {
			families = append(families, unix.AF_INET6)
		}
	}
	return families
}

func proxyRoute(lo, family int) *netlink.Route {
	dst := &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	if family == unix.AF_INET6 {
		dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	return &netlink.Route{
		LinkIndex: lo,
		Dst:       dst,
		Table:     ProxyRouteTable,
		Type:      unix.RTN_LOCAL,
		Scope:     netlink.SCOPE_HOST,
	}
}

// PrepareProxyNamespace readies the node network namespace at netnsPath ("" = the
// caller's) for the L7 proxy without touching its routing: it brings lo up (the proxy
// listens on it), sets net.ipv4.tcp_max_tw_buckets to 0 (see disableTimeWait) and moves
// the ephemeral ports out of the endpoints' range (see ProxyPortRange). Idempotent.
func PrepareProxyNamespace(netnsPath string) error {
	if err := disableTimeWait(netnsPath); err != nil {
		return fmt.Errorf("preparing the proxy's namespace: %w", err)
	}
	if err := separateProxyPorts(netnsPath); err != nil {
		return fmt.Errorf("preparing the proxy's namespace: %w", err)
	}
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return fmt.Errorf("preparing the proxy's namespace: %w", err)
	}
	defer h.Close()
	if _, err := loUp(h); err != nil {
		return fmt.Errorf("preparing the proxy's namespace: %w", err)
	}
	return nil
}

// loUp brings lo up and returns its ifindex.
func loUp(h *netlink.Handle) (int, error) {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return 0, fmt.Errorf("finding lo: %w", err)
	}
	if lo.Attrs().Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(lo); err != nil {
			return 0, fmt.Errorf("bringing lo up: %w", err)
		}
	}
	return lo.Attrs().Index, nil
}

// SetupProxy prepares the node namespace at netnsPath for the proxy
// (PrepareProxyNamespace) and tells the programs where its transparent listeners are
// (SetProxy): listen for IPv4 connections, listen6 for IPv6 ones (invalid: none, and IPv6
// connections that need the proxy drop). Idempotent.
func (d *Proxy) SetupProxy(netnsPath string, listen, listen6 netip.AddrPort) error {
	if err := PrepareProxyNamespace(netnsPath); err != nil {
		return err
	}
	if err := d.SetProxy(listen); err != nil {
		return err
	}
	if listen6.IsValid() {
		return d.SetProxy(listen6)
	}
	var zero uint32
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.objs.Proxy6.Update(&zero, &rampartProxyConfig{}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("clearing the IPv6 proxy address: %w", err)
	}
	return nil
}

// RouteToProxy is SetupProxyRouting: the node namespace at netnsPath delivers locally the
// packets the programs hand to the proxy.
func (d *Proxy) RouteToProxy(netnsPath string) error { return SetupProxyRouting(netnsPath) }

// SetupProxyRouting prepares the node network namespace at netnsPath ("" = the caller's)
// for L7 steering: PrepareProxyNamespace, then `ip rule add fwmark 0x1/0x1 lookup 101 pref
// 100` and `ip route add local 0.0.0.0/0 dev lo table 101`, and the same for IPv6 (`ip -6`,
// `local ::/0`) when the namespace has IPv6, so packets the dataplane
// assigned to a proxy socket are delivered locally (without it the socket assignment is
// ignored and the packet forwarded to its original destination, whose veth then drops it
// as a proxy bypass). The agent calls it only once L7 rules are in force: any policy rule
// makes the kernel evaluate the rule list for every packet it forwards in that namespace
// (and keeps doing so after the rule is gone), which costs every endpoint's traffic about
// a percent of a CPU at 10 Gbit/s. Idempotent.
func SetupProxyRouting(netnsPath string) error {
	if err := PrepareProxyNamespace(netnsPath); err != nil {
		return fmt.Errorf("setting up proxy routing: %w", err)
	}
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return fmt.Errorf("setting up proxy routing: %w", err)
	}
	defer h.Close()
	lo, err := loUp(h)
	if err != nil {
		return fmt.Errorf("setting up proxy routing: %w", err)
	}
	for _, family := range proxyFamilies(h, lo) {
		if err := routeToProxy(h, lo, family); err != nil {
			return fmt.Errorf("setting up proxy routing: %w", err)
		}
	}
	return nil
}

// routeToProxy adds the local route and the fwmark rule of one address family.
func routeToProxy(h *netlink.Handle, lo, family int) error {
	// The route before the rule, so that a marked packet never meets the rule without it.
	if err := h.RouteReplace(proxyRoute(lo, family)); err != nil {
		return fmt.Errorf("local route in table %d: %w", ProxyRouteTable, err)
	}
	rules, err := h.RuleList(family)
	if err != nil {
		return fmt.Errorf("listing rules: %w", err)
	}
	for _, r := range rules {
		if isProxyRule(r) {
			return nil
		}
	}
	if err := h.RuleAdd(proxyRule(family)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("fwmark rule: %w", err)
	}
	return nil
}

// ProxyRouting reports whether the network namespace at netnsPath ("" = the caller's)
// already has the fwmark rule SetupProxyRouting adds (an agent records whether it added
// the rule, so that uninstall removes only its own).
func ProxyRouting(netnsPath string) (bool, error) {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return false, fmt.Errorf("reading proxy routing: %w", err)
	}
	defer h.Close()
	rules, err := h.RuleList(unix.AF_INET)
	if err != nil {
		return false, fmt.Errorf("reading proxy routing: listing rules: %w", err)
	}
	for _, r := range rules {
		if isProxyRule(r) {
			return true, nil
		}
	}
	return false, nil
}

// Sysctl is a kernel setting: its key under /proc/sys (net/ipv4/ip_forward) and a value.
type Sysctl struct{ Key, Value string }

// ProxySysctls are the settings PrepareProxyNamespace makes in the node namespace (an
// agent records their previous values so that uninstall can restore them).
func ProxySysctls() []Sysctl {
	return []Sysctl{
		{Key: strings.TrimPrefix(tcpMaxTWBuckets, "/proc/sys/"), Value: "0"},
		{Key: strings.TrimPrefix(ipLocalPortRange, "/proc/sys/"), Value: ProxyPortRange},
	}
}

// TeardownProxyRouting removes what SetupProxyRouting added to the network namespace at
// netnsPath ("" = the caller's). Missing pieces are not an error.
func TeardownProxyRouting(netnsPath string) error {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return fmt.Errorf("removing proxy routing: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("removing proxy routing: finding lo: %w", err)
	}
	for _, family := range proxyFamilies(h, lo.Attrs().Index) {
		rules, err := h.RuleList(family)
		if err != nil {
			return fmt.Errorf("removing proxy routing: listing rules: %w", err)
		}
		for _, r := range rules {
			if !isProxyRule(r) {
				continue
			}
			if err := h.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("removing proxy routing: fwmark rule: %w", err)
			}
		}
		if err := h.RouteDel(proxyRoute(lo.Attrs().Index, family)); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("removing proxy routing: local route in table %d: %w", ProxyRouteTable, err)
		}
	}
	return nil
}

// tcpMaxTWBuckets is the per-network-namespace sysctl limiting TIME_WAIT sockets.
const tcpMaxTWBuckets = "/proc/sys/net/ipv4/tcp_max_tw_buckets"

// disableTimeWait sets net.ipv4.tcp_max_tw_buckets=0 in the network namespace at netnsPath
// ("" = the caller's): its TCP sockets then close at once instead of lingering in
// TIME_WAIT. Why: the proxy often closes a client's connection first, which leaves a
// TIME_WAIT socket for the client's tuple in this namespace. A new connection from the same
// client port (which the client's kernel may pick as soon as its side is closed) then
// cannot be steered: the dataplane assigns its SYN to the proxy listener with
// bpf_sk_assign, and the kernel silently drops it because the new request socket collides
// with the TIME_WAIT one (the path that replaces a TIME_WAIT socket on a new SYN runs only
// for packets that were not assigned), for the whole TIME_WAIT period. The dataplane
// refuses such a SYN with a proxy-unavailable drop event should a TIME_WAIT socket exist
// anyway (bpf/include/proxy.h). The cost: this namespace loses TIME_WAIT's protection
// against late duplicate segments of an old connection being taken into a new one on the
// same tuple (rare: sequence numbers and timestamps must line up).
func disableTimeWait(netnsPath string) error {
	return writeNetnsSysctl(netnsPath, tcpMaxTWBuckets, "0")
}

// ipLocalPortRange is the per-network-namespace sysctl of ephemeral ports.
const ipLocalPortRange = "/proc/sys/net/ipv4/ip_local_port_range"

// ProxyPortRange is the node namespace's ephemeral port range. The proxy's upstream
// connections keep the client's address (original_src) and take their ports from this
// namespace's range; endpoints pick theirs from the kernel's default range (32768-60999),
// which must not overlap: otherwise a client's new connection can land on the tuple of
// one of the proxy's pooled upstream connections from the same address, and its packets are
// handed to that socket (or, after the L7 rule is gone, taken by the server as part of that
// connection), so the client never connects.
const ProxyPortRange = "61000 65535"

// separateProxyPorts moves the node namespace's ephemeral ports out of the endpoints'
// range (see ProxyPortRange).
func separateProxyPorts(netnsPath string) error {
	return writeNetnsSysctl(netnsPath, ipLocalPortRange, ProxyPortRange)
}

// writeNetnsSysctl writes value to the /proc/sys file at path as seen from the network
// namespace at netnsPath ("" = the caller's).
func writeNetnsSysctl(netnsPath, path, value string) error {
	write := func() error {
		if err := os.WriteFile(path, []byte(value+"\n"), 0o644); err != nil {
			return fmt.Errorf("setting %s=%s: %w", path, value, err)
		}
		return nil
	}
	// /proc/sys/net shows the network namespace of the calling thread.
	return netns.Do(netnsPath, write)
}
