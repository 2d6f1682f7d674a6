package l7plan

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/policy"
)

// Compiled matchers decide every request as Authz.Allows (the semantics
// the Envoy configuration has) does, grant included.
func TestCompiledAuthzAgreesWithAllows(t *testing.T) {
	client := netip.MustParseAddr("198.18.0.10")
	other := netip.MustParseAddr("198.18.0.11")
	z := &Authz{EndpointID: 2, Direction: policy.Ingress, Port: 80, Grants: []Grant{
		{Name: "rule-1-0", RuleID: 1, Peers: AddrSet{{Prefix: netip.PrefixFrom(client, 32)}}, HTTP: []policy.HTTPRule{
			{Method: "GET", Path: "/v1"},
			{Method: "GET|HEAD", Path: "/alt"},
			{Method: "POST", Path: "/v1/[a-z]+", Host: "deathstar"},
			{Path: "/any-method"},
			{Method: "(?i)put", Path: "/ci"},
			{Method: "GET", Path: "/h", Headers: []policy.HeaderMatch{{Name: "X-Token"}, {Name: "X-Org", Value: "empire"}}},
			{Method: "GET", Path: "/v1.x"},
			{Method: "GET", Path: "/bad(["},
		}},
		{Name: "rule-2-0", RuleID: 2, Peers: AddrSet{{Prefix: netip.MustParsePrefix("198.18.0.0/24"), Except: []netip.Prefix{netip.PrefixFrom(client, 32)}}},
			HTTP: []policy.HTTPRule{{Method: "DELETE", Path: "/.*"}}},
		{Name: GrantL3L4, Peers: AddrSet{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}}},
	}}
	c := CompileAuthz(z)
	var reqs []Request
	for _, src := range []netip.Addr{client, other, netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("192.0.2.1")} {
		for _, m := range []string{"GET", "HEAD", "POST", "PUT", "put", "DELETE", "GETX", ""} {
			for _, p := range []string{"/v1", "/v1/", "/v1/abc", "/V1", "/alt", "/any-method", "/ci", "/h", "/v1x", "/v1.x", "/bad([", "/"} {
				for _, host := range []string{"deathstar", "Deathstar", "x"} {
					for _, hdr := range []map[string]string{nil, {"x-token": "1"}, {"x-token": "", "x-org": "empire"}, {"x-token": "1", "x-org": "rebels"}} {
						reqs = append(reqs, Request{Src: src, Dst: client, Port: 80, Method: m, Path: p, Host: host, Header: hdr})
					}
				}
			}
		}
	}
	allowed := 0
	for _, r := range reqs {
		want, wg := z.Allows(r)
		got, gg := c.Allows(&r)
		if got != want || gg != wg {
			t.Errorf("%+v: compiled %v %v, Allows %v %v", r, got, gg, want, wg)
		}
		if want {
			allowed++
		}
	}
	if allowed == 0 || allowed == len(reqs) {
		t.Fatalf("%d of %d requests allowed: the cases do not tell anything apart", allowed, len(reqs))
	}
	// Literals are compared, not matched with a regular expression.
	if m := compileStr("/v1"); m.re != nil || m.literal != "/v1" {
		t.Errorf("/v1 compiled to %+v, want a literal", m)
	}
	if m := compileStr("/v1.x"); m.re == nil {
		t.Errorf("/v1.x compiled to a literal: . matches any character")
	}
}
