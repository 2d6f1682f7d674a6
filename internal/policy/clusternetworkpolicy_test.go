package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"text/template"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/testenv"
)

const clusterHeader = `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata:
  name: c
`

// cnpFull uses every supported field.
const cnpFull = `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata:
  name: cluster-guard
  labels: {team: platform}
spec:
  tier: Admin
  priority: 10
  subject:
    namespaces:
      matchLabels:
        env: prod
  ingress:
  - name: allow-monitoring
    action: Accept
    from:
    - namespaces:
        matchLabels:
          kubernetes.io/metadata.name: monitoring
    protocols:
    - tcp:
        destinationPort:
          number: 9100
    - destinationNamedPort: metrics
  - action: Deny
    from:
    - pods:
        namespaceSelector: {}
        podSelector:
          matchExpressions:
          - {key: app, operator: In, values: [scanner, crawler]}
  egress:
  - name: dns
    action: Accept
    to:
    - pods:
        namespaceSelector:
          matchLabels: {kubernetes.io/metadata.name: kube-system}
        podSelector:
          matchLabels: {k8s-app: kube-dns}
    protocols:
    - udp: {destinationPort: {number: 53}}
    - tcp: {destinationPort: {number: 53}}
  - name: allowed-sites
    action: Accept
    to:
    - domainNames: [kubernetes.io, "*.example.com", "Docs.Example.ORG."]
    - namespaces: {matchExpressions: [{key: egress, operator: DoesNotExist}]}
    protocols:
    - tcp: {destinationPort: {range: {start: 443, end: 444}}}
  - name: pass-internal
    action: Pass
    to:
    - networks: [10.0.0.0/8, "fd00::/8"]
    - nodes: {}
    protocols:
    - sctp: {}
    - udp: {destinationPort: {range: {start: 30000, end: 32767}}}
  - name: deny-rest
    action: Deny
    to:
    - networks: [0.0.0.0/0, "::/0"]
`

// cnpBaseline is a Baseline policy with a pods subject, written as kubectl shows a
// cluster-scoped object (empty namespace, a status).
const cnpBaseline = `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata:
  name: default
  namespace: ""
  uid: 0b6c5c1e-1f7e-4c69-9d1c-6d5e8f0a1b2c
  resourceVersion: "7"
  generation: 1
spec:
  priority: 1000
  tier: Baseline
  subject:
    pods:
      podSelector:
        matchLabels: {app: db}
  ingress:
  - name: "from (web) pods"
    action: Accept
    from:
    - pods:
        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: shop}}
        podSelector: {matchLabels: {app: web}}
    protocols:
    - tcp: {destinationPort: {number: 5432}}
  - name: deny-all
    action: Deny
    from:
    - namespaces: {}
status:
  conditions:
  - type: Ready
    status: "True"
    reason: Applied
    message: ""
    lastTransitionTime: "2026-12-01T00:00:00Z"
`

func TestClusterNetworkPolicyAccepted(t *testing.T) {
	cases := []struct {
		name, src string
		key       string
		want      string
	}{
		{"every field", cnpFull, "ClusterNetworkPolicy//cluster-guard", block(
			"  rule 0 spec.ingress[0] (allow-monitoring): ingress Admin/10 accept no-default-deny",
			"    subject: io.cilium.k8s.namespace.labels.env=prod,io.kubernetes.pod.namespace",
			"    peers:",
			"      endpoints io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=monitoring,io.kubernetes.pod.namespace",
			"    ports: TCP/9100, ANY/metrics",
			"  rule 1 spec.ingress[1]: ingress Admin/10 deny no-default-deny",
			"    subject: io.cilium.k8s.namespace.labels.env=prod,io.kubernetes.pod.namespace",
			"    peers:",
			"      endpoints app in (crawler,scanner),io.kubernetes.pod.namespace",
			"    ports: all",
			"  rule 0 spec.egress[0] (dns): egress Admin/10 accept no-default-deny",
			"    subject: io.cilium.k8s.namespace.labels.env=prod,io.kubernetes.pod.namespace",
			"    peers:",
			"      endpoints k8s-app=kube-dns,io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=kube-system,io.kubernetes.pod.namespace",
			"    ports: UDP/53, TCP/53",
			"  rule 1 spec.egress[1] (allowed-sites): egress Admin/10 accept no-default-deny",
			"    subject: io.cilium.k8s.namespace.labels.env=prod,io.kubernetes.pod.namespace",
			"    peers:",
			"      fqdn matchName:kubernetes.io",
			"      fqdn matchPattern:**.example.com",
			"      fqdn matchName:docs.example.org",
			"      endpoints !io.cilium.k8s.namespace.labels.egress,io.kubernetes.pod.namespace",
			"    ports: TCP/443-444",
			"  rule 2 spec.egress[2] (pass-internal): egress Admin/10 pass no-default-deny",
			"    subject: io.cilium.k8s.namespace.labels.env=prod,io.kubernetes.pod.namespace",
			"    peers:",
			"      cidr 10.0.0.0/8",
			"      cidr fd00::/8",
			"      entity host",
			"      entity remote-node",
			"    ports: SCTP/all, UDP/30000-32767",
			"  rule 3 spec.egress[3] (deny-rest): egress Admin/10 deny no-default-deny",
			"    subject: io.cilium.k8s.namespace.labels.env=prod,io.kubernetes.pod.namespace",
			"    peers:",
			"      cidr 0.0.0.0/0",
			"      cidr ::/0",
			"    ports: all",
		)},
		{"baseline, pods subject, status, empty namespace", cnpBaseline, "ClusterNetworkPolicy//default", block(
			`  rule 0 spec.ingress[0] ("from (web) pods"): ingress Baseline/1000 accept no-default-deny`,
			"    subject: app=db,io.kubernetes.pod.namespace",
			"    peers:",
			"      endpoints app=web,io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=shop,io.kubernetes.pod.namespace",
			"    ports: TCP/5432",
			"  rule 1 spec.ingress[1] (deny-all): ingress Baseline/1000 deny no-default-deny",
			"    subject: app=db,io.kubernetes.pod.namespace",
			"    peers:",
			"      endpoints io.kubernetes.pod.namespace",
			"    ports: all",
		)},
		{"no rules: affects no traffic", clusterHeader + "spec:\n  tier: Admin\n  priority: 0\n  subject: {namespaces: {}}\n  ingress: []\n  egress:\n",
			"ClusterNetworkPolicy//c", ""},
		{"null fields are absent", clusterHeader + `spec:
  tier: Baseline
  priority: 3
  subject: {namespaces: null, pods: {namespaceSelector: null, podSelector: {}}}
  egress:
  - action: Accept
    name: ""
    to:
    - {namespaces: null, networks: [192.0.2.0/24]}
    protocols: null
  - action: Deny
    to: [{pods: {podSelector: {}}}]
    protocols:
    - {tcp: {destinationPort: null}, udp: null}
    - {tcp: null, udp: {destinationPort: {number: null, range: {start: 1, end: 2}}}}
`, "ClusterNetworkPolicy//c", block(
			"  rule 0 spec.egress[0]: egress Baseline/3 accept no-default-deny",
			"    subject: io.kubernetes.pod.namespace",
			"    peers:",
			"      cidr 192.0.2.0/24",
			"    ports: all",
			"  rule 1 spec.egress[1]: egress Baseline/3 deny no-default-deny",
			"    subject: io.kubernetes.pod.namespace",
			"    peers:",
			"      endpoints io.kubernetes.pod.namespace",
			"    ports: TCP/all, UDP/1-2",
		)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := parseOne(t, c.src)
			if p.Kind != KindClusterNetworkPolicy || p.Namespace != "" || p.Key() != c.key {
				t.Errorf("policy identity = %s", p.Key())
			}
			wantRules(t, rules(p), c.want)
			checkRawRoundTrip(t, p)
			checkUpstream(t, p)
		})
	}

	// The fields that the rendering shows in words, one by one.
	p := parseOne(t, cnpFull)
	type fields struct {
		dir                Direction
		index              int
		deny, pass         bool
		tier               Tier
		prio               int32
		defaultDeny, allPs bool
	}
	var got []fields
	for _, r := range p.Rules {
		got = append(got, fields{r.Direction, r.Index, r.Deny, r.Pass, r.Tier, r.Priority, r.EnableDefaultDeny, r.AllPeers})
	}
	want := []fields{
		{Ingress, 0, false, false, TierAdmin, 10, false, false},
		{Ingress, 1, true, false, TierAdmin, 10, false, false},
		{Egress, 0, false, false, TierAdmin, 10, false, false},
		{Egress, 1, false, false, TierAdmin, 10, false, false},
		{Egress, 2, false, true, TierAdmin, 10, false, false},
		{Egress, 3, true, false, TierAdmin, 10, false, false},
	}
	if !slices.Equal(got, want) {
		t.Errorf("rule fields\n got %+v\nwant %+v", got, want)
	}
	if pr := p.Rules[0].Ports; !reflect.DeepEqual(pr, []PortRule{{Protocol: ProtoTCP, Port: 9100}, {Protocol: ProtoAny, Name: "metrics"}}) {
		t.Errorf("ingress[0] ports = %+v", pr)
	}
	if pr := p.Rules[3].Ports; !reflect.DeepEqual(pr, []PortRule{{Protocol: ProtoTCP, Port: 443, EndPort: 444}}) {
		t.Errorf("egress[1] ports = %+v", pr)
	}
	if c := p.Rules[4].Peers[1].CIDR; c != netip.MustParsePrefix("fd00::/8") {
		t.Errorf("egress[2] network = %v", c)
	}

	// Selectors and names behave, not only print.
	prodPod := labels.Labels{"app": "x", labels.KeyNamespace: "shop", labels.KeyNamespaceLabelPrefix + "env": "prod"}
	host := labels.Labels{"reserved:host": "", labels.KeyNamespaceLabelPrefix + "env": "prod"}
	if s := p.Rules[0].Subject; !s.Matches(prodPod) || s.Matches(host) {
		t.Error("a namespaces subject must select the pods of the namespaces, and never an identity without a namespace")
	}
	fq := p.Rules[3].Peers
	for _, c := range []struct {
		peer  int
		name  string
		match bool
	}{
		{0, "kubernetes.io", true}, {0, "www.kubernetes.io", false},
		{1, "a.example.com", true}, {1, "latest.blog.example.com", true}, {1, "example.com", false}, {1, "wikipedia.org", false},
		{2, "docs.example.org.", true},
	} {
		if fq[c.peer].FQDN.Matches(c.name) != c.match {
			t.Errorf("domain peer %s matches %s: want %v", fq[c.peer].FQDN, c.name, c.match)
		}
	}
}

// TestClusterNetworkPolicyAnyInput: the same policy is taken wherever a NetworkPolicy is
// (Parse, ParseDocuments, ParsePath, a stream of several kinds), and in JSON as the
// Kubernetes watcher hands it.
func TestClusterNetworkPolicyAnyInput(t *testing.T) {
	want := rules(parseOne(t, cnpFull))
	np := "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: a, namespace: x}\nspec: {podSelector: {}}\n"
	docs, err := Parse("mixed.yaml", []byte(np+"---\n"+cnpFull))
	if err != nil || len(docs.Policies) != 2 || docs.Policies[1].Kind != KindClusterNetworkPolicy || rules(docs.Policies[1]) != want {
		t.Fatalf("Parse of a stream with a NetworkPolicy and a ClusterNetworkPolicy: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cnp.yaml"), []byte(cnpFull), 0o644); err != nil {
		t.Fatal(err)
	}
	ps, err := ParsePath(dir)
	if err != nil || len(ps) != 1 || rules(ps[0]) != want {
		t.Fatalf("ParsePath: %v", err)
	}

	// JSON: compact (the fast reader with its own rendering), indented, and as a .json
	// file that is not valid JSON (the slow reader, for its error).
	raw := parseOne(t, cnpFull).Raw
	var indented bytes.Buffer
	if err := json.Indent(&indented, raw, "", "  "); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"compact.json": raw, "indented.json": indented.Bytes(), "indented.yaml": indented.Bytes()} {
		ps, err := ParseDocuments(name, data)
		if err != nil || len(ps) != 1 || rules(ps[0]) != want {
			t.Errorf("%s: %v", name, err)
		}
	}
	bad := strings.Replace(indented.String(), `"Pass"`, `"Skip"`, 1)
	pe := parseErr(t, "bad.json", bad)
	line := strings.Count(bad[:strings.Index(bad, `"Skip"`)], "\n") + 1
	wantErr(t, pe, "spec.egress[2].action", line, `unknown action "Skip" (want Accept, Deny or Pass)`)
}

func TestClusterNetworkPolicyErrors(t *testing.T) {
	// head is spec's first three lines (6-8); rules start on line 9.
	const head = "  tier: Admin\n  priority: 5\n  subject: {namespaces: {}}\n"
	// many writes field: with n items, indented by indent spaces.
	many := func(field, item string, indent, n int) string {
		var b strings.Builder
		b.WriteString(field + ":\n")
		for range n {
			b.WriteString(strings.Repeat(" ", indent) + "- " + item + "\n")
		}
		return b.String()
	}
	manyRules := func(dir, peers string, n int) string {
		var b strings.Builder
		b.WriteString("  " + dir + ":\n")
		for range n {
			b.WriteString("  - {action: Deny, " + peers + ": [{namespaces: {}}]}\n")
		}
		return b.String()
	}
	egress := func(rule string) string { return head + "  egress:\n  - " + rule }
	cases := []struct {
		name   string
		spec   string // YAML under "spec:", starting on line 6
		field  string
		line   int
		reason string
	}{
		{"missing tier", "  priority: 5\n  subject: {namespaces: {}}", "spec.tier", 6, ReasonRequired},
		{"missing priority", "  tier: Admin\n  subject: {namespaces: {}}", "spec.priority", 6, ReasonRequired},
		{"missing subject", "  tier: Admin\n  priority: 5\n  ingress: []", "spec.subject", 6, ReasonRequired},
		{"unknown tier", "  tier: admin", "spec.tier", 6, `unknown tier "admin" (want Admin or Baseline)`},
		{"NetworkPolicy is not a tier of this kind", "  tier: NetworkPolicy", "spec.tier", 6, "unknown tier"},
		{"priority over 1000", "  tier: Admin\n  priority: 1001", "spec.priority", 7, "priority 1001 out of range 0-1000"},
		{"negative priority", "  tier: Admin\n  priority: -1", "spec.priority", 7, "out of range 0-1000"},
		{"quoted priority", "  tier: Admin\n  priority: '5'", "spec.priority", 7, "must be an integer"},
		{"fractional priority", "  tier: Admin\n  priority: 5.5", "spec.priority", 7, "must be an integer"},
		{"unknown spec field", head + "  policyTypes: [Ingress]", "spec.policyTypes", 9, ReasonUnknownField},
		{"empty subject", "  tier: Admin\n  priority: 5\n  subject: {}", "spec.subject", 8, ReasonRequired + " (a subject takes exactly one of namespaces and pods)"},
		{"both subject fields", "  tier: Admin\n  priority: 5\n  subject:\n    namespaces: {}\n    pods: {podSelector: {}}",
			"spec.subject.pods", 10, "exactly one of namespaces and pods (namespaces is set too)"},
		{"pods subject without podSelector", "  tier: Admin\n  priority: 5\n  subject:\n    pods: {namespaceSelector: {}}",
			"spec.subject.pods.podSelector", 9, ReasonRequired},
		{"unknown subject field", "  tier: Admin\n  priority: 5\n  subject:\n    namespace: {}", "spec.subject.namespace", 9, ReasonUnknownField},
		{"bad subject selector", "  tier: Admin\n  priority: 5\n  subject:\n    namespaces:\n      matchLabels: {env: 'a b'}",
			"spec.subject.namespaces.matchLabels.env", 10, "invalid label value"},
		{"too many ingress rules", head + manyRules("ingress", "from", 26), "spec.ingress[25]", 35, "more than 25 rules (26)"},
		{"too many egress rules", head + manyRules("egress", "to", 30), "spec.egress[25]", 35, "more than 25 rules (30)"},
		{"missing action", egress("to: [{namespaces: {}}]"), "spec.egress[0].action", 10, ReasonRequired},
		{"unknown action", egress("{action: Allow, to: [{namespaces: {}}]}"), "spec.egress[0].action", 10, `unknown action "Allow" (want Accept, Deny or Pass)`},
		{"lowercase action", egress("{action: deny, to: [{namespaces: {}}]}"), "spec.egress[0].action", 10, "unknown action"},
		{"missing to", egress("action: Deny"), "spec.egress[0].to", 10, ReasonRequired},
		{"missing from", head + "  ingress:\n  - action: Deny", "spec.ingress[0].from", 10, ReasonRequired},
		{"null to", egress("action: Deny\n    to:"), "spec.egress[0].to", 11, "at least one peer"},
		{"empty to", egress("action: Deny\n    to: []"), "spec.egress[0].to", 11, "at least one peer"},
		{"from in an egress rule", egress("action: Deny\n    from: [{namespaces: {}}]"), "spec.egress[0].from", 11, ReasonUnknownField},
		{"too many peers", egress("action: Deny\n    " + many("to", "namespaces: {}", 4, 26)), "spec.egress[0].to[25]", 37, "more than 25 peers"},
		{"null rule", head + "  egress:\n  - null", "spec.egress[0]", 10, "must be a rule"},
		{"unknown rule field", egress("action: Deny\n    ports: []"), "spec.egress[0].ports", 11, ReasonUnknownField},
		{"rule name too long", egress("action: Deny\n    name: " + strings.Repeat("n", 101) + "\n    to: [{namespaces: {}}]"),
			"spec.egress[0].name", 11, "at most 100 characters, not 101"},
		{"empty peer", egress("action: Deny\n    to:\n    - {}"), "spec.egress[0].to[0]", 12, "exactly one of namespaces, pods, nodes, networks and domainNames, and this one sets none"},
		{"only null fields", egress("action: Deny\n    to:\n    - {namespaces: null}"), "spec.egress[0].to[0]", 12, "sets none"},
		{"two peer fields", egress("action: Deny\n    to:\n    - namespaces: {}\n      networks: [10.0.0.0/8]"),
			"spec.egress[0].to[0].networks", 13, "exactly one of namespaces, pods, nodes, networks and domainNames (namespaces is set too)"},
		{"unknown peer field", egress("action: Deny\n    to:\n    - services: [x]"), "spec.egress[0].to[0].services", 12, ReasonUnknownField},
		{"networks on ingress", head + "  ingress:\n  - action: Deny\n    from:\n    - networks: [10.0.0.0/8]", "spec.ingress[0].from[0].networks", 12, ReasonUnknownField},
		{"nodes on ingress", head + "  ingress:\n  - action: Deny\n    from:\n    - nodes: {}", "spec.ingress[0].from[0].nodes", 12, ReasonUnknownField},
		{"empty ingress peer", head + "  ingress:\n  - action: Deny\n    from: [{}]", "spec.ingress[0].from[0]", 11, "exactly one of namespaces and pods, and this one sets none"},
		{"pods peer without podSelector", egress("action: Deny\n    to:\n    - pods: {}"), "spec.egress[0].to[0].pods.podSelector", 12, ReasonRequired},
		{"unknown pods field", egress("action: Deny\n    to:\n    - pods: {podSelector: {}, namespace: x}"), "spec.egress[0].to[0].pods.namespace", 12, ReasonUnknownField},
		{"nodes with labels", egress("action: Accept\n    to:\n    - nodes:\n        matchLabels: {kubernetes.io/os: linux}"),
			"spec.egress[0].to[0].nodes", 12, "a node label selector is " + ReasonNotSupported},
		{"nodes with an expression", egress("action: Accept\n    to:\n    - nodes: {matchExpressions: [{key: a, operator: Exists}]}"),
			"spec.egress[0].to[0].nodes", 12, ReasonNotSupported},
		{"CIDR with host bits", egress("action: Deny\n    to:\n    - networks: [10.0.0.1/8]"), "spec.egress[0].to[0].networks[0]", 12,
			`CIDR "10.0.0.1/8" has bits set past its prefix length (write 10.0.0.0/8)`},
		{"IPv6 CIDR with host bits", egress("action: Deny\n    to:\n    - networks: ['fd00::1/8']"), "spec.egress[0].to[0].networks[0]", 12, "write fd00::/8"},
		{"address without length", egress("action: Deny\n    to:\n    - networks: [10.0.0.1]"), "spec.egress[0].to[0].networks[0]", 12, `invalid CIDR "10.0.0.1"`},
		{"bad CIDR", egress("action: Deny\n    to:\n    - networks:\n      - 10.0.0.0/8\n      - 10.0.0.0/33"), "spec.egress[0].to[0].networks[1]", 14, "invalid CIDR"},
		{"CIDR not a string", egress("action: Deny\n    to:\n    - networks: [7]"), "spec.egress[0].to[0].networks[0]", 12, "must be a string"},
		{"no networks", egress("action: Deny\n    to:\n    - networks: []"), "spec.egress[0].to[0].networks", 12, "at least one CIDR"},
		{"too many networks", egress("action: Deny\n    to:\n    - " + many("networks", "10.0.0.0/8", 6, 26)), "spec.egress[0].to[0].networks[25]", 38, "more than 25 CIDRs (26)"},
		{"duplicate network", egress("action: Deny\n    to:\n    - networks: [10.0.0.0/8, 10.0.0.0/8]"), "spec.egress[0].to[0].networks[1]", 12, "duplicate CIDR"},
		{"domainNames in a Deny rule", egress("action: Deny\n    to:\n    - domainNames: [example.com]"), "spec.egress[0].to[0].domainNames", 12,
			"domainNames is only allowed in Accept rules, and this rule's action is Deny"},
		{"domainNames in a Pass rule", egress("to:\n    - namespaces: {}\n    - domainNames: [example.com]\n    action: Pass"), "spec.egress[0].to[1].domainNames", 12,
			"this rule's action is Pass"},
		{"no domainNames", egress("action: Accept\n    to:\n    - domainNames: []"), "spec.egress[0].to[0].domainNames", 12, "at least one domain name"},
		{"too many domainNames", egress("action: Accept\n    to:\n    - " + many("domainNames", "example.com", 6, 26)), "spec.egress[0].to[0].domainNames[25]", 38, "more than 25 domain names"},
		{"duplicate domain name", egress("action: Accept\n    to:\n    - domainNames: [a.example.com, b.example.com, a.example.com]"), "spec.egress[0].to[0].domainNames[2]", 12, "duplicate domain name"},
		{"wildcard inside a label", egress("action: Accept\n    to:\n    - domainNames: ['a*.b.io']"), "spec.egress[0].to[0].domainNames[0]", 12, `invalid domain name "a*.b.io": '*' may only be the first label`},
		{"wildcard alone", egress("action: Accept\n    to:\n    - domainNames: ['*']"), "spec.egress[0].to[0].domainNames[0]", 12, "'*' may only be the first label"},
		{"wildcard in a label", egress("action: Accept\n    to:\n    - domainNames: ['k*.io']"), "spec.egress[0].to[0].domainNames[0]", 12, "'*' may only be the first label"},
		{"two wildcards", egress("action: Accept\n    to:\n    - domainNames: ['*.*.io']"), "spec.egress[0].to[0].domainNames[0]", 12, "'*' may only be the first label"},
		{"Cilium's **", egress("action: Accept\n    to:\n    - domainNames: ['**.example.io']"), "spec.egress[0].to[0].domainNames[0]", 12, "'*' may only be the first label"},
		{"wildcard over a single label", egress("action: Accept\n    to:\n    - domainNames: ['*.io']"), "spec.egress[0].to[0].domainNames[0]", 12, "'*' may only be the first label"},
		{"single label", egress("action: Accept\n    to:\n    - domainNames: [localhost]"), "spec.egress[0].to[0].domainNames[0]", 12, "at least two labels"},
		{"label starting with -", egress("action: Accept\n    to:\n    - domainNames: [-a.example.io]"), "spec.egress[0].to[0].domainNames[0]", 12, "invalid domain name"},
		{"label over 63 characters", egress("action: Accept\n    to:\n    - domainNames: [" + strings.Repeat("a", 64) + ".io]"), "spec.egress[0].to[0].domainNames[0]", 12, "longer than 63 characters"},
		{"no protocols", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: []"), "spec.egress[0].protocols", 12, "at least one protocol"},
		{"too many protocols", egress("action: Deny\n    to: [{namespaces: {}}]\n    " + many("protocols", "tcp: {}", 4, 26)), "spec.egress[0].protocols[25]", 38, "more than 25 protocols"},
		{"empty protocol", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{}]"), "spec.egress[0].protocols[0]", 12, "needs exactly one of tcp, udp, sctp and destinationNamedPort"},
		{"two protocols in one entry", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols:\n    - tcp: {}\n      udp: {}"),
			"spec.egress[0].protocols[0].udp", 14, "exactly one of tcp, udp, sctp and destinationNamedPort (tcp is set too)"},
		{"ICMP", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{icmp: {}}]"), "spec.egress[0].protocols[0].icmp", 12, ReasonUnknownField},
		{"unknown protocol field", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{tcp: {sourcePort: {number: 1}}}]"), "spec.egress[0].protocols[0].tcp.sourcePort", 12, ReasonUnknownField},
		{"empty destinationPort", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{tcp: {destinationPort: {}}}]"), "spec.egress[0].protocols[0].tcp.destinationPort", 12, "exactly one of number and range"},
		{"port 0", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{udp: {destinationPort: {number: 0}}}]"), "spec.egress[0].protocols[0].udp.destinationPort.number", 12, "port 0 out of range 1-65535"},
		{"port too big", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{sctp: {destinationPort: {number: 65536}}}]"), "spec.egress[0].protocols[0].sctp.destinationPort.number", 12, "out of range 1-65535"},
		{"quoted port", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{tcp: {destinationPort: {number: '80'}}}]"), "spec.egress[0].protocols[0].tcp.destinationPort.number", 12, "must be an integer"},
		{"number and range", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols:\n    - tcp:\n        destinationPort:\n          number: 80\n          range: {start: 1, end: 2}"),
			"spec.egress[0].protocols[0].tcp.destinationPort.range", 16, "exactly one of number and range (number is set too)"},
		{"range start equal to end", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols:\n    - tcp:\n        destinationPort:\n          range:\n            start: 80\n            end: 80"),
			"spec.egress[0].protocols[0].tcp.destinationPort.range.end", 17, "range end 80 must be greater than start 80"},
		{"range start after end", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{tcp: {destinationPort: {range: {start: 90, end: 80}}}}]"),
			"spec.egress[0].protocols[0].tcp.destinationPort.range.end", 12, "must be greater than start 90"},
		{"range start 0", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{tcp: {destinationPort: {range: {start: 0, end: 80}}}}]"),
			"spec.egress[0].protocols[0].tcp.destinationPort.range.start", 12, "out of range 1-65535"},
		{"range end too big", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{tcp: {destinationPort: {range: {start: 1, end: 65536}}}}]"),
			"spec.egress[0].protocols[0].tcp.destinationPort.range.end", 12, "out of range 1-65535"},
		{"range without end", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{tcp: {destinationPort: {range: {start: 1}}}}]"),
			"spec.egress[0].protocols[0].tcp.destinationPort.range.end", 12, ReasonRequired},
		{"range without start", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{tcp: {destinationPort: {range: {end: 9}}}}]"),
			"spec.egress[0].protocols[0].tcp.destinationPort.range.start", 12, ReasonRequired},
		{"bad named port", egress("action: Deny\n    to: [{namespaces: {}}]\n    protocols: [{destinationNamedPort: Web_Port}]"),
			"spec.egress[0].protocols[0].destinationNamedPort", 12, "invalid port name"},
		{"named port with networks", egress("action: Deny\n    to:\n    - namespaces: {}\n    - networks: [10.0.0.0/8]\n    protocols:\n    - destinationNamedPort: http"),
			"spec.egress[0].protocols[0].destinationNamedPort", 15, "cannot be used in a rule with a networks peer (spec.egress[0].to[1].networks)"},
		{"named port with nodes", egress("action: Accept\n    protocols: [{destinationNamedPort: http}]\n    to: [{nodes: {}}]"),
			"spec.egress[0].protocols[0].destinationNamedPort", 11, "with a nodes peer"},
		{"named port with domainNames", egress("action: Accept\n    protocols: [{destinationNamedPort: http}]\n    to: [{domainNames: [a.io]}]"),
			"spec.egress[0].protocols[0].destinationNamedPort", 11, "with a domainNames peer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pe := parseErr(t, "cnp.yaml", clusterHeader+"spec:\n"+c.spec+"\n")
			wantErr(t, pe, c.field, c.line, c.reason)
			if pe.Kind != KindClusterNetworkPolicy || pe.Namespace != "" || pe.Name != "c" || pe.Document != 1 || pe.Source != "cnp.yaml" {
				t.Errorf("error context = %+v", pe)
			}
		})
	}
}

func TestClusterNetworkPolicyDocumentErrors(t *testing.T) {
	const spec = "spec: {tier: Admin, priority: 1, subject: {namespaces: {}}}\n"
	cases := []struct {
		name, src string
		field     string
		line      int
		reason    string
	}{
		{"v1alpha2", strings.Replace(clusterHeader, "v1beta1", "v1alpha2", 1) + spec, "apiVersion", 1,
			`apiVersion "policy.networking.k8s.io/v1alpha2" does not serve kind ClusterNetworkPolicy (want policy.networking.k8s.io/v1beta1)`},
		{"NetworkPolicy's apiVersion", strings.Replace(clusterHeader, "policy.networking.k8s.io/v1beta1", "networking.k8s.io/v1", 1) + spec, "apiVersion", 1, "does not serve kind ClusterNetworkPolicy"},
		{"namespace", clusterHeader + "  namespace: x\n" + spec, "metadata.namespace", 5, "cluster-scoped and has no namespace"},
		{"missing name", "apiVersion: policy.networking.k8s.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {}\n" + spec, "metadata.name", 3, ReasonRequired},
		{"invalid name", strings.Replace(clusterHeader, "name: c", "name: C_1", 1) + spec, "metadata.name", 4, "invalid name"},
		{"missing spec", clusterHeader, "spec", 1, ReasonRequired},
		{"unknown top-level field", clusterHeader + spec + "specs: []\n", "specs", 6, ReasonUnknownField},
		{"status not a mapping", clusterHeader + spec + "status: ok\n", "status", 6, "must be a mapping"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pe := parseErr(t, "cnp.yaml", c.src)
			wantErr(t, pe, c.field, c.line, c.reason)
			if pe.Kind != KindClusterNetworkPolicy {
				t.Errorf("error kind = %q", pe.Kind)
			}
		})
	}
	pe := parseErr(t, "x.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n")
	if !strings.Contains(pe.Reason, "ClusterNetworkPolicy") {
		t.Errorf("the unknown kind error does not list ClusterNetworkPolicy: %v", pe)
	}
}

// TestClusterNetworkPolicyConstants holds the parser's spellings to the API module's.
func TestClusterNetworkPolicyConstants(t *testing.T) {
	for _, c := range [][2]string{
		{cnpTierAdmin, string(v1beta1.AdminTier)},
		{cnpTierBaseline, string(v1beta1.BaselineTier)},
		{cnpActionAccept, string(v1beta1.ClusterNetworkPolicyRuleActionAccept)},
		{cnpActionDeny, string(v1beta1.ClusterNetworkPolicyRuleActionDeny)},
		{cnpActionPass, string(v1beta1.ClusterNetworkPolicyRuleActionPass)},
		{apiPolicyNetworking, v1beta1.GroupVersion.String()},
		{string(KindClusterNetworkPolicy), "ClusterNetworkPolicy"},
	} {
		if c[0] != c[1] {
			t.Errorf("parser spells %q, the API %q", c[0], c[1])
		}
	}
}

// conformanceWant is what the parser makes of each upstream conformance manifest
// (conformance/base of sigs.k8s.io/network-policy-api): every ClusterNetworkPolicy is
// accepted but those whose egress peers select nodes by label, which Rampart cannot do
// yet. These are refused at their first such peer, and with their node selectors made
// empty (every node) the rest of them is accepted too.
var conformanceWant = map[string]string{
	"admin_tier/experimental-egress-selector-rules.yaml":    "spec.egress[0].to[0].nodes",
	"baseline_tier/experimental-egress-selector-rules.yaml": "spec.egress[0].to[0].nodes",
}

// networkPolicyAPIDir is where the go command keeps the module's files.
func networkPolicyAPIDir(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(testenv.GoTool(), "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/network-policy-api")
	cmd.Dir = testenv.ModuleRoot(t)
	out, err := cmd.Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		t.Fatalf("go list -m sigs.k8s.io/network-policy-api: %v (%s)", err, out)
	}
	return dir
}

func TestClusterNetworkPolicyConformanceManifests(t *testing.T) {
	base := filepath.Join(networkPolicyAPIDir(t), "conformance", "base")
	var files []string
	for _, sub := range []string{"admin_tier", "baseline_tier", "api_integration"} {
		fs, err := filepath.Glob(filepath.Join(base, sub, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, fs...)
	}
	sort.Strings(files)
	// The manifests are templates (text/template) of the suite's host network ports: the
	// suite's defaults, 34345 on.
	ports := struct{ HostNetworkPorts []int }{}
	for p := 34345; p < 34345+10; p++ {
		ports.HostNetworkPorts = append(ports.HostNetworkPorts, p)
	}
	kindRE := regexp.MustCompile(`(?m)^kind: ClusterNetworkPolicy$`)
	nodesRE := regexp.MustCompile(`(?m)^( *- nodes:)\n +matchLabels:\n +kubernetes\.io/os: linux$`)
	total, refused := 0, 0
	for _, f := range files {
		rel, _ := filepath.Rel(base, f)
		rel = filepath.ToSlash(rel)
		t.Run(rel, func(t *testing.T) {
			text, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			tmpl, err := template.New(rel).Parse(string(text))
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := tmpl.Execute(&b, ports); err != nil {
				t.Fatal(err)
			}
			data := b.Bytes()
			n := len(kindRE.FindAll(data, -1))
			total += n
			if field, ok := conformanceWant[rel]; ok {
				refused++
				pe := parseErr(t, rel, string(data))
				if pe.Field != field || !strings.Contains(pe.Reason, ReasonNotSupported) || pe.Line == 0 {
					t.Errorf("refused with %v, want %s: %s", pe, field, ReasonNotSupported)
				}
				data = nodesRE.ReplaceAll(data, []byte("$1 {}"))
			}
			ps, err := ParseDocuments(rel, data)
			if err != nil {
				t.Fatalf("%v\n%s", err, data)
			}
			cnps := 0
			for _, p := range ps {
				if p.Kind != KindClusterNetworkPolicy {
					continue
				}
				cnps++
				if len(p.Rules) == 0 {
					t.Errorf("%s: no rules", p.Name)
				}
				checkRawRoundTrip(t, p)
				checkUpstream(t, p)
			}
			if cnps != n {
				t.Errorf("%d ClusterNetworkPolicies parsed, the file has %d", cnps, n)
			}
		})
	}
	if len(files) < 25 || total != 35 || refused != len(conformanceWant) {
		t.Errorf("%d files with %d ClusterNetworkPolicies (%d refused as they are), want 35", len(files), total, refused)
	}
}

// checkUpstream decodes p's document with encoding/json into the API module's type, turns
// that into rules independently of the parser, and checks the two agree; then it parses
// the JSON the module's type writes (as a typed client would hand it on) and checks it
// yields the same rules.
func checkUpstream(t *testing.T, p *Policy) {
	t.Helper()
	var cnp v1beta1.ClusterNetworkPolicy
	dec := json.NewDecoder(bytes.NewReader(p.Raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cnp); err != nil {
		t.Errorf("%s: encoding/json cannot decode the document into v1beta1.ClusterNetworkPolicy: %v\n%s", p.Name, err, p.Raw)
		return
	}
	if cnp.Name != p.Name || cnp.Namespace != p.Namespace || cnp.Kind != string(p.Kind) || cnp.APIVersion != v1beta1.GroupVersion.String() {
		t.Errorf("%s: upstream object %s/%s %s %s", p.Name, cnp.Namespace, cnp.Name, cnp.APIVersion, cnp.Kind)
	}
	want, err := upstreamRules(&cnp)
	if err != nil {
		t.Errorf("%s: %v", p.Name, err)
		return
	}
	if got, w := canonRules(p.Rules), canonRules(want); got != w {
		t.Errorf("%s: the parser and the upstream types disagree\n--- parser\n%s--- upstream\n%s", p.Name, got, w)
	}
	typed, err := json.Marshal(&cnp)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseDocuments("typed.json", typed)
	if err != nil || len(back) != 1 {
		t.Errorf("%s: the upstream type's JSON does not parse: %v\n%s", p.Name, err, typed)
		return
	}
	if rules(back[0]) != rules(p) {
		t.Errorf("%s: the upstream type's JSON parses to other rules\n%s", p.Name, rules(back[0]))
	}
}

// upstreamRules is what the rules of an upstream object mean, written from the API's
// documentation without the parser's code.
func upstreamRules(cnp *v1beta1.ClusterNetworkPolicy) ([]Rule, error) {
	nsKey := func(k string) string { return labels.KeyNamespaceLabelPrefix + k }
	plain := func(k string) string { return k }
	sel := func(ls *metav1.LabelSelector, key func(string) string) (labels.Selector, error) {
		var s labels.Selector
		for k, v := range ls.MatchLabels {
			r, err := labels.NewRequirement(key(k), "In", []string{v})
			if err != nil {
				return s, err
			}
			s = s.With(r)
		}
		for _, e := range ls.MatchExpressions {
			r, err := labels.NewRequirement(key(e.Key), string(e.Operator), e.Values)
			if err != nil {
				return s, err
			}
			s = s.With(r)
		}
		return s, nil
	}
	pods := func(np *v1beta1.NamespacedPod) (labels.Selector, error) {
		ps, err := sel(&np.PodSelector, plain)
		if err != nil {
			return ps, err
		}
		ns, err := sel(&np.NamespaceSelector, nsKey)
		return ps.And(ns).With(mustRequirement(labels.KeyNamespace, labels.OpExists)), err
	}
	namespaces := func(ls *metav1.LabelSelector) (labels.Selector, error) {
		s, err := sel(ls, nsKey)
		return s.With(mustRequirement(labels.KeyNamespace, labels.OpExists)), err
	}
	tier := map[v1beta1.Tier]Tier{v1beta1.AdminTier: TierAdmin, v1beta1.BaselineTier: TierBaseline}[cnp.Spec.Tier]
	var subject labels.Selector
	var err error
	switch s := cnp.Spec.Subject; {
	case s.Namespaces != nil && s.Pods == nil:
		subject, err = namespaces(s.Namespaces)
	case s.Pods != nil && s.Namespaces == nil:
		subject, err = pods(s.Pods)
	default:
		return nil, fmt.Errorf("subject sets %v", s)
	}
	if err != nil {
		return nil, err
	}
	rule := func(dir Direction, i int, name string, action v1beta1.ClusterNetworkPolicyRuleAction, protocols []v1beta1.ClusterNetworkPolicyProtocol) Rule {
		r := Rule{Index: i, Description: fmt.Sprintf("spec.%s[%d]", dir, i), Subject: subject, Direction: dir, Tier: tier, Priority: cnp.Spec.Priority,
			Deny: action == v1beta1.ClusterNetworkPolicyRuleActionDeny, Pass: action == v1beta1.ClusterNetworkPolicyRuleActionPass}
		if name != "" {
			r.Description += " (" + cnpRuleName(name) + ")"
		}
		for _, pr := range protocols {
			var dp *v1beta1.Port
			var proto Protocol
			switch {
			case pr.TCP != nil:
				dp, proto = pr.TCP.DestinationPort, ProtoTCP
			case pr.UDP != nil:
				dp, proto = pr.UDP.DestinationPort, ProtoUDP
			case pr.SCTP != nil:
				dp, proto = pr.SCTP.DestinationPort, ProtoSCTP
			default:
				r.Ports = append(r.Ports, PortRule{Protocol: ProtoAny, Name: pr.DestinationNamedPort})
				continue
			}
			port := PortRule{Protocol: proto}
			switch {
			case dp == nil:
			case dp.Range != nil:
				port.Port, port.EndPort = uint16(dp.Range.Start), uint16(dp.Range.End)
			default:
				port.Port = uint16(dp.Number)
			}
			r.Ports = append(r.Ports, port)
		}
		return r
	}
	var out []Rule
	for i, in := range cnp.Spec.Ingress {
		r := rule(Ingress, i, in.Name, in.Action, in.Protocols)
		for _, peer := range in.From {
			var s labels.Selector
			if peer.Namespaces != nil {
				s, err = namespaces(peer.Namespaces)
			} else {
				s, err = pods(peer.Pods)
			}
			if err != nil {
				return nil, err
			}
			r.Peers = append(r.Peers, Peer{Kind: PeerEndpoints, Selector: s})
		}
		out = append(out, r)
	}
	for i, eg := range cnp.Spec.Egress {
		r := rule(Egress, i, eg.Name, eg.Action, eg.Protocols)
		for _, peer := range eg.To {
			var s labels.Selector
			switch {
			case peer.Namespaces != nil:
				s, err = namespaces(peer.Namespaces)
			case peer.Pods != nil:
				s, err = pods(peer.Pods)
			case peer.Nodes != nil:
				if len(peer.Nodes.MatchLabels)+len(peer.Nodes.MatchExpressions) > 0 {
					return nil, fmt.Errorf("egress[%d]: nodes by label", i)
				}
				r.Peers = append(r.Peers, Peer{Kind: PeerEntity, Entity: EntityHost}, Peer{Kind: PeerEntity, Entity: EntityRemoteNode})
				continue
			case len(peer.Networks) > 0:
				for _, c := range peer.Networks {
					r.Peers = append(r.Peers, Peer{Kind: PeerCIDR, CIDR: netip.MustParsePrefix(string(c))})
				}
				continue
			default:
				for _, dn := range peer.DomainNames {
					name, pattern := string(dn), ""
					if rest, ok := strings.CutPrefix(name, "*."); ok {
						name, pattern = "", "**."+rest
					}
					f, err := fqdn.NewSelector(name, pattern)
					if err != nil {
						return nil, err
					}
					r.Peers = append(r.Peers, Peer{Kind: PeerFQDN, FQDN: f})
				}
				continue
			}
			if err != nil {
				return nil, err
			}
			r.Peers = append(r.Peers, Peer{Kind: PeerEndpoints, Selector: s})
		}
		out = append(out, r)
	}
	return out, nil
}

// canonRules renders rules with every selector's requirements sorted (the API's
// matchLabels is a map).
func canonRules(rs []Rule) string {
	canon := func(s labels.Selector) labels.Selector {
		out := labels.Selector{Requirements: slices.Clone(s.Requirements)}
		sort.Slice(out.Requirements, func(i, j int) bool {
			return fmt.Sprint(out.Requirements[i]) < fmt.Sprint(out.Requirements[j])
		})
		return out
	}
	var b strings.Builder
	for _, r := range rs {
		r.Subject = canon(r.Subject)
		r.Peers = slices.Clone(r.Peers)
		for i := range r.Peers {
			r.Peers[i].Selector = canon(r.Peers[i].Selector)
		}
		b.WriteString(FormatRule(r))
	}
	return b.String()
}

func TestClusterNetworkPolicyErrorsAreParseErrors(t *testing.T) {
	// Through Parse (which also takes CIDR groups and taps) the errors are the same.
	_, err := Parse("cnp.yaml", []byte(clusterHeader+"spec: {tier: Admin, priority: 1, subject: {}}\n"))
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Field != "spec.subject" {
		t.Fatalf("Parse: %v", err)
	}
	want := `cnp.yaml: document 1 (ClusterNetworkPolicy c): spec.subject (line 5): required field missing (a subject takes exactly one of namespaces and pods)`
	if pe.Error() != want {
		t.Errorf("Error() =\n  %s\nwant\n  %s", pe.Error(), want)
	}
}
