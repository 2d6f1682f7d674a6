package policy

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

const ccgHeader = `apiVersion: cilium.io/v2alpha1
kind: CiliumCIDRGroup
metadata:
  name: threats
`

func TestCIDRGroupManifest(t *testing.T) {
	src := ccgHeader + `  labels: {team: sec}
spec:
  externalCIDRs:
  - 198.51.100.0/24
  - 203.0.113.7/32
  - 10.1.2.3/8
  - 2001:db8::/32
---
apiVersion: cilium.io/v2
kind: CiliumCIDRGroup
metadata: {name: empty}
spec:
  externalCIDRs: []
---
` + cnpHeader + `spec:
  endpointSelector: {}
  egressDeny:
  - toCIDRSet: [{cidrGroupRef: threats}]
`
	docs, err := Parse("g.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs.CIDRGroups) != 2 || len(docs.Policies) != 1 {
		t.Fatalf("got %d groups and %d policies, want 2 and 1", len(docs.CIDRGroups), len(docs.Policies))
	}
	g := docs.CIDRGroups[0]
	want := []netip.Prefix{
		netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.7/32"),
		netip.MustParsePrefix("10.0.0.0/8"), // host bits cleared
		netip.MustParsePrefix("2001:db8::/32"),
	}
	if g.Name != "threats" || g.Source != "g.yaml: document 1" || !reflect.DeepEqual(g.CIDRs, want) {
		t.Errorf("group = %+v, want threats with %v", g, want)
	}
	if g.Key() != "CiliumCIDRGroup//threats" {
		t.Errorf("key = %s", g.Key())
	}
	if e := docs.CIDRGroups[1]; e.Name != "empty" || len(e.CIDRs) != 0 {
		t.Errorf("empty group = %+v", e)
	}
	// Raw parses back to the same group.
	back, err := Parse("raw.json", g.Raw)
	if err != nil || len(back.CIDRGroups) != 1 || !reflect.DeepEqual(back.CIDRGroups[0].CIDRs, want) || back.CIDRGroups[0].Name != "threats" {
		t.Errorf("Raw %s parses back to %+v, %v", g.Raw, back, err)
	}

	// ParseDocuments takes policies only, and says so at the kind.
	_, err = ParseDocuments("g.yaml", []byte(src))
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Field != "kind" || pe.Line != 2 || !strings.Contains(pe.Reason, "not a policy") {
		t.Errorf("ParseDocuments with a CIDR group: %v", err)
	}
}

func TestCIDRGroupRefPeers(t *testing.T) {
	p := parseOne(t, cnpHeader+`spec:
  endpointSelector: {}
  ingress:
  - fromCIDRSet: [{cidrGroupRef: vpn}, {cidr: 10.0.0.0/8}]
  ingressDeny:
  - fromCIDRSet: [{cidrGroupRef: threats}]
  egress:
  - toCIDRSet: [{cidrGroupRef: partners}]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
  egressDeny:
  - toCIDRSet: [{cidrGroupRef: threats}]
`)
	wantRules(t, rules(p), block(
		"  rule 0 spec.ingress[0]: ingress allow default-deny",
		"    subject: io.kubernetes.pod.namespace=x",
		"    peers:",
		"      cidrGroupRef vpn",
		"      cidr 10.0.0.0/8",
		"    ports: all",
		"  rule 1 spec.ingressDeny[0]: ingress deny default-deny",
		"    subject: io.kubernetes.pod.namespace=x",
		"    peers:",
		"      cidrGroupRef threats",
		"    ports: all",
		"  rule 2 spec.egress[0]: egress allow default-deny",
		"    subject: io.kubernetes.pod.namespace=x",
		"    peers:",
		"      cidrGroupRef partners",
		"    ports: TCP/443",
		"  rule 3 spec.egressDeny[0]: egress deny default-deny",
		"    subject: io.kubernetes.pod.namespace=x",
		"    peers:",
		"      cidrGroupRef threats",
		"    ports: all",
	))
	if got := p.Rules[3].Peers[0]; got.Kind != PeerCIDRGroup || got.Group != "threats" {
		t.Errorf("egressDeny peer = %+v", got)
	}
	checkRawRoundTrip(t, p)
}

func TestCIDRGroupErrors(t *testing.T) {
	cases := []struct {
		name, src, field string
		line             int
		reason           string
	}{
		{"wrong apiVersion", strings.Replace(ccgHeader, "v2alpha1", "v1", 1) + "spec: {externalCIDRs: []}\n", "apiVersion", 1, `want cilium.io/v2alpha1 or cilium.io/v2`},
		{"namespace", ccgHeader + "  namespace: x\nspec: {externalCIDRs: []}\n", "metadata.namespace", 5, "cluster-scoped"},
		{"no spec", ccgHeader, "spec", 1, ReasonRequired},
		{"no externalCIDRs", ccgHeader + "spec: {}\n", "spec.externalCIDRs", 5, ReasonRequired},
		{"null externalCIDRs", ccgHeader + "spec:\n  externalCIDRs:\n", "spec.externalCIDRs", 6, "must be a list"},
		{"bare address", ccgHeader + "spec:\n  externalCIDRs: [198.51.100.1]\n", "spec.externalCIDRs[0]", 6, "invalid CIDR"},
		{"bad prefix", ccgHeader + "spec:\n  externalCIDRs: [10.0.0.0/8, 10.0.0.0/33]\n", "spec.externalCIDRs[1]", 6, "invalid CIDR"},
		{"spec typo", ccgHeader + "spec:\n  externalCIDR: []\n", "spec.externalCIDR", 6, ReasonUnknownField},
		{"status", ccgHeader + "spec: {externalCIDRs: []}\nstatus: {}\n", "status", 6, ReasonUnknownField},
		{"bad name", strings.Replace(ccgHeader, "threats", "Threats", 1) + "spec: {externalCIDRs: []}\n", "metadata.name", 4, "invalid name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("g.yaml", []byte(c.src))
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("got %v, want a *ParseError", err)
			}
			wantErr(t, pe, c.field, c.line, c.reason)
			if pe.Kind != KindCiliumCIDRGroup || pe.Document != 1 {
				t.Errorf("error context = %+v", pe)
			}
		})
	}
}
