package policy

import (
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/labels"
)

const cnpHeader = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: p
  namespace: x
`

const ccnpHeader = `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata:
  name: p
`

func TestCiliumNamespaceScoping(t *testing.T) {
	spec := `spec:
  endpointSelector:
    matchLabels:
      k8s:app: web
  ingress:
  - fromEndpoints:
    - {}
    - matchLabels: {any:role: api}
    - matchLabels: {k8s:io.kubernetes.pod.namespace: y, role: api}
    - matchExpressions: [{key: io.kubernetes.pod.namespace, operator: notin, values: [z]}]
    - matchLabels: {io.cilium.k8s.namespace.labels.team: blue}
`
	cnp := parseOne(t, cnpHeader+spec)
	wantRules(t, rules(cnp), block(
		"  rule 0 spec.ingress[0]: ingress allow default-deny",
		"    subject: app=web,io.kubernetes.pod.namespace=x",
		"    peers:",
		"      endpoints io.kubernetes.pod.namespace=x",
		"      endpoints role=api,io.kubernetes.pod.namespace=x",
		// A selector on the namespace lifts the restriction to the policy's namespace.
		"      endpoints io.kubernetes.pod.namespace=y,role=api",
		"      endpoints io.kubernetes.pod.namespace notin (z)",
		// Namespace labels do not: only the namespace name key does, as in Cilium.
		"      endpoints io.cilium.k8s.namespace.labels.team=blue,io.kubernetes.pod.namespace=x",
		"    ports: all",
	))
	ccnp := parseOne(t, ccnpHeader+spec)
	if ccnp.Namespace != "" {
		t.Errorf("clusterwide policy namespace = %q", ccnp.Namespace)
	}
	wantRules(t, rules(ccnp), block(
		"  rule 0 spec.ingress[0]: ingress allow default-deny",
		"    subject: app=web",
		"    peers:",
		"      endpoints io.kubernetes.pod.namespace",
		"      endpoints role=api,io.kubernetes.pod.namespace",
		"      endpoints io.kubernetes.pod.namespace=y,role=api",
		"      endpoints io.kubernetes.pod.namespace notin (z)",
		"      endpoints io.cilium.k8s.namespace.labels.team=blue,io.kubernetes.pod.namespace",
		"    ports: all",
	))
	// A clusterwide {} peer selects every endpoint, and no reserved identity.
	all := ccnp.Rules[0].Peers[0].Selector
	if !all.Matches(labels.Labels{labels.KeyNamespace: "q", "a": "b"}) || all.Matches(labels.Labels{"reserved:world": ""}) {
		t.Error("clusterwide {} peer matches wrongly")
	}
}

func TestCiliumPeersAndPorts(t *testing.T) {
	p := parseOne(t, cnpHeader+`spec:
  endpointSelector: {}
  egress:
  - toEndpoints: [{matchLabels: {app: db}}]
    toCIDR: [198.18.0.1, 198.18.4.0/22, "2001:db8::/32"]
    toCIDRSet:
    - cidr: 10.0.0.0/8
      except: [10.96.0.0/12, 10.0.0.0/8]
    toEntities: [world, host, cluster, all, remote-node, health, init, unmanaged, kube-apiserver, ingress]
    toPorts:
    - ports:
      - port: "80"
        protocol: TCP
      - port: 53
        protocol: udp
      - port: "0"
      - protocol: SCTP
      - port: HTTP-Alt
      - port: "8000"
        endPort: 8080
      - {port: "9000", endPort: 0}
      - protocol: ICMP
    - ports: [{port: "443", protocol: Any}]
  - toPorts:
    - ports: [{port: "5432"}]
  - {}
  - toEndpoints: []
    toPorts:
    - ports: [{port: "80"}]
  - icmps:
    - fields:
      - type: 8
      - {type: "0", family: IPv4}
      - {type: EchoReply, family: IPv4}
      - {type: EchoRequest, family: IPv6}
      - {type: 135, family: IPv6}
`)
	wantRules(t, rules(p), block(
		"  rule 0 spec.egress[0]: egress allow default-deny",
		"    subject: io.kubernetes.pod.namespace=x",
		"    peers:",
		"      endpoints app=db,io.kubernetes.pod.namespace=x",
		"      cidr 198.18.0.1/32",
		"      cidr 198.18.4.0/22",
		"      cidr 2001:db8::/32",
		"      cidr 10.0.0.0/8 except 10.96.0.0/12,10.0.0.0/8",
		"      entity world",
		"      entity host",
		"      entity cluster",
		"      entity all",
		"      entity remote-node",
		"      entity health",
		"      entity init",
		"      entity unmanaged",
		"      entity kube-apiserver",
		"      entity ingress",
		"    ports: TCP/80, UDP/53, ANY/all, SCTP/all, ANY/http-alt, ANY/8000-8080, ANY/9000, ICMP/all, ANY/443",
		// toPorts without a peer field: every peer.
		"  rule 1 spec.egress[1]: egress allow default-deny",
		"    subject: io.kubernetes.pod.namespace=x",
		"    peers: all",
		"    ports: ANY/5432",
		// Neither peers nor ports: allows nothing (only default deny).
		"  rule 2 spec.egress[2]: egress allow default-deny",
		"    subject: io.kubernetes.pod.namespace=x",
		"    peers: none",
		"    ports: all",
		// An explicitly empty peer list selects no peer, even with ports.
		"  rule 3 spec.egress[3]: egress allow default-deny",
		"    subject: io.kubernetes.pod.namespace=x",
		"    peers: none",
		"    ports: ANY/80",
		"  rule 4 spec.egress[4]: egress allow default-deny",
		"    subject: io.kubernetes.pod.namespace=x",
		"    peers: all",
		"    ports: ICMP type 8, ICMP type 0, ICMP type 0, ICMPv6 type 128, ICMPv6 type 135",
	))
	for _, pr := range p.Rules[4].Ports {
		if !pr.ICMPType {
			t.Errorf("icmps port %+v must have ICMPType set", pr)
		}
	}
	if pr := p.Rules[0].Ports[4]; pr.Name != "http-alt" || pr.Port != 0 {
		t.Errorf("named port = %+v, want lowercased name", pr)
	}
}

func TestCiliumDefaultDeny(t *testing.T) {
	type want struct{ desc, dir, verdict, enforce, peers string }
	cases := []struct {
		name string
		spec string
		want []want
	}{
		{"empty rule turns on default deny", "  ingress:\n  - {}",
			[]want{{"spec.ingress[0]", "ingress", "allow", "default-deny", "none"}}},
		{"null egress turns on egress default deny", "  egress:",
			[]want{{"spec.egress", "egress", "allow", "default-deny", "none"}}},
		{"empty list turns on default deny", "  ingress: []",
			[]want{{"spec.ingress", "ingress", "allow", "default-deny", "none"}}},
		{"deny rules alone turn on default deny, as in Cilium", "  ingressDeny:\n  - fromEntities: [world]",
			[]want{{"spec.ingressDeny[0]", "ingress", "deny", "default-deny", "peers"}}},
		{"allow and deny, in document order per direction", "  egressDeny:\n  - toEntities: [world]\n  egress:\n  - toEntities: [all]\n  ingress: [{}]",
			[]want{
				{"spec.ingress[0]", "ingress", "allow", "default-deny", "none"},
				{"spec.egressDeny[0]", "egress", "deny", "default-deny", "peers"},
				{"spec.egress[0]", "egress", "allow", "default-deny", "peers"},
			}},
		{"enableDefaultDeny false keeps the rules but not the enforcement",
			"  enableDefaultDeny: {ingress: false}\n  ingress:\n  - fromEntities: [world]\n  ingressDeny:\n  - fromEntities: [host]",
			[]want{
				{"spec.ingress[0]", "ingress", "allow", "no-default-deny", "peers"},
				{"spec.ingressDeny[0]", "ingress", "deny", "no-default-deny", "peers"},
			}},
		{"enableDefaultDeny false with no rules does nothing", "  enableDefaultDeny: {egress: false}\n  egress: []", nil},
		{"enableDefaultDeny true without the key", "  enableDefaultDeny: {egress: true, ingress: null}",
			[]want{{"spec.enableDefaultDeny.egress", "egress", "allow", "default-deny", "none"}}},
		{"no direction keys: no rules", "  description: nothing", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := parseOne(t, cnpHeader+"spec:\n  endpointSelector: {}\n"+c.spec+"\n")
			if len(p.Rules) != len(c.want) {
				t.Fatalf("got rules\n%s want %d rules", rules(p), len(c.want))
			}
			for i, r := range p.Rules {
				verdict, enforce, peers := "allow", "no-default-deny", "none"
				if r.Deny {
					verdict = "deny"
				}
				if r.EnableDefaultDeny {
					enforce = "default-deny"
				}
				if len(r.Peers) > 0 || r.AllPeers {
					peers = "peers"
				}
				got := want{r.Description, r.Direction.String(), verdict, enforce, peers}
				if got != c.want[i] {
					t.Errorf("rule %d = %+v, want %+v", i, got, c.want[i])
				}
			}
		})
	}
}

func TestCiliumSpecs(t *testing.T) {
	p := parseOne(t, cnpHeader+`description: top-level description is informational
spec:
  endpointSelector: {matchLabels: {a: b}}
  ingress: [{fromEntities: [world]}]
specs:
- endpointSelector: {matchLabels: {c: d}}
  egress: [{toEntities: [world]}]
  labels: [{key: team, value: x, source: k8s}]
  description: second
- endpointSelector:
    matchExpressions: [{key: e, operator: exists}]
  ingressDeny: [{fromCIDR: [10.0.0.0/8]}]
`)
	var got []string
	for _, r := range p.Rules {
		got = append(got, r.Description+" "+r.Subject.String())
	}
	want := []string{
		"spec.ingress[0] a=b,io.kubernetes.pod.namespace=x",
		"specs[0].egress[0] c=d,io.kubernetes.pod.namespace=x",
		"specs[1].ingressDeny[0] e,io.kubernetes.pod.namespace=x",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rules =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i, r := range p.Rules {
		if r.Index != i {
			t.Errorf("rule %d has Index %d", i, r.Index)
		}
	}
}

func TestCiliumErrors(t *testing.T) {
	cases := []struct {
		name   string
		header string
		spec   string // under "spec:"; line 7 for CNP, 6 for CCNP
		field  string
		line   int
		reason string
	}{
		// Unsupported features: refused, naming the field.
		{"kafka rules", cnpHeader, "  endpointSelector: {}\n  ingress:\n  - toPorts:\n    - ports: [{port: '9092'}]\n      rules: {kafka: []}",
			"spec.ingress[0].toPorts[0].rules.kafka", 11, ReasonNotSupported},
		{"l7proto", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '53'}]\n      rules: {l7proto: x, l7: []}",
			"spec.egress[0].toPorts[0].rules.l7proto", 11, ReasonNotSupported},
		{"l7", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '53'}]\n      rules: {l7: []}",
			"spec.egress[0].toPorts[0].rules.l7", 11, ReasonNotSupported},
		{"unknown L7 protocol", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '53'}]\n      rules: {grpc: []}",
			"spec.egress[0].toPorts[0].rules.grpc", 11, ReasonUnknownField},
		{"HTTP rules towards FQDNs", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toFQDNs: [{matchName: a.example}]\n    toPorts:\n    - ports: [{port: '80', protocol: TCP}]\n      rules: {http: [{}]}",
			"spec.egress[0].toFQDNs", 9, "L7 rules towards toFQDNs peers not supported yet"},
		{"toServices", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toServices: []", "spec.egress[0].toServices", 9, ReasonNotSupported},
		{"fromRequires", cnpHeader, "  endpointSelector: {}\n  ingress:\n  - fromRequires: [{}]", "spec.ingress[0].fromRequires", 9, ReasonNotSupported},
		{"toRequires", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toRequires: [{}]", "spec.egress[0].toRequires", 9, ReasonNotSupported},
		// Host policies: only clusterwide, one subject, no proxy.
		{"nodeSelector in a namespaced policy", cnpHeader, "  nodeSelector: {}\n  ingress: [{}]", "spec.nodeSelector", 7, "only a CiliumClusterwideNetworkPolicy may select nodes"},
		{"both selectors", ccnpHeader, "  endpointSelector: {}\n  nodeSelector: {}\n  ingress: [{}]", "spec.nodeSelector", 7, "a rule selects endpoints (endpointSelector) or nodes (nodeSelector), not both"},
		{"L7 rules in a host policy", ccnpHeader, "  ingress:\n  - toPorts:\n    - ports: [{port: '80', protocol: TCP}]\n      rules: {http: [{}]}\n  nodeSelector: {}",
			"spec.ingress[0].toPorts[0].rules", 9, "not supported in a host policy (nodeSelector): the host's connections pass no L7 proxy"},
		{"toFQDNs in a host policy", ccnpHeader, "  nodeSelector: {}\n  egress:\n  - toFQDNs: [{matchName: a.example}]",
			"spec.egress[0].toFQDNs", 8, "not supported in a host policy (nodeSelector): the host's DNS queries pass no DNS proxy"},
		{"serverNames", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '443'}]\n      serverNames: [a.example]",
			"spec.egress[0].toPorts[0].serverNames", 11, ReasonNotSupported},
		{"listener", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - listener: {name: l}", "spec.egress[0].toPorts[0].listener", 10, ReasonNotSupported},
		{"originatingTLS", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - originatingTLS: {}", "spec.egress[0].toPorts[0].originatingTLS", 10, ReasonNotSupported},
		{"terminatingTLS", cnpHeader, "  endpointSelector: {}\n  ingress:\n  - toPorts:\n    - terminatingTLS: {}", "spec.ingress[0].toPorts[0].terminatingTLS", 10, ReasonNotSupported},
		{"auth", cnpHeader, "  endpointSelector: {}\n  egress:\n  - auth: {type: 'null'}", "spec.egress[0].auth", 9, ReasonNotSupported},
		{"authentication", cnpHeader, "  endpointSelector: {}\n  ingress:\n  - authentication: {mode: required}", "spec.ingress[0].authentication", 9, ReasonNotSupported},
		{"toGroups", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toGroups: [{aws: {}}]", "spec.egress[0].toGroups", 9, ReasonNotSupported},
		{"fromGroups", cnpHeader, "  endpointSelector: {}\n  ingress:\n  - fromGroups: [{aws: {}}]", "spec.ingress[0].fromGroups", 9, ReasonNotSupported},
		{"fromNodes", ccnpHeader, "  endpointSelector: {}\n  ingress:\n  - fromNodes: [{}]", "spec.ingress[0].fromNodes", 8, ReasonNotSupported},
		{"toNodes", ccnpHeader, "  endpointSelector: {}\n  egressDeny:\n  - toNodes: [{}]", "spec.egressDeny[0].toNodes", 8, ReasonNotSupported},
		{"cidrGroupSelector", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toCIDRSet:\n    - cidrGroupSelector: {matchLabels: {a: b}}", "spec.egress[0].toCIDRSet[0].cidrGroupSelector", 10, ReasonNotSupported},
		{"except with cidrGroupRef", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toCIDRSet:\n    - cidrGroupRef: g\n      except: [10.0.0.0/8]", "spec.egress[0].toCIDRSet[0].except", 11, "except with cidrGroupRef not supported yet"},
		{"L7 towards a CIDR group", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toCIDRSet:\n    - cidr: 10.0.0.0/8\n    - cidrGroupRef: g\n    toPorts:\n    - ports: [{port: '80', protocol: TCP}]\n      rules: {http: [{}]}",
			"spec.egress[0].toCIDRSet[1].cidrGroupRef", 11, "L7 rules towards a cidrGroupRef peer not supported yet"},
		{"log", cnpHeader, "  endpointSelector: {}\n  log: {value: x}", "spec.log", 8, ReasonNotSupported},
		{"VRRP", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports:\n      - protocol: VRRP", "spec.egress[0].toPorts[0].ports[0].protocol", 11, `"VRRP" not supported yet`},
		{"world-ipv4", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toEntities: [world-ipv4]", "spec.egress[0].toEntities[0]", 9, `"world-ipv4" not supported yet`},
		{"reserved label", cnpHeader, "  endpointSelector: {}\n  ingress:\n  - fromEndpoints: [{matchLabels: {'reserved:host': ''}}]",
			`spec.ingress[0].fromEndpoints[0].matchLabels["reserved:host"]`, 9, "not supported yet (use fromEntities/toEntities)"},

		// Fields that do not exist in a given place.
		{"empty dns rules", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '53'}]\n      rules: {dns: []}",
			"spec.egress[0].toPorts[0].rules.dns", 11, "an empty list is ambiguous"},
		{"dns rules on ingress", cnpHeader, "  endpointSelector: {}\n  ingress:\n  - toPorts:\n    - ports: [{port: '53'}]\n      rules: {dns: [{matchName: a.example}]}",
			"spec.ingress[0].toPorts[0].rules.dns", 11, "DNS rules apply to egress only"},
		{"dns rules on all ports", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '0', protocol: UDP}]\n      rules: {dns: [{matchName: a.example}]}",
			"spec.egress[0].toPorts[0].ports[0].port", 10, "DNS rules need a port"},
		{"dns rules on SCTP", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '53', protocol: SCTP}]\n      rules: {dns: [{matchName: a.example}]}",
			"spec.egress[0].toPorts[0].ports[0].protocol", 10, "DNS rules apply only to UDP and TCP"},
		{"dns and http rules", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '53', protocol: TCP}]\n      rules: {http: [{}], dns: [{matchName: a.example}]}",
			"spec.egress[0].toPorts[0].rules.dns", 11, "cannot be combined on one port"},
		{"bad matchPattern", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toFQDNs: [{matchPattern: 'a.**.example'}]",
			"spec.egress[0].toFQDNs[0].matchPattern", 9, "only allowed as the first label"},
		{"both matchName and matchPattern", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toFQDNs: [{matchName: a.example, matchPattern: '*'}]",
			"spec.egress[0].toFQDNs[0].matchPattern", 9, "cannot both be set"},
		{"empty FQDN selector", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toFQDNs: [{}]",
			"spec.egress[0].toFQDNs[0]", 9, "matchName or matchPattern"},
		{"unknown FQDN selector field", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toFQDNs: [{matchRegex: x}]",
			"spec.egress[0].toFQDNs[0].matchRegex", 9, ReasonUnknownField},
		{"toFQDNs with toEndpoints", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toEndpoints: [{}]\n    toFQDNs: [{matchName: a.example}]",
			"spec.egress[0].toFQDNs", 10, "cannot be combined with other peer fields"},
		{"toFQDNs on ingress", cnpHeader, "  endpointSelector: {}\n  ingress:\n  - toFQDNs: []", "spec.ingress[0].toFQDNs", 9, ReasonUnknownField},
		{"toFQDNs in a deny rule", cnpHeader, "  endpointSelector: {}\n  egressDeny:\n  - toFQDNs: []", "spec.egressDeny[0].toFQDNs", 9, ReasonUnknownField},
		{"fromEndpoints on egress", cnpHeader, "  endpointSelector: {}\n  egress:\n  - fromEndpoints: []", "spec.egress[0].fromEndpoints", 9, ReasonUnknownField},
		{"rules in a deny rule", cnpHeader, "  endpointSelector: {}\n  ingressDeny:\n  - toPorts:\n    - rules: {}", "spec.ingressDeny[0].toPorts[0].rules", 10, ReasonUnknownField},
		{"typo", cnpHeader, "  endpointSelector: {}\n  ingres: []", "spec.ingres", 8, ReasonUnknownField},
		{"status", cnpHeader, "  endpointSelector: {}\nstatus: {}", "status", 8, ReasonUnknownField},

		// Invalid values.
		{"missing endpointSelector", cnpHeader, "  ingress: [{}]", "spec.endpointSelector", 7, ReasonRequired},
		{"null endpointSelector", cnpHeader, "  endpointSelector:\n  ingress: [{}]", "spec.endpointSelector", 7, "must be a selector"},
		{"other namespace in endpointSelector", cnpHeader, "  endpointSelector: {matchLabels: {k8s:io.kubernetes.pod.namespace: y}}",
			"spec.endpointSelector", 7, "cannot select a namespace other than"},
		{"operator", cnpHeader, "  endpointSelector:\n    matchExpressions: [{key: a, operator: equals, values: [b]}]",
			"spec.endpointSelector.matchExpressions[0].operator", 8, "unknown operator"},
		{"unknown label source", cnpHeader, "  endpointSelector: {matchLabels: {'container:a': b}}",
			`spec.endpointSelector.matchLabels["container:a"]`, 7, `label source "container" not supported yet`},
		{"null peer list", cnpHeader, "  endpointSelector: {}\n  ingress:\n  - fromEndpoints:", "spec.ingress[0].fromEndpoints", 9, "must be a list"},
		{"null peer selector", cnpHeader, "  endpointSelector: {}\n  ingress:\n  - fromEndpoints:\n    -", "spec.ingress[0].fromEndpoints[0]", 10, "must be a selector"},
		{"unknown entity", cnpHeader, "  endpointSelector: {}\n  ingress:\n  - fromEntities: [everything]", "spec.ingress[0].fromEntities[0]", 9, `unknown entity "everything"`},
		{"invalid CIDR", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toCIDR: [10.0.0.0/40]", "spec.egress[0].toCIDR[0]", 9, "invalid CIDR"},
		{"cidr and cidrGroupRef", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toCIDRSet:\n    - cidr: 10.0.0.0/8\n      cidrGroupRef: g", "spec.egress[0].toCIDRSet[0].cidrGroupRef", 11, "cannot be combined"},
		{"cidrGroupRef not a name", cnpHeader, "  endpointSelector: {}\n  ingressDeny:\n  - fromCIDRSet:\n    - cidrGroupRef: Bad_Name", "spec.ingressDeny[0].fromCIDRSet[0].cidrGroupRef", 10, `invalid CIDR group name "Bad_Name"`},
		{"cidrGroupRef not a string", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toCIDRSet:\n    - cidrGroupRef: [a]", "spec.egress[0].toCIDRSet[0].cidrGroupRef", 10, "must be a string"},
		{"CIDRSet entry empty", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toCIDRSet:\n    - {}", "spec.egress[0].toCIDRSet[0].cidr", 10, "cidr or cidrGroupRef"},
		{"CIDRSet without length", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toCIDRSet: [{cidr: 10.0.0.1}]", "spec.egress[0].toCIDRSet[0].cidr", 9, "invalid CIDR"},
		{"except outside", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toCIDRSet:\n    - cidr: 10.0.0.0/8\n      except: [11.0.0.0/16]",
			"spec.egress[0].toCIDRSet[0].except[0]", 11, "not inside CIDR"},
		{"except of another family", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toCIDRSet:\n    - cidr: 0.0.0.0/0\n      except: ['::/0']",
			"spec.egress[0].toCIDRSet[0].except[0]", 11, "not inside CIDR"},
		{"port out of range", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '65536'}]", "spec.egress[0].toPorts[0].ports[0].port", 10, "out of range 0-65535"},
		{"negative port", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: -1}]", "spec.egress[0].toPorts[0].ports[0].port", 10, "out of range"},
		{"endPort below port", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '80', endPort: 79}]", "spec.egress[0].toPorts[0].ports[0].endPort", 10, "between port 80"},
		{"endPort with all ports", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '0', endPort: 79}]", "spec.egress[0].toPorts[0].ports[0].endPort", 10, "needs a port"},
		{"endPort with a named port", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: http, endPort: 90}]", "spec.egress[0].toPorts[0].ports[0].endPort", 10, "named port"},
		{"unknown protocol", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '80', protocol: QUIC}]", "spec.egress[0].toPorts[0].ports[0].protocol", 10, `unknown protocol "QUIC"`},
		{"ICMP protocol with a port", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '8', protocol: ICMP}]", "spec.egress[0].toPorts[0].ports[0].port", 10, "use icmps"},
		{"toPorts entry without ports", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts:\n    - {}", "spec.egress[0].toPorts[0].ports", 10, "at least one port"},
		{"icmps with toPorts", cnpHeader, "  endpointSelector: {}\n  egress:\n  - toPorts: [{ports: [{port: '80'}]}]\n    icmps: [{fields: [{type: 8}]}]", "spec.egress[0].icmps", 10, "cannot be combined with toPorts"},
		{"icmp without fields", cnpHeader, "  endpointSelector: {}\n  egress:\n  - icmps: [{}]", "spec.egress[0].icmps[0].fields", 9, "at least one ICMP field"},
		{"icmp without type", cnpHeader, "  endpointSelector: {}\n  egress:\n  - icmps: [{fields: [{family: IPv4}]}]", "spec.egress[0].icmps[0].fields[0].type", 9, ReasonRequired},
		{"icmp type out of range", cnpHeader, "  endpointSelector: {}\n  egress:\n  - icmps: [{fields: [{type: 256}]}]", "spec.egress[0].icmps[0].fields[0].type", 9, "out of range 0-255"},
		{"icmp name of the other family", cnpHeader, "  endpointSelector: {}\n  egress:\n  - icmps: [{fields: [{type: NeighborSolicitation}]}]",
			"spec.egress[0].icmps[0].fields[0].type", 9, `unknown IPv4 ICMP type "NeighborSolicitation"`},
		{"icmp family", cnpHeader, "  endpointSelector: {}\n  egress:\n  - icmps: [{fields: [{type: 8, family: ipv4}]}]", "spec.egress[0].icmps[0].fields[0].family", 9, "unknown family"},
		{"enableDefaultDeny not a boolean", cnpHeader, "  endpointSelector: {}\n  enableDefaultDeny: {ingress: 'yes'}", "spec.enableDefaultDeny.ingress", 8, "must be true or false"},
		{"enableDefaultDeny typo", cnpHeader, "  endpointSelector: {}\n  enableDefaultDeny: {ingres: true}", "spec.enableDefaultDeny.ingres", 8, ReasonUnknownField},
		{"empty specs", cnpHeader, "  endpointSelector: {}\nspecs: []", "specs", 8, "at least one rule"},
		{"rule label without key", cnpHeader, "  endpointSelector: {}\n  labels: [{value: x}]", "spec.labels[0].key", 8, ReasonRequired},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pe := parseErr(t, "c.yaml", c.header+"spec:\n"+c.spec+"\n")
			wantErr(t, pe, c.field, c.line, c.reason)
			if pe.Name != "p" || pe.Document != 1 || pe.Source != "c.yaml" {
				t.Errorf("error context = %+v", pe)
			}
		})
	}
}

func TestCiliumMissingSpec(t *testing.T) {
	pe := parseErr(t, "c.yaml", cnpHeader)
	wantErr(t, pe, "spec", 1, ReasonRequired)
	pe = parseErr(t, "c.yaml", ccnpHeader+"  namespace: x\nspec: {endpointSelector: {}}\n")
	wantErr(t, pe, "metadata.namespace", 5, "clusterwide policy has no namespace")
}

func TestCiliumPortEdgeCases(t *testing.T) {
	pe := parseErr(t, "c.yaml", cnpHeader+"spec:\n  endpointSelector: {}\n  egress:\n  - toPorts:\n    - ports: [{port: '080'}]\n")
	wantErr(t, pe, "spec.egress[0].toPorts[0].ports[0].port", 10, `invalid port "080"`)
	// Exists on the namespace, or the policy's own namespace, is allowed in endpointSelector.
	p := parseOne(t, cnpHeader+`spec:
  endpointSelector:
    matchLabels: {io.kubernetes.pod.namespace: x}
    matchExpressions: [{key: k8s:io.kubernetes.pod.namespace, operator: Exists}]
  ingress: [{}]
`)
	if got := p.Rules[0].Subject.String(); got != "io.kubernetes.pod.namespace=x,io.kubernetes.pod.namespace,io.kubernetes.pod.namespace=x" {
		t.Errorf("subject = %s", got)
	}
	// A byte order mark does not hide the document.
	ps := parse(t, "bom.yaml", "\xef\xbb\xbf"+cnpHeader+"spec: {endpointSelector: {}}\n")
	if len(ps) != 1 {
		t.Errorf("got %d policies from a file with a BOM", len(ps))
	}
}
