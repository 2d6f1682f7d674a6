package proxy

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"

	accesslog "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacconfig "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	grpcals "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	origdst "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	origsrc "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_src/v3"
	proxyproto "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/proxy_protocol/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rbacnet "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/policy"
)

// Names shared by the bootstrap, the xDS resources and the access log reader.
const (
	ListenerName       = "rampart_l7"
	ClusterOriginalDst = "rampart_original_dst"
	// ClusterControl reaches the agent's gRPC server (xDS and access logs) over its Unix
	// socket.
	ClusterControl = "rampart_control"
	// FilterEgress and FilterIngress name the two RBAC HTTP filters; per-route
	// configuration under these names carries the rules.
	FilterEgress  = "rampart.rbac.egress"
	FilterIngress = "rampart.rbac.ingress"
	// Shadow rule prefixes, so the access log can tell which grant of which filter matched
	// (RBAC dynamic metadata key prefix).
	shadowPrefixEgress  = "egress_"
	shadowPrefixIngress = "ingress_"
	accessLogName       = "rampart"
)

// Options are the parts of the Envoy configuration that do not come from policy.
type Options struct {
	Listen netip.AddrPort // the transparent listener (default 127.0.0.1:15001)
	// UpstreamMark is the socket mark of the proxy's upstream connections (original_src),
	// by which the dataplane recognises them. Default 0x2; it must differ from the steering
	// mark 0x1.
	UpstreamMark uint32
	// AccessLog sends every request's log entry to ClusterControl (gRPC access log
	// service).
	AccessLog bool
	// AccessLogFlush is how often Envoy sends buffered access log entries (default 100ms).
	AccessLogFlush time.Duration
	// FastPath: the agent serves Listen itself and checks plain HTTP/1.1 there
	// (fastpath.go); Envoy listens on EnvoyListen for the connections the fast path hands
	// over, each with a PROXY protocol header naming the client and the original
	// destination.
	FastPath bool
	// EnvoyListen is Envoy's listener with FastPath (default: Listen's port + 1).
	EnvoyListen netip.AddrPort
	// Listen6 (invalid: none) is the transparent listener for IPv6 connections: the fast
	// path's, which hands Envoy what it does not check as it does for IPv4, or without
	// the fast path an additional address of Envoy's listener.
	Listen6 netip.AddrPort
}

// DefaultListen is the proxy listener's default address in the node namespace.
var DefaultListen = netip.MustParseAddrPort("127.0.0.1:15001")

// RequestHeadersTimeout bounds how long the proxy waits for a request's headers once their
// first byte arrived.
const RequestHeadersTimeout = 10 * time.Second

// DefaultUpstreamMark is the socket mark of the proxy's upstream connections.
const DefaultUpstreamMark = 0x2

func (o Options) withDefaults() Options {
	if !o.Listen.IsValid() {
		o.Listen = DefaultListen
	}
	if o.UpstreamMark == 0 {
		o.UpstreamMark = DefaultUpstreamMark
	}
	if o.AccessLogFlush <= 0 {
		o.AccessLogFlush = 100 * time.Millisecond
	}
	if o.FastPath && !o.EnvoyListen.IsValid() {
		o.EnvoyListen = netip.AddrPortFrom(o.Listen.Addr(), o.Listen.Port()+1)
	}
	return o
}

// Resources is the xDS configuration for a plan: at most one listener and one route
// configuration per filter chain.
type Resources struct {
	Listeners []*listener.Listener
	Routes    []*route.RouteConfiguration
}

// BuildResources turns a plan into Envoy resources. A plan without chains gives no
// listener at all: nothing is steered then, and anything that still is finds no socket and
// is dropped by the dataplane (fail closed).
//
// The listener is transparent, restores the original destination (original_dst) and makes
// upstream connections from the client's own address with UpstreamMark (original_src).
// Each chain runs the HTTP connection manager (HTTP/1.1 or h2c, detected) with one RBAC
// filter per side and the router to the ORIGINAL_DST cluster. The rules live in the route
// configuration (per-filter config on the route, over RDS) so that a policy change applies
// to the next request of connections already open, instead of draining them. The filters'
// own configuration denies everything: a request for which no route applies is refused.
// Connections that match no chain are closed by the default chain.
func BuildResources(plan l7plan.Plan, opts Options) (Resources, error) {
	opts = opts.withDefaults()
	var res Resources
	if len(plan.Chains) == 0 {
		return res, nil
	}
	listen := opts.Listen
	// The addresses of the client and of the destination it dialled: from the
	// connection itself (steered to a transparent listener), or from the PROXY protocol
	// header of a connection the fast path hands over.
	restore := &listener.ListenerFilter{Name: "envoy.filters.listener.original_dst", ConfigType: typed(&origdst.OriginalDst{})}
	if opts.FastPath {
		listen = opts.EnvoyListen
		restore = &listener.ListenerFilter{Name: "envoy.filters.listener.proxy_protocol", ConfigType: typed(&proxyproto.ProxyProtocol{})}
	}
	l := &listener.Listener{
		Name: ListenerName,
		Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
			Address:       listen.Addr().String(),
			PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(listen.Port())},
		}}},
		Transparent:         wrapperspb.Bool(!opts.FastPath),
		AdditionalAddresses: additionalListen6(opts),
		ListenerFilters: []*listener.ListenerFilter{
			restore,
			{Name: "envoy.filters.listener.original_src", ConfigType: typed(&origsrc.OriginalSrc{Mark: opts.UpstreamMark})},
		},
		DefaultFilterChain: &listener.FilterChain{
			Name: "default-deny",
			Filters: []*listener.Filter{{
				Name: "envoy.filters.network.rbac",
				// ALLOW with no policy denies every connection: it is closed at once.
				ConfigType: typedFilter(&rbacnet.RBAC{
					StatPrefix: "rampart_default_deny",
					Rules:      &rbacconfig.RBAC{Action: rbacconfig.RBAC_ALLOW},
				}),
			}, {
				// A chain must end in a terminal filter. This one is never reached (the RBAC
				// filter closes every connection) and leads nowhere: the cluster does not
				// exist.
				Name: "envoy.filters.network.tcp_proxy",
				ConfigType: typedFilter(&tcpproxy.TcpProxy{
					StatPrefix:       "rampart_default_deny",
					ClusterSpecifier: &tcpproxy.TcpProxy_Cluster{Cluster: "rampart_nowhere"},
				}),
			}},
		},
	}
	for _, c := range plan.Chains {
		fc, err := filterChain(c, opts)
		if err != nil {
			return Resources{}, err
		}
		l.FilterChains = append(l.FilterChains, fc)
		rc, err := routeConfig(c)
		if err != nil {
			return Resources{}, err
		}
		res.Routes = append(res.Routes, rc)
	}
	res.Listeners = []*listener.Listener{l}
	for _, r := range res.Routes {
		if err := r.ValidateAll(); err != nil {
			return Resources{}, fmt.Errorf("route configuration %s: %w", r.Name, err)
		}
	}
	if err := l.ValidateAll(); err != nil {
		return Resources{}, fmt.Errorf("listener: %w", err)
	}
	return res, nil
}

func filterChain(c l7plan.Chain, opts Options) (*listener.FilterChain, error) {
	m := &listener.FilterChainMatch{DestinationPort: wrapperspb.UInt32(uint32(c.Port))}
	if c.Dst.IsValid() {
		m.PrefixRanges = []*core.CidrRange{cidr(netip.PrefixFrom(c.Dst, c.Dst.BitLen()))}
	}
	if c.Src.IsValid() {
		m.SourcePrefixRanges = []*core.CidrRange{cidr(netip.PrefixFrom(c.Src, c.Src.BitLen()))}
	}
	denyAll := &rbachttp.RBAC{Rules: &rbacconfig.RBAC{Action: rbacconfig.RBAC_ALLOW}}
	var filters []*hcm.HttpFilter
	if c.Egress != nil {
		filters = append(filters, &hcm.HttpFilter{Name: FilterEgress, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(denyAll)}})
	}
	if c.Ingress != nil {
		filters = append(filters, &hcm.HttpFilter{Name: FilterIngress, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(denyAll)}})
	}
	if len(filters) == 0 {
		return nil, fmt.Errorf("chain %s: no authorisation", c.Name)
	}
	filters = append(filters, &hcm.HttpFilter{
		Name: "envoy.filters.http.router",
		// suppress_envoy_headers: the server should see the client's request, not proxy
		// bookkeeping headers.
		ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{SuppressEnvoyHeaders: true})},
	})
	mgr := &hcm.HttpConnectionManager{
		StatPrefix: "rampart",
		CodecType:  hcm.HttpConnectionManager_AUTO, // HTTP/1.1, or HTTP/2 with prior knowledge (h2c gRPC)
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			RouteConfigName: c.Name,
			ConfigSource: &core.ConfigSource{
				ResourceApiVersion:    core.ApiVersion_V3,
				ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
			},
		}},
		HttpFilters: filters,
		// Paths are normalised before the rules see them and the server gets the
		// normalised path (RFC 3986 dot segments and percent-decoding of unreserved
		// characters; repeated slashes merged), and escaped slashes are refused: the rules
		// then judge exactly the path the server acts on, so /v1/../admin cannot pass a
		// rule for /v1/.* and reach /admin.
		NormalizePath:                wrapperspb.Bool(true),
		MergeSlashes:                 true,
		PathWithEscapedSlashesAction: hcm.HttpConnectionManager_REJECT_REQUEST,
		// A request whose headers are not complete this long after its first byte gets
		// 408 and its connection is closed. Without it, bytes that are not HTTP and hold
		// no line end (a binary protocol's hello) keep the connection open until the idle
		// timeout (1 h), instead of closing it.
		RequestHeadersTimeout: durationpb.New(RequestHeadersTimeout),
		// The downstream address is the connection's own; X-Forwarded-For from clients is
		// not trusted, and requests are external (x-envoy-* request headers ignored).
		UseRemoteAddress:  wrapperspb.Bool(true),
		GenerateRequestId: wrapperspb.Bool(false),
		InternalAddressConfig: &hcm.HttpConnectionManager_InternalAddressConfig{
			UnixSockets: false,
		},
	}
	if opts.AccessLog {
		mgr.AccessLog = []*accesslog.AccessLog{{
			Name: "envoy.access_loggers.http_grpc",
			ConfigType: &accesslog.AccessLog_TypedConfig{TypedConfig: mustAny(&grpcals.HttpGrpcAccessLogConfig{
				CommonConfig: &grpcals.CommonGrpcAccessLogConfig{
					LogName:             accessLogName,
					TransportApiVersion: core.ApiVersion_V3,
					GrpcService: &core.GrpcService{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{
						EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: ClusterControl},
					}},
					BufferFlushInterval: durationpb.New(opts.AccessLogFlush),
				},
			})},
		}}
	}
	return &listener.FilterChain{
		Name:             c.Name,
		FilterChainMatch: m,
		Filters: []*listener.Filter{{
			Name:       "envoy.filters.network.http_connection_manager",
			ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(mgr)},
		}},
	}, nil
}

func routeConfig(c l7plan.Chain) (*route.RouteConfiguration, error) {
	perFilter := map[string]*anypb.Any{}
	if c.Egress != nil {
		perFilter[FilterEgress] = mustAny(&rbachttp.RBACPerRoute{Rbac: rbacFilter(c.Egress, shadowPrefixEgress)})
	}
	if c.Ingress != nil {
		perFilter[FilterIngress] = mustAny(&rbachttp.RBACPerRoute{Rbac: rbacFilter(c.Ingress, shadowPrefixIngress)})
	}
	return &route.RouteConfiguration{
		Name: c.Name,
		VirtualHosts: []*route.VirtualHost{{
			Name:    c.Name,
			Domains: []string{"*"},
			Routes: []*route.Route{{
				// The route's name is the chain's: the access log says which chain served
				// a request.
				Name:  c.Name,
				Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
				Action: &route.Route_Route{Route: &route.RouteAction{
					ClusterSpecifier: &route.RouteAction_Cluster{Cluster: ClusterOriginalDst},
					// No overall deadline: gRPC streams and long downloads are the server's
					// business; idle timeouts still apply.
					Timeout: durationpb.New(0),
				}},
				TypedPerFilterConfig: perFilter,
			}},
		}},
	}, nil
}

// rbacFilter is the RBAC filter configuration for one authorisation: an ALLOW policy per
// grant. The same policies are also shadow rules, whose dynamic metadata names the grant
// that matched (the enforcing engine does not report it) for the access log.
func rbacFilter(z *l7plan.Authz, shadowPrefix string) *rbachttp.RBAC {
	rules := &rbacconfig.RBAC{Action: rbacconfig.RBAC_ALLOW, Policies: map[string]*rbacconfig.Policy{}}
	for _, g := range z.Grants {
		rules.Policies[g.Name] = grantPolicy(z.Direction, g)
	}
	return &rbachttp.RBAC{
		Rules:                 rules,
		ShadowRules:           rules,
		ShadowRulesStatPrefix: shadowPrefix,
	}
}

func grantPolicy(dir policy.Direction, g l7plan.Grant) *rbacconfig.Policy {
	perm := httpPermission(g.HTTP)
	if dir == policy.Ingress {
		// The peer is the client: the connection's remote address (use_remote_address
		// with no trusted hops: never one taken from X-Forwarded-For), which is the
		// PROXY protocol header's source for a connection the fast path handed over.
		return &rbacconfig.Policy{
			Principals:  []*rbacconfig.Principal{addrPrincipal(g.Peers)},
			Permissions: []*rbacconfig.Permission{perm},
		}
	}
	// Egress: the peer is the destination, the original destination address that
	// original_dst restored.
	return &rbacconfig.Policy{
		Principals:  []*rbacconfig.Principal{{Identifier: &rbacconfig.Principal_Any{Any: true}}},
		Permissions: []*rbacconfig.Permission{andPerm(addrPermission(g.Peers), perm)},
	}
}

func addrPrincipal(s l7plan.AddrSet) *rbacconfig.Principal {
	return addrMatcher(s, func(p netip.Prefix) *rbacconfig.Principal {
		return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_RemoteIp{RemoteIp: cidr(p)}}
	}, func(id, except *rbacconfig.Principal) *rbacconfig.Principal {
		return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_AndIds{AndIds: &rbacconfig.Principal_Set{Ids: []*rbacconfig.Principal{
			id,
			{Identifier: &rbacconfig.Principal_NotId{NotId: except}},
		}}}}
	}, orPrincipal)
}

// addrMatcher is the RBAC matcher (a principal or a permission) of the addresses of s:
// ip matches one prefix, andNot one matcher but not another, and or any of several.
func addrMatcher[M any](s l7plan.AddrSet, ip func(netip.Prefix) M, andNot func(M, M) M, or func([]M) M) M {
	var ms []M
	for _, r := range s {
		m := ip(r.Prefix)
		if len(r.Except) > 0 {
			var ex []M
			for _, e := range r.Except {
				ex = append(ex, ip(e))
			}
			m = andNot(m, or(ex))
		}
		ms = append(ms, m)
	}
	return or(ms)
}

func orPrincipal(ids []*rbacconfig.Principal) *rbacconfig.Principal {
	if len(ids) == 1 {
		return ids[0]
	}
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_OrIds{OrIds: &rbacconfig.Principal_Set{Ids: ids}}}
}

func addrPermission(s l7plan.AddrSet) *rbacconfig.Permission {
	return addrMatcher(s, func(p netip.Prefix) *rbacconfig.Permission {
		return &rbacconfig.Permission{Rule: &rbacconfig.Permission_DestinationIp{DestinationIp: cidr(p)}}
	}, func(perm, except *rbacconfig.Permission) *rbacconfig.Permission {
		return andPerm(perm, &rbacconfig.Permission{Rule: &rbacconfig.Permission_NotRule{NotRule: except}})
	}, orPerm)
}

func andPerm(ps ...*rbacconfig.Permission) *rbacconfig.Permission {
	if len(ps) == 1 {
		return ps[0]
	}
	return &rbacconfig.Permission{Rule: &rbacconfig.Permission_AndRules{AndRules: &rbacconfig.Permission_Set{Rules: ps}}}
}

func orPerm(ps []*rbacconfig.Permission) *rbacconfig.Permission {
	if len(ps) == 1 {
		return ps[0]
	}
	return &rbacconfig.Permission{Rule: &rbacconfig.Permission_OrRules{OrRules: &rbacconfig.Permission_Set{Rules: ps}}}
}

var anyPerm = &rbacconfig.Permission{Rule: &rbacconfig.Permission_Any{Any: true}}

// httpPermission matches requests matching one of rules (nil: every request).
func httpPermission(rules []policy.HTTPRule) *rbacconfig.Permission {
	if rules == nil {
		return anyPerm
	}
	var or []*rbacconfig.Permission
	for _, h := range rules {
		or = append(or, httpRulePermission(h))
	}
	return orPerm(or)
}

func httpRulePermission(h policy.HTTPRule) *rbacconfig.Permission {
	var and []*rbacconfig.Permission
	if h.Method != "" {
		and = append(and, headerPerm(":method", regexHeader(h.Method)))
	}
	if h.Path != "" {
		// url_path is the path without the query string.
		and = append(and, &rbacconfig.Permission{Rule: &rbacconfig.Permission_UrlPath{UrlPath: &matcher.PathMatcher{
			Rule: &matcher.PathMatcher_Path{Path: regexString(h.Path)},
		}}})
	}
	if h.Host != "" {
		// HTTP/1.1 Host becomes :authority in Envoy.
		and = append(and, headerPerm(":authority", regexHeader(h.Host)))
	}
	for _, hm := range h.Headers {
		name := strings.ToLower(hm.Name)
		if hm.Value == "" {
			and = append(and, headerPerm(name, &route.HeaderMatcher_PresentMatch{PresentMatch: true}))
		} else {
			// Envoy matches a header sent several times if any one of its values matches,
			// and forwards all of them: "X-Mode: landing" plus "X-Mode: attack" would pass
			// a rule for "landing" and the server might act on "attack". So the value must
			// be present and no occurrence may have another value.
			and = append(and,
				headerPerm(name, &route.HeaderMatcher_StringMatch{StringMatch: &matcher.StringMatcher{
					MatchPattern: &matcher.StringMatcher_Exact{Exact: hm.Value},
				}}),
				&rbacconfig.Permission{Rule: &rbacconfig.Permission_NotRule{NotRule: headerPerm(name, regexHeader(otherThan(hm.Value)))}},
			)
		}
	}
	if len(and) == 0 {
		return anyPerm
	}
	return andPerm(and...)
}

func headerPerm(name string, spec any) *rbacconfig.Permission {
	hm := &route.HeaderMatcher{Name: name}
	switch s := spec.(type) {
	case *route.HeaderMatcher_StringMatch:
		hm.HeaderMatchSpecifier = s
	case *route.HeaderMatcher_PresentMatch:
		hm.HeaderMatchSpecifier = s
	}
	return &rbacconfig.Permission{Rule: &rbacconfig.Permission_Header{Header: hm}}
}

func regexHeader(re string) *route.HeaderMatcher_StringMatch {
	return &route.HeaderMatcher_StringMatch{StringMatch: regexString(re)}
}

// otherThan is an RE2 expression that matches every string except v (as a whole): a proper
// prefix of v, v followed by more, or a string that differs from v at some character. It
// is linear in the length of v: (?:|[^v0].*|v0(?:|[^v1].*|v1(?:...vn.+))).
func otherThan(v string) string {
	var b strings.Builder
	b.WriteString("(?s)")
	rs := []rune(v)
	for _, r := range rs {
		q := regexp.QuoteMeta(string(r))
		b.WriteString("(?:|[^" + q + "].*|" + q)
	}
	b.WriteString(".+")
	b.WriteString(strings.Repeat(")", len(rs)))
	return b.String()
}

// regexString is a full-match RE2 matcher (Envoy's safe_regex matches the whole value).
func regexString(re string) *matcher.StringMatcher {
	return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_SafeRegex{SafeRegex: &matcher.RegexMatcher{Regex: re}}}
}

func cidr(p netip.Prefix) *core.CidrRange {
	return &core.CidrRange{AddressPrefix: p.Addr().String(), PrefixLen: wrapperspb.UInt32(uint32(p.Bits()))}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("packing %T: %v", m, err)) // only fails for unregistered types
	}
	return a
}

func typed(m proto.Message) *listener.ListenerFilter_TypedConfig {
	return &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(m)}
}

func typedFilter(m proto.Message) *listener.Filter_TypedConfig {
	return &listener.Filter_TypedConfig{TypedConfig: mustAny(m)}
}

// additionalListen6 is Envoy's IPv6 listener address when Envoy serves the steered
// connections itself (no fast path), transparent as its IPv4 one.
func additionalListen6(opts Options) []*listener.AdditionalAddress {
	if opts.FastPath || !opts.Listen6.IsValid() {
		return nil
	}
	return []*listener.AdditionalAddress{{Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Address:       opts.Listen6.Addr().String(),
		PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(opts.Listen6.Port())},
	}}}}}
}
