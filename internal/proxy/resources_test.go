package proxy

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	origsrc "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_src/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/l7plan/l7plantest"
	"github.com/rampartnet/rampart/internal/policy"
)

func testPlan() l7plan.Plan {
	in := &l7plan.Authz{EndpointID: 3, Direction: policy.Ingress, Port: 80, Grants: []l7plan.Grant{{
		Name: "rule-4-0", RuleID: 4,
		Peers: l7plan.AddrSet{{Prefix: netip.MustParsePrefix("198.18.0.10/32")}},
		HTTP:  []policy.HTTPRule{{Method: "GET", Path: "/v1", Host: "deathstar", Headers: []policy.HeaderMatch{{Name: "X-Token"}, {Name: "X-Org", Value: "empire"}}}},
	}}}
	out := &l7plan.Authz{EndpointID: 1, Direction: policy.Egress, Port: 80, Grants: []l7plan.Grant{{
		Name:  l7plan.GrantL3L4,
		Peers: l7plan.AddrSet{{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Except: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16")}}},
	}}}
	return l7plan.Plan{Chains: []l7plan.Chain{
		{Name: "in:198.18.0.20:80", Port: 80, Dst: netip.MustParseAddr("198.18.0.20"), Ingress: in},
		{Name: "out:198.18.0.10:80", Port: 80, Src: netip.MustParseAddr("198.18.0.10"), Egress: out},
	}}
}

func TestBuildResources(t *testing.T) {
	res, err := BuildResources(testPlan(), Options{AccessLog: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Listeners) != 1 || len(res.Routes) != 2 {
		t.Fatalf("%d listeners, %d routes", len(res.Listeners), len(res.Routes))
	}
	l := res.Listeners[0]
	if l.GetAddress().GetSocketAddress().GetAddress() != "127.0.0.1" || l.GetAddress().GetSocketAddress().GetPortValue() != 15001 || !l.GetTransparent().GetValue() {
		t.Fatalf("listener address: %v transparent %v", l.GetAddress(), l.GetTransparent())
	}
	var src origsrc.OriginalSrc
	if err := l.GetListenerFilters()[1].GetTypedConfig().UnmarshalTo(&src); err != nil || src.GetMark() != DefaultUpstreamMark {
		t.Fatalf("original_src: %v %v", &src, err)
	}
	if l.GetDefaultFilterChain() == nil || len(l.GetFilterChains()) != 2 {
		t.Fatalf("chains: default %v, %d", l.GetDefaultFilterChain(), len(l.GetFilterChains()))
	}
	in := l.GetFilterChains()[0]
	m := in.GetFilterChainMatch()
	if m.GetDestinationPort().GetValue() != 80 || len(m.GetPrefixRanges()) != 1 || m.GetPrefixRanges()[0].GetAddressPrefix() != "198.18.0.20" ||
		m.GetPrefixRanges()[0].GetPrefixLen().GetValue() != 32 || len(m.GetSourcePrefixRanges()) != 0 {
		t.Fatalf("ingress chain match: %v", m)
	}
	var mgr hcm.HttpConnectionManager
	if err := in.GetFilters()[0].GetTypedConfig().UnmarshalTo(&mgr); err != nil {
		t.Fatal(err)
	}
	if mgr.GetCodecType() != hcm.HttpConnectionManager_AUTO || !mgr.GetNormalizePath().GetValue() || !mgr.GetMergeSlashes() ||
		mgr.GetRds().GetRouteConfigName() != "in:198.18.0.20:80" || len(mgr.GetAccessLog()) != 1 {
		t.Fatalf("connection manager: %v", &mgr)
	}
	if names := []string{mgr.GetHttpFilters()[0].GetName(), mgr.GetHttpFilters()[1].GetName()}; names[0] != FilterIngress || names[1] != "envoy.filters.http.router" {
		t.Fatalf("http filters: %v", names)
	}
	// The filter's own configuration denies everything (ALLOW, no policy).
	var base rbachttp.RBAC
	if err := mgr.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&base); err != nil || base.GetRules() == nil || len(base.GetRules().GetPolicies()) != 0 {
		t.Fatalf("base RBAC must deny all: %v %v", &base, err)
	}
	out := l.GetFilterChains()[1].GetFilterChainMatch()
	if len(out.GetPrefixRanges()) != 0 || out.GetSourcePrefixRanges()[0].GetAddressPrefix() != "198.18.0.10" {
		t.Fatalf("egress chain match: %v", out)
	}

	// The rules are in the route, per filter.
	rc := res.Routes[0]
	var per rbachttp.RBACPerRoute
	if err := rc.GetVirtualHosts()[0].GetRoutes()[0].GetTypedPerFilterConfig()[FilterIngress].UnmarshalTo(&per); err != nil {
		t.Fatal(err)
	}
	js := compactJSON(t, &per)
	for _, want := range []string{
		`"rule-4-0"`, `"remoteIp":{"addressPrefix":"198.18.0.10","prefixLen":32}`,
		`"name":":method","stringMatch":{"safeRegex":{"regex":"GET"}}`,
		`"urlPath":{"path":{"safeRegex":{"regex":"/v1"}}}`,
		`"name":":authority","stringMatch":{"safeRegex":{"regex":"deathstar"}}`,
		`"name":"x-token","presentMatch":true`, `"name":"x-org","stringMatch":{"exact":"empire"}`,
		`"shadowRulesStatPrefix":"ingress_"`,
	} {
		if !strings.Contains(js, want) {
			t.Errorf("ingress RBAC lacks %s:\n%s", want, js)
		}
	}
	per.Reset()
	if err := res.Routes[1].GetVirtualHosts()[0].GetRoutes()[0].GetTypedPerFilterConfig()[FilterEgress].UnmarshalTo(&per); err != nil {
		t.Fatal(err)
	}
	js = compactJSON(t, &per)
	for _, want := range []string{
		`"l3l4"`, `"any":true`, `"destinationIp":{"addressPrefix":"0.0.0.0","prefixLen":0}`,
		`"notRule":{"destinationIp":{"addressPrefix":"198.18.0.0","prefixLen":16}}`,
	} {
		if !strings.Contains(js, want) {
			t.Errorf("egress RBAC lacks %s:\n%s", want, js)
		}
	}
}

// compactJSON renders m without the whitespace protojson adds at random.
func compactJSON(t *testing.T, m proto.Message) string {
	t.Helper()
	b, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

func TestBuildResourcesEmpty(t *testing.T) {
	res, err := BuildResources(l7plan.Plan{}, Options{})
	if err != nil || len(res.Listeners) != 0 || len(res.Routes) != 0 {
		t.Fatalf("empty plan: %+v %v", res, err)
	}
}

// With the fast path, Envoy's listener is the next port, not transparent, and restores the
// addresses from the PROXY protocol header the fast path sends.
func TestBuildResourcesFastPath(t *testing.T) {
	res, err := BuildResources(testPlan(), Options{FastPath: true})
	if err != nil {
		t.Fatal(err)
	}
	l := res.Listeners[0]
	if a := l.GetAddress().GetSocketAddress(); a.GetAddress() != "127.0.0.1" || a.GetPortValue() != 15002 || l.GetTransparent().GetValue() {
		t.Fatalf("listener address: %v transparent %v", l.GetAddress(), l.GetTransparent())
	}
	f := l.GetListenerFilters()
	if len(f) != 2 || f[0].GetName() != "envoy.filters.listener.proxy_protocol" || f[1].GetName() != "envoy.filters.listener.original_src" {
		t.Fatalf("listener filters: %v", f)
	}
}

// Every plan translates to valid Envoy configuration: the plans of random rule sets (those
// l7plan's TestBuildPlanRandom checks against the dataplane's decisions).
func TestBuildResourcesRandomPlans(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	chains := 0
	for iter := range 300 {
		st := l7plantest.NewWorld().Compute(t, l7plantest.RandomRules(t, rng)...)
		plan := l7plan.BuildPlan(st, nil)
		res, err := BuildResources(plan, Options{AccessLog: true})
		if err != nil {
			t.Fatalf("iteration %d: %v", iter, err)
		}
		if len(res.Routes) != len(plan.Chains) {
			t.Fatalf("iteration %d: %d routes for %d chains", iter, len(res.Routes), len(plan.Chains))
		}
		chains += len(plan.Chains)
	}
	if chains < 100 {
		t.Fatalf("only %d chains translated", chains)
	}
}
