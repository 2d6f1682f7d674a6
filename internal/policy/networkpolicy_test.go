package policy

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/labels"
)

const npHeader = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: p
  namespace: x
`

func TestNetworkPolicySubjectAndPeers(t *testing.T) {
	p := parseOne(t, npHeader+`spec:
  podSelector:
    matchLabels:
      app: web
    matchExpressions:
    - {key: tier, operator: NotIn, values: [db, cache]}
  ingress:
  - from:
    - podSelector: {matchLabels: {pod: a}}
    - namespaceSelector: {matchLabels: {ns: y}}
    - namespaceSelector: {matchExpressions: [{key: team, operator: Exists}]}
      podSelector: {matchLabels: {pod: b}}
    - ipBlock:
        cidr: 198.18.0.0/16
        except: [198.18.1.0/24, 198.18.2.7/32]
    - namespaceSelector: {}
`)
	if p.Kind != KindNetworkPolicy || p.Namespace != "x" || p.Name != "p" || p.Key() != "NetworkPolicy/x/p" {
		t.Errorf("policy identity = %s %s/%s", p.Kind, p.Namespace, p.Name)
	}
	if p.Source != "test.yaml: document 1" {
		t.Errorf("Source = %q", p.Source)
	}
	wantRules(t, rules(p), block(
		"  rule 0 spec.ingress[0]: ingress allow default-deny",
		"    subject: app=web,tier notin (cache,db),io.kubernetes.pod.namespace=x",
		"    peers:",
		// podSelector alone: pods of the policy's namespace.
		"      endpoints pod=a,io.kubernetes.pod.namespace=x",
		// namespaceSelector alone: every pod of the selected namespaces.
		"      endpoints io.cilium.k8s.namespace.labels.ns=y,io.kubernetes.pod.namespace",
		// both in one peer: AND.
		"      endpoints pod=b,io.cilium.k8s.namespace.labels.team,io.kubernetes.pod.namespace",
		"      cidr 198.18.0.0/16 except 198.18.1.0/24,198.18.2.7/32",
		// empty namespaceSelector: every pod of every namespace (but not reserved identities).
		"      endpoints io.kubernetes.pod.namespace",
		"    ports: all",
	))

	// Check the selectors behave, not only how they print.
	peers := p.Rules[0].Peers
	podB := labels.Labels{"pod": "b", labels.KeyNamespace: "y", labels.KeyNamespaceLabelPrefix + "team": "blue"}
	podBNoTeam := labels.Labels{"pod": "b", labels.KeyNamespace: "y"}
	if !peers[2].Selector.Matches(podB) || peers[2].Selector.Matches(podBNoTeam) {
		t.Error("podSelector AND namespaceSelector peer matches wrongly")
	}
	host := labels.Labels{"reserved:host": ""}
	if peers[4].Selector.Matches(host) {
		t.Error("empty namespaceSelector must not match an identity without a namespace")
	}
	if !p.Rules[0].Subject.Matches(labels.Labels{"app": "web", labels.KeyNamespace: "x"}) ||
		p.Rules[0].Subject.Matches(labels.Labels{"app": "web", labels.KeyNamespace: "y"}) ||
		p.Rules[0].Subject.Matches(labels.Labels{"app": "web", "tier": "db", labels.KeyNamespace: "x"}) {
		t.Error("subject must be podSelector within the policy namespace")
	}
	if got := peers[3].CIDR; got != netip.MustParsePrefix("198.18.0.0/16") {
		t.Errorf("ipBlock CIDR = %v", got)
	}
}

func TestNetworkPolicyDefaultNamespace(t *testing.T) {
	p := parseOne(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
description: informational
metadata: {name: p, description: informational}
spec: {podSelector: {}, description: informational}
`)
	if p.Namespace != "default" {
		t.Errorf("Namespace = %q, want default", p.Namespace)
	}
	wantRules(t, rules(p), block(
		"  rule 0 spec: ingress allow default-deny",
		"    subject: io.kubernetes.pod.namespace=default",
		"    peers: none",
		"    ports: all",
	))
}

func TestNetworkPolicyTypes(t *testing.T) {
	egressRule := `
  egress:
  - to: [{podSelector: {}}]`
	ingressRule := `
  ingress:
  - {}`
	cases := []struct {
		name, spec string
		want       []string // direction and peers of each rule, in order
	}{
		{"no types, no rules: ingress isolation", ``, []string{"ingress none"}},
		{"no types, ingress rule", ingressRule, []string{"ingress all"}},
		{"no types, egress rule: both directions", egressRule, []string{"ingress none", "egress endpoints"}},
		{"no types, empty egress list: ingress only", "\n  egress: []", []string{"ingress none"}},
		{"empty types list is defaulted", "\n  policyTypes: []" + egressRule, []string{"ingress none", "egress endpoints"}},
		{"egress only: ingress rules have no effect", "\n  policyTypes: [Egress]" + ingressRule, []string{"egress none"}},
		{"both, no rules", "\n  policyTypes: [Egress, Ingress]", []string{"ingress none", "egress none"}},
		{"ingress only with egress rules", "\n  policyTypes: [Ingress]" + egressRule, []string{"ingress none"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := parseOne(t, npHeader+"spec:\n  podSelector: {}"+c.spec+"\n")
			var got []string
			for _, r := range p.Rules {
				if !r.EnableDefaultDeny || r.Deny {
					t.Errorf("rule %s: every NetworkPolicy rule enforces its direction and allows", r.Description)
				}
				peers := "none"
				switch {
				case r.AllPeers:
					peers = "all"
				case len(r.Peers) > 0:
					peers = "endpoints"
				}
				got = append(got, r.Direction.String()+" "+peers)
			}
			if len(got) != len(c.want) {
				t.Fatalf("rules = %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("rules = %v, want %v", got, c.want)
				}
			}
		})
	}
}

func TestNetworkPolicyPorts(t *testing.T) {
	p := parseOne(t, npHeader+`spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - ports:
    - port: 53
      protocol: UDP
    - port: 53
    - port: dns-tcp
    - {protocol: SCTP}
    - port: 32000
      endPort: 32768
    - port: 80
      endPort: 80
  - to: []
    ports: []
`)
	wantRules(t, rules(p), block(
		"  rule 0 spec.egress[0]: egress allow default-deny",
		"    subject: io.kubernetes.pod.namespace=x",
		"    peers: all",
		"    ports: UDP/53, TCP/53, TCP/dns-tcp, SCTP/all, TCP/32000-32768, TCP/80",
		"  rule 1 spec.egress[1]: egress allow default-deny",
		"    subject: io.kubernetes.pod.namespace=x",
		"    peers: all",
		"    ports: all",
	))
}

func TestNetworkPolicyErrors(t *testing.T) {
	cases := []struct {
		name   string
		spec   string // YAML under "spec:", starting on line 7
		field  string
		line   int
		reason string
	}{
		{"unknown spec field", "  podSelector: {}\n  ingres: []", "spec.ingres", 8, ReasonUnknownField},
		{"unknown rule field", "  podSelector: {}\n  ingress:\n  - fromm: []", "spec.ingress[0].fromm", 9, ReasonUnknownField},
		{"to in an ingress rule", "  podSelector: {}\n  ingress:\n  - to: []", "spec.ingress[0].to", 9, ReasonUnknownField},
		{"unknown selector field", "  podSelector: {}\n  ingress:\n  - from:\n    - podSelector: {}\n    - podSelector:\n        matchLabelz: {a: b}",
			"spec.ingress[0].from[1].podSelector.matchLabelz", 12, ReasonUnknownField},
		{"missing podSelector", "  ingress: []", "spec.podSelector", 7, ReasonRequired},
		{"bad policy type", "  podSelector: {}\n  policyTypes: [ingress]", "spec.policyTypes[0]", 8, "unknown policy type"},
		{"bad operator", "  podSelector:\n    matchExpressions:\n    - {key: a, operator: Equals, values: [b]}",
			"spec.podSelector.matchExpressions[0].operator", 9, "unknown operator"},
		{"lowercase operator is Cilium-only", "  podSelector:\n    matchExpressions:\n    - {key: a, operator: in, values: [b]}",
			"spec.podSelector.matchExpressions[0].operator", 9, "unknown operator"},
		{"In without values", "  podSelector:\n    matchExpressions:\n    - key: a\n      operator: In",
			"spec.podSelector.matchExpressions[0].values", 9, "at least one value"},
		{"In with empty values", "  podSelector:\n    matchExpressions:\n    - key: a\n      operator: In\n      values: []",
			"spec.podSelector.matchExpressions[0].values", 11, "at least one value"},
		{"Exists with values", "  podSelector:\n    matchExpressions:\n    - {key: a, operator: Exists, values: [b]}",
			"spec.podSelector.matchExpressions[0].values", 9, "takes no values"},
		{"expression without key", "  podSelector:\n    matchExpressions:\n    - {operator: Exists}",
			"spec.podSelector.matchExpressions[0].key", 9, ReasonRequired},
		{"invalid label key", "  podSelector:\n    matchLabels: {'bad key': x}", `spec.podSelector.matchLabels["bad key"]`, 8, "invalid label key"},
		{"Cilium prefix in a Kubernetes selector", "  podSelector:\n    matchLabels: {'k8s:app': x}", `spec.podSelector.matchLabels["k8s:app"]`, 8, "invalid label key"},
		{"invalid label value", "  podSelector:\n    matchLabels: {app: 'a b'}", "spec.podSelector.matchLabels.app", 8, "invalid label value"},
		{"unquoted boolean label value", "  podSelector:\n    matchLabels: {access: true}", "spec.podSelector.matchLabels.access", 8, "must be a string"},
		{"empty peer", "  podSelector: {}\n  ingress:\n  - from:\n    - {}", "spec.ingress[0].from[0]", 10, "needs podSelector, namespaceSelector or ipBlock"},
		{"null selectors count as absent", "  podSelector: {}\n  ingress:\n  - from:\n    - podSelector:", "spec.ingress[0].from[0]", 10, "needs podSelector"},
		{"ipBlock with a selector", "  podSelector: {}\n  ingress:\n  - from:\n    - podSelector: {}\n      ipBlock: {cidr: 10.0.0.0/8}",
			"spec.ingress[0].from[0].ipBlock", 11, "cannot be combined"},
		{"ipBlock without cidr", "  podSelector: {}\n  ingress:\n  - from:\n    - ipBlock: {except: [10.0.0.0/9]}",
			"spec.ingress[0].from[0].ipBlock.cidr", 10, ReasonRequired},
		{"invalid CIDR", "  podSelector: {}\n  ingress:\n  - from:\n    - ipBlock: {cidr: 10.0.0.0/33}",
			"spec.ingress[0].from[0].ipBlock.cidr", 10, "invalid CIDR"},
		{"CIDR without length", "  podSelector: {}\n  ingress:\n  - from:\n    - ipBlock: {cidr: 10.0.0.1}",
			"spec.ingress[0].from[0].ipBlock.cidr", 10, "invalid CIDR"},
		{"except outside CIDR", "  podSelector: {}\n  ingress:\n  - from:\n    - ipBlock:\n        cidr: 10.0.0.0/16\n        except:\n        - 10.0.1.0/24\n        - 10.1.0.0/24",
			"spec.ingress[0].from[0].ipBlock.except[1]", 14, "not inside CIDR"},
		{"except equal to CIDR", "  podSelector: {}\n  ingress:\n  - from:\n    - ipBlock: {cidr: 10.0.0.0/16, except: [10.0.0.0/16]}",
			"spec.ingress[0].from[0].ipBlock.except[0]", 10, "not inside CIDR"},
		{"except wider than CIDR", "  podSelector: {}\n  ingress:\n  - from:\n    - ipBlock: {cidr: 10.0.0.0/16, except: [10.0.0.0/8]}",
			"spec.ingress[0].from[0].ipBlock.except[0]", 10, "not inside CIDR"},
		{"port 0", "  podSelector: {}\n  ingress:\n  - ports: [{port: 0}]", "spec.ingress[0].ports[0].port", 9, "out of range 1-65535"},
		{"port too big", "  podSelector: {}\n  ingress:\n  - ports:\n    - port: 65536", "spec.ingress[0].ports[0].port", 10, "out of range"},
		{"quoted number", "  podSelector: {}\n  ingress:\n  - ports:\n    - port: '80'", "spec.ingress[0].ports[0].port", 10, "write the number unquoted"},
		{"bad port name", "  podSelector: {}\n  ingress:\n  - ports:\n    - port: Web_Port", "spec.ingress[0].ports[0].port", 10, "invalid port name"},
		{"endPort below port", "  podSelector: {}\n  ingress:\n  - ports:\n    - port: 81\n      endPort: 80", "spec.ingress[0].ports[0].endPort", 11, "between port 81 and 65535"},
		{"endPort too big", "  podSelector: {}\n  ingress:\n  - ports:\n    - port: 81\n      endPort: 65536", "spec.ingress[0].ports[0].endPort", 11, "between port"},
		{"endPort with named port", "  podSelector: {}\n  ingress:\n  - ports:\n    - port: http\n      endPort: 90", "spec.ingress[0].ports[0].endPort", 11, "named port"},
		{"endPort without port", "  podSelector: {}\n  ingress:\n  - ports:\n    - endPort: 90", "spec.ingress[0].ports[0].endPort", 10, "needs a port"},
		{"ICMP is not a NetworkPolicy protocol", "  podSelector: {}\n  ingress:\n  - ports:\n    - protocol: ICMP", "spec.ingress[0].ports[0].protocol", 10, `unsupported protocol "ICMP"`},
		{"lowercase protocol", "  podSelector: {}\n  ingress:\n  - ports:\n    - protocol: tcp", "spec.ingress[0].ports[0].protocol", 10, "unsupported protocol"},
		{"spec description must be a string", "  podSelector: {}\n  description: [x]", "spec.description", 8, "must be a string"},
		{"duplicate field", "  podSelector: {}\n  podSelector: {}", "spec.podSelector", 8, "duplicate field"},
		{"ingress not a list", "  podSelector: {}\n  ingress: {}", "spec.ingress", 8, "must be a list"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pe := parseErr(t, "np.yaml", npHeader+"spec:\n"+c.spec+"\n")
			wantErr(t, pe, c.field, c.line, c.reason)
			if pe.Kind != KindNetworkPolicy || pe.Namespace != "x" || pe.Name != "p" || pe.Document != 1 || pe.Source != "np.yaml" {
				t.Errorf("error context = %+v", pe)
			}
		})
	}
}

func TestParseErrorMessage(t *testing.T) {
	src := `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec: {podSelector: {}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-web
  namespace: x
spec:
  podSelector: {}
  ingress:
  - fromm: []
`
	pe := parseErr(t, "policies.yaml", src)
	want := "policies.yaml: document 2 (NetworkPolicy x/allow-web): spec.ingress[0].fromm (line 14): unknown field"
	if pe.Error() != want {
		t.Errorf("Error() =\n  %s\nwant\n  %s", pe.Error(), want)
	}
	cases := []struct {
		e    ParseError
		want string
	}{
		{ParseError{Source: "-", Document: 1, Line: 3, Reason: "invalid YAML: x"}, "-: document 1 (line 3): invalid YAML: x"},
		{ParseError{Source: "a.yaml", Reason: "r"}, "a.yaml: r"},
		{ParseError{Source: "a.yaml", Document: 2, Kind: KindCiliumClusterwidePolicy, Name: "n", Field: "spec", Line: 4, Reason: "r"},
			"a.yaml: document 2 (CiliumClusterwideNetworkPolicy n): spec (line 4): r"},
		{ParseError{Source: "a.yaml", Document: 1, Kind: "Foo", Field: "kind", Reason: "r"}, "a.yaml: document 1 (Foo): kind: r"},
	}
	for _, c := range cases {
		if got := c.e.Error(); got != c.want {
			t.Errorf("Error() = %q, want %q", got, c.want)
		}
	}
}
