package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/tap"
)

func parseTaps(t *testing.T, src string) []*tap.Contract {
	t.Helper()
	docs, err := Parse("taps.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(docs.Policies)+len(docs.CIDRGroups) != 0 {
		t.Fatalf("got %d policies and %d groups besides the taps", len(docs.Policies), len(docs.CIDRGroups))
	}
	return docs.Taps
}

const tapContracts = `
apiVersion: rampart.io/v1alpha1
kind: TapContract
metadata:
  name: web-http
  labels:
    team: security
spec:
  source:
    selector:
      matchLabels:
        app: web
      matchExpressions:
      - {key: tier, operator: In, values: [front, edge]}
    namespaceSelector:
      matchLabels:
        env: prod
  monitor: security/suricata
  match:
    direction: Both
    protocol: TCP
    peerCIDRs: [198.18.0.0/15, 203.0.113.0/24]
    ports: [443, 80, "8000-8080", {port: 9000, endPort: 9010}]
    peerPorts: [{port: 1024, endPort: 65535}]
  action: Redirect
  failMode: Open
---
apiVersion: rampart.io/v1alpha1
kind: TapContract
metadata: {name: db-ping}
spec:
  source: {endpoint: shop/db}
  monitor: ids
  match: {direction: Ingress, protocol: ICMP, icmpType: 8, icmpCode: 0}
  action: Mirror
---
apiVersion: rampart.io/v1alpha1
kind: TapContract
metadata: {name: all-of-web}
spec:
  source: {endpoint: web}
  monitor: security/suricata
  action: mirror
`

func TestParseTapContract(t *testing.T) {
	cs := parseTaps(t, tapContracts)
	if len(cs) != 3 {
		t.Fatalf("got %d contracts, want 3", len(cs))
	}
	web, ping, all := cs[0], cs[1], cs[2]
	if web.Kind != tap.KindTapContract || web.Name != "web-http" || web.Monitor != "security/suricata" || web.Action != tap.Redirect || web.FailMode != tap.FailOpen {
		t.Errorf("web-http: %+v", web)
	}
	if got, want := web.Match.String(), "both TCP ports 80,443,8000-8080,9000-9010 peer-ports 1024-65535 peers 198.18.0.0/15,203.0.113.0/24"; got != want {
		t.Errorf("web-http match %q, want %q", got, want)
	}
	if web.Origin != "taps.yaml: document 1" || len(web.Raw) == 0 {
		t.Errorf("origin %q, raw %d bytes", web.Origin, len(web.Raw))
	}
	// The selector holds the pod labels and the namespace's, as a NetworkPolicy's does.
	for _, tc := range []struct {
		pod, ns labels.Labels
		want    bool
	}{
		{labels.Labels{"app": "web", "tier": "edge"}, labels.Labels{"env": "prod"}, true},
		{labels.Labels{"app": "web", "tier": "edge"}, labels.Labels{"env": "dev"}, false},
		{labels.Labels{"app": "web", "tier": "back"}, labels.Labels{"env": "prod"}, false},
	} {
		full := labels.ForPod("shop", tc.pod, tc.ns, "")
		if got := web.Source.Selector.Matches(full); got != tc.want {
			t.Errorf("selector %v on %v: %v, want %v", web.Source.Selector, full, got, tc.want)
		}
	}
	if ping.Source.Endpoint != "shop/db" || ping.Monitor != "default/ids" || *ping.Match.ICMPType != 8 || *ping.Match.ICMPCode != 0 || ping.Match.Direction != tap.Ingress {
		t.Errorf("db-ping: %+v %v", ping, ping.Match)
	}
	if all.Source.Endpoint != "default/web" || all.Match.Direction != tap.Both || all.Match.Protocol != tap.ProtoAny || all.Action != tap.Mirror {
		t.Errorf("all-of-web: %+v", all)
	}
	// Raw parses back to the same contract.
	again := parseTaps(t, string(web.Raw))
	if len(again) != 1 || again[0].Match.String() != web.Match.String() || again[0].Source.Selector.String() != web.Source.Selector.String() {
		t.Errorf("Raw parsed back to %+v", again)
	}
	if _, err := ParseDocuments("taps.yaml", []byte(tapContracts)); err == nil || !strings.Contains(err.Error(), "a TapContract is not a policy") {
		t.Errorf("ParseDocuments of a tap contract: %v", err)
	}
}

const trafficControls = `
apiVersion: crd.antrea.io/v1alpha2
kind: TrafficControl
metadata:
  name: mirror-web-to-ids
spec:
  appliedTo:
    podSelector:
      matchLabels:
        app: web
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: shop
  direction: Ingress
  action: Mirror
  targetPort:
    ovsInternal:
      name: security/suricata
---
apiVersion: crd.antrea.io/v1alpha2
kind: TrafficControl
metadata:
  name: redirect-db
spec:
  appliedTo:
    podSelector:
      matchLabels: {app: db}
  direction: Both
  action: Redirect
  targetPort:
    device: {name: ips}
  returnPort:
    device: {name: default/ips}
`

func TestParseTrafficControl(t *testing.T) {
	cs := parseTaps(t, trafficControls)
	if len(cs) != 2 {
		t.Fatalf("got %d contracts, want 2", len(cs))
	}
	m, r := cs[0], cs[1]
	if m.Kind != tap.KindTrafficControl || m.Monitor != "security/suricata" || m.Action != tap.Mirror || m.Match.String() != "ingress any" {
		t.Errorf("mirror: %+v (match %v)", m, m.Match)
	}
	if !m.Source.Selector.Matches(labels.ForPod("shop", labels.Labels{"app": "web"}, nil, "")) ||
		m.Source.Selector.Matches(labels.ForPod("other", labels.Labels{"app": "web"}, nil, "")) {
		t.Errorf("mirror's selector %v", m.Source.Selector)
	}
	if r.Monitor != "default/ips" || r.Action != tap.Redirect || r.FailMode != tap.FailClosed || r.Match.Direction != tap.Both {
		t.Errorf("redirect: %+v", r)
	}
	if !r.Source.Selector.Matches(labels.ForPod("any", labels.Labels{"app": "db"}, nil, "")) {
		t.Errorf("a podSelector alone selects pods of every namespace: %v", r.Source.Selector)
	}
}

// Every error names the file, the document, the contract, the field (by the kind's own
// names) and the line; unknown and unsupported fields are refused by name.
func TestParseTapErrors(t *testing.T) {
	const tcHead = "apiVersion: crd.antrea.io/v1alpha2\nkind: TrafficControl\nmetadata: {name: tc}\nspec:\n"
	const tcBody = "  appliedTo: {podSelector: {matchLabels: {app: web}}}\n  direction: Both\n  action: Mirror\n  targetPort: {device: {name: ids}}\n"
	const rpHead = "apiVersion: rampart.io/v1alpha1\nkind: TapContract\nmetadata: {name: t}\nspec:\n  source: {endpoint: web}\n  monitor: ids\n  action: Redirect\n"
	for _, tc := range []struct {
		name, src string
		field     string
		line      int
		reason    string
	}{
		{"unknown spec field", rpHead + "  priority: 3\n", "spec.priority", 8, ReasonUnknownField},
		{"typo in match", rpHead + "  match: {prots: [80]}\n", "spec.match.prots", 8, ReasonUnknownField},
		{"namespace", "apiVersion: rampart.io/v1alpha1\nkind: TapContract\nmetadata: {name: t, namespace: shop}\nspec: {}\n", "metadata.namespace", 3, "cluster-scoped"},
		{"wrong apiVersion", "apiVersion: rampart.io/v1\nkind: TapContract\nmetadata: {name: t}\nspec: {}\n", "apiVersion", 1, "does not serve kind TapContract"},
		{"no monitor", "apiVersion: rampart.io/v1alpha1\nkind: TapContract\nmetadata: {name: t}\nspec:\n  source: {endpoint: web}\n  action: Mirror\n", "spec.monitor", 5, ReasonRequired},
		{"endpoint and selector", "apiVersion: rampart.io/v1alpha1\nkind: TapContract\nmetadata: {name: t}\nspec:\n  source:\n    endpoint: web\n    selector: {matchLabels: {a: b}}\n  monitor: ids\n  action: Mirror\n", "spec.source.selector", 7, "not both"},
		{"ports need a protocol", rpHead + "  match:\n    ports: [80]\n", "spec.match.ports", 9, "need protocol TCP or UDP"},
		{"reversed range", rpHead + "  match:\n    protocol: TCP\n    ports: [\"90-80\"]\n", "spec.match.ports[0]", 10, "ends before it starts"},
		{"endPort below port", rpHead + "  match:\n    protocol: UDP\n    peerPorts: [{port: 90, endPort: 80}]\n", "spec.match.peerPorts[0].endPort", 10, "below port"},
		{"IPv4-mapped peer", rpHead + "  match:\n    peerCIDRs: [\"::ffff:198.18.0.0/112\"]\n", "spec.match.peerCIDRs[0]", 9, "IPv4-mapped"},
		{"ICMP type with UDP", rpHead + "  match:\n    protocol: UDP\n    icmpType: 8\n", "spec.match.icmpType", 10, "needs protocol ICMP"},
		{"bad action", "apiVersion: rampart.io/v1alpha1\nkind: TapContract\nmetadata: {name: t}\nspec:\n  source: {endpoint: web}\n  monitor: ids\n  action: Copy\n", "spec.action", 7, "unknown action"},
		{"fail-open mirror", "apiVersion: rampart.io/v1alpha1\nkind: TapContract\nmetadata: {name: t}\nspec:\n  source: {endpoint: web}\n  monitor: ids\n  action: Mirror\n  failMode: Open\n", "spec.failMode", 8, "redirect only"},
		{"monitor is the source", "apiVersion: rampart.io/v1alpha1\nkind: TapContract\nmetadata: {name: t}\nspec:\n  source: {endpoint: web}\n  monitor: default/web\n  action: Mirror\n", "spec.monitor", 6, "cannot tap itself"},
		{"status", rpHead + "status: {}\n", "status", 8, "has no status"},

		{"TrafficControl groups", tcHead + "  appliedTo: {groups: [g1]}\n  direction: Both\n  action: Mirror\n  targetPort: {device: {name: ids}}\n", "spec.appliedTo.groups", 5, ReasonNotSupported},
		{"TrafficControl geneve target", tcHead + "  appliedTo: {podSelector: {}}\n  direction: Both\n  action: Mirror\n  targetPort:\n    geneve: {remoteIP: 198.18.0.1}\n", "spec.targetPort.geneve", 9, ReasonNotSupported},
		{"TrafficControl erspan target", tcHead + "  appliedTo: {podSelector: {}}\n  direction: Both\n  action: Mirror\n  targetPort: {erspan: {remoteIP: 198.18.0.1, version: 2}}\n", "spec.targetPort.erspan", 8, ReasonNotSupported},
		{"TrafficControl return port for mirror", tcHead + tcBody + "  returnPort: {device: {name: ids}}\n", "spec.returnPort", 9, "Redirect only"},
		{"TrafficControl return port elsewhere", tcHead + "  appliedTo: {podSelector: {}}\n  direction: Both\n  action: Redirect\n  targetPort: {device: {name: ids}}\n  returnPort: {ovsInternal: {name: other}}\n", "spec.returnPort", 9, "must be the target's monitor"},
		{"TrafficControl lower-case direction", tcHead + "  appliedTo: {podSelector: {}}\n  direction: both\n  action: Mirror\n  targetPort: {device: {name: ids}}\n", "spec.direction", 6, "unknown direction"},
		{"TrafficControl no target", tcHead + "  appliedTo: {podSelector: {}}\n  direction: Both\n  action: Mirror\n", "spec.targetPort", 5, ReasonRequired},
		{"TrafficControl empty appliedTo", tcHead + "  appliedTo: {}\n  direction: Both\n  action: Mirror\n  targetPort: {device: {name: ids}}\n", "spec.appliedTo", 5, "give podSelector"},
		{"TrafficControl unknown field", tcHead + tcBody + "  priority: 1\n", "spec.priority", 9, ReasonUnknownField},
		{"TrafficControl unknown port field", tcHead + "  appliedTo: {podSelector: {}}\n  direction: Both\n  action: Mirror\n  targetPort: {device: {name: ids, mtu: 9000}}\n", "spec.targetPort.device.mtu", 8, ReasonUnknownField},
		{"TrafficControl target is a source", tcHead + "  appliedTo: {podSelector: {}}\n  direction: Both\n  action: Mirror\n  targetPort: {device: {name: \"a/b/c\"}}\n", "spec.targetPort.device.name", 8, "want NAMESPACE/NAME"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("taps.yaml", []byte(tc.src))
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse = %v, want a *ParseError", err)
			}
			if pe.Field != tc.field || pe.Line != tc.line || !strings.Contains(pe.Reason, tc.reason) {
				t.Errorf("error %q: field %q line %d; want field %q line %d, reason with %q", err, pe.Field, pe.Line, tc.field, tc.line, tc.reason)
			}
			if !strings.HasPrefix(err.Error(), "taps.yaml: document 1 (") {
				t.Errorf("error %q does not name the file, document and contract", err)
			}
		})
	}
}

// A TrafficControl read as JSON (kubectl get -o json) parses the same.
func TestParseTrafficControlJSON(t *testing.T) {
	src := `{"apiVersion":"crd.antrea.io/v1alpha2","kind":"TrafficControl","metadata":{"name":"j","uid":"1","resourceVersion":"7"},
	"spec":{"appliedTo":{"podSelector":{"matchLabels":{"app":"web"}}},"direction":"Egress","action":"Redirect","targetPort":{"ovsInternal":{"name":"sec/ips"}}}}`
	docs, err := Parse("tc.json", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	c := docs.Taps[0]
	if c.Name != "j" || c.Match.Direction != tap.Egress || c.Monitor != "sec/ips" || c.Action != tap.Redirect {
		t.Errorf("%+v", c)
	}
}
