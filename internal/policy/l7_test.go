package policy

import (
	"reflect"
	"strings"
	"testing"
)

func TestCiliumHTTP(t *testing.T) {
	p := parseOne(t, cnpHeader+`spec:
  endpointSelector: {matchLabels: {app: api}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: web}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}, {port: http, protocol: tcp}]
      rules:
        http:
        - method: GET
          path: "/v1/.*"
        - method: "POST|PUT"
          path: /v1/items
          host: "api\\.example\\.com(:80)?"
          headers: ["X-Token", "X-Mode: read only"]
          headerMatches:
          - name: Content-Type
            value: application/json
          - name: X-Trace
            secret: null
            mismatch: null
        - {}
    - ports: [{port: "8080", protocol: TCP}]
  egress:
  - toPorts:
    - ports: [{port: "443", protocol: TCP}]
      rules:
        HTTP: [{path: /}]
    - ports: [{port: "53", protocol: UDP}]
      rules: {}
`)
	wantRules(t, rules(p), block(
		"  rule 0 spec.ingress[0]: ingress allow default-deny",
		"    subject: app=api,io.kubernetes.pod.namespace=x",
		"    peers:",
		"      endpoints app=web,io.kubernetes.pod.namespace=x",
		"    ports: TCP/80, TCP/http, TCP/8080",
		"    http on TCP/80:",
		`      method "GET" path "/v1/.*"`,
		`      method "POST|PUT" path "/v1/items" host "api\\.example\\.com(:80)?" header x-token header x-mode="read only" header content-type="application/json" header x-trace`,
		"      any request",
		"    http on TCP/http:",
		`      method "GET" path "/v1/.*"`,
		`      method "POST|PUT" path "/v1/items" host "api\\.example\\.com(:80)?" header x-token header x-mode="read only" header content-type="application/json" header x-trace`,
		"      any request",
		"  rule 1 spec.egress[0]: egress allow default-deny",
		"    subject: app=api,io.kubernetes.pod.namespace=x",
		"    peers: all",
		"    ports: TCP/443, UDP/53",
		"    http on TCP/443:",
		`      path "/"`,
	))
	ports := p.Rules[0].Ports
	want := HTTPRule{
		Method: "POST|PUT", Path: "/v1/items", Host: `api\.example\.com(:80)?`,
		Headers: []HeaderMatch{{Name: "x-token"}, {Name: "x-mode", Value: "read only"}, {Name: "content-type", Value: "application/json"}, {Name: "x-trace"}},
	}
	if len(ports) != 3 || len(ports[0].HTTP) != 3 || !reflect.DeepEqual(ports[0].HTTP[1], want) {
		t.Fatalf("ports = %+v", ports)
	}
	if !reflect.DeepEqual(ports[0].HTTP, ports[1].HTTP) || ports[2].HTTP != nil {
		t.Errorf("HTTP rules are not on exactly the ports of their toPorts entry: %+v", ports)
	}
	// The ports share no backing array: changing one port's rules leaves the other's.
	ports[0].HTTP[0].Method = "changed"
	if ports[1].HTTP[0].Method != "GET" {
		t.Error("HTTP rules of two ports share storage")
	}
	if eg := p.Rules[1].Ports; eg[0].HTTP == nil || eg[1].HTTP != nil {
		t.Errorf("egress ports = %+v (rules: {} must not make UDP/53 an L7 port)", eg)
	}
	if !ports[0].HTTP[2].MatchesAll() || ports[0].HTTP[0].MatchesAll() {
		t.Error("MatchesAll is wrong")
	}
	checkRawRoundTrip(t, parseOne(t, string(p.Raw)))
}

func TestCiliumHTTPJSONArray(t *testing.T) {
	p := parse(t, "l7.json", `[{"labels": [{"key": "name", "value": "l7"}], "endpointSelector": {},
  "ingress": [{"toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}],
    "rules": {"HTTP": [{"method": "GET", "headers": ["X-My-Header: true"]}]}}]}]}]`)[0]
	got := p.Rules[0].Ports[0].HTTP
	if !reflect.DeepEqual(got, []HTTPRule{{Method: "GET", Headers: []HeaderMatch{{Name: "x-my-header", Value: "true"}}}}) {
		t.Errorf("HTTP = %+v", got)
	}
	checkRawRoundTrip(t, p)
}

func TestCiliumHTTPErrors(t *testing.T) {
	// Each spec is under "spec:" at line 6, so its first line is line 7.
	const pre = "  endpointSelector: {}\n  ingress:\n  - toPorts:\n" // lines 7-9
	const tcp80 = "    - ports: [{port: '80', protocol: TCP}]\n"     // line 10
	cases := []struct {
		name   string
		spec   string
		field  string
		line   int
		reason string
	}{
		{"protocol omitted", pre + "    - ports: [{port: '80'}]\n      rules: {http: [{}]}",
			"spec.ingress[0].toPorts[0].ports[0]", 10, "protocol defaults to ANY (write protocol: TCP"},
		{"protocol ANY", pre + "    - ports: [{port: '80', protocol: ANY}]\n      rules: {http: [{}]}",
			"spec.ingress[0].toPorts[0].ports[0].protocol", 10, "L7 rules apply only to TCP, and the protocol is ANY"},
		{"protocol UDP", pre + "    - ports:\n      - {port: '80', protocol: TCP}\n      - {port: '81', protocol: UDP}\n      rules: {http: [{}]}",
			"spec.ingress[0].toPorts[0].ports[1].protocol", 12, "the protocol is UDP"},
		{"all ports", pre + "    - ports: [{port: '0', protocol: TCP}]\n      rules: {http: [{}]}",
			"spec.ingress[0].toPorts[0].ports[0].port", 10, "L7 rules need a port"},
		{"no port", pre + "    - ports: [{protocol: TCP}]\n      rules: {http: [{}]}",
			"spec.ingress[0].toPorts[0].ports[0]", 10, "L7 rules need a port"},
		{"port range", pre + "    - ports: [{port: '80', endPort: 90, protocol: TCP}]\n      rules: {http: [{}]}",
			"spec.ingress[0].toPorts[0].ports[0].endPort", 10, "L7 rules on a port range are not supported yet"},
		{"rules before ports", pre + "    - rules: {http: [{}]}\n      ports: [{port: '80', protocol: UDP}]",
			"spec.ingress[0].toPorts[0].ports[0].protocol", 11, "the protocol is UDP"},
		{"bad path regex", pre + tcp80 + "      rules: {http: [{path: '/v1/(.*'}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].path", 11, "invalid regular expression \"/v1/(.*\" (RE2 syntax)"},
		{"bad method regex", pre + tcp80 + "      rules:\n        http:\n        - method: '[GET'",
			"spec.ingress[0].toPorts[0].rules.http[0].method", 13, "invalid regular expression"},
		{"lookahead is not RE2", pre + tcp80 + "      rules: {http: [{host: '(?!evil).*'}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].host", 11, "invalid regular expression"},
		{"method not a string", pre + tcp80 + "      rules: {http: [{method: 5}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].method", 11, "must be a string"},
		{"header without space", pre + tcp80 + "      rules: {http: [{headers: ['X-A:b']}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].headers[0]", 11, `invalid header name "X-A:b"`},
		{"header value with extra space", pre + tcp80 + "      rules: {http: [{headers: ['X-A:  b']}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].headers[0]", 11, "white space at either end"},
		{"header value with a line break", pre + tcp80 + "      rules: {http: [{headers: [\"X-A: b\\r\\nX-B: c\"]}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].headers[0]", 11, "control characters"},
		{"empty header", pre + tcp80 + "      rules: {http: [{headers: ['']}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].headers[0]", 11, "empty header"},
		{"pseudo-header", pre + tcp80 + "      rules: {http: [{headers: [':path /admin']}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].headers[0]", 11, "invalid header name"},
		{"headerMatches without name", pre + tcp80 + "      rules: {http: [{headerMatches: [{value: x}]}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].headerMatches[0].name", 11, ReasonRequired},
		{"headerMatches bad name", pre + tcp80 + "      rules: {http: [{headerMatches: [{name: 'a b'}]}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].headerMatches[0].name", 11, "invalid header name"},
		{"headerMatches bad value", pre + tcp80 + "      rules: {http: [{headerMatches: [{name: a, value: ' b'}]}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].headerMatches[0].value", 11, "white space"},
		{"headerMatches secret", pre + tcp80 + "      rules:\n        http:\n        - headerMatches:\n          - name: token\n            secret: {name: s, namespace: x}",
			"spec.ingress[0].toPorts[0].rules.http[0].headerMatches[0].secret", 15, ReasonNotSupported},
		{"headerMatches mismatch", pre + tcp80 + "      rules: {http: [{headerMatches: [{name: a, value: b, mismatch: LOG}]}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].headerMatches[0].mismatch", 11, ReasonNotSupported},
		{"headerMatches unknown field", pre + tcp80 + "      rules: {http: [{headerMatches: [{name: a, regex: b}]}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].headerMatches[0].regex", 11, ReasonUnknownField},
		{"null headerMatch", pre + tcp80 + "      rules: {http: [{headerMatches: [null]}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].headerMatches[0]", 11, "not null"},
		{"http null", pre + tcp80 + "      rules:\n        http:",
			"spec.ingress[0].toPorts[0].rules.http", 12, "must be a list of HTTP rules"},
		{"http empty", pre + tcp80 + "      rules: {http: []}",
			"spec.ingress[0].toPorts[0].rules.http", 11, "ambiguous"},
		{"null http rule", pre + tcp80 + "      rules: {http: [null]}",
			"spec.ingress[0].toPorts[0].rules.http[0]", 11, "write {} to match every request"},
		{"http and HTTP", pre + tcp80 + "      rules: {http: [{}], HTTP: [{}]}",
			"spec.ingress[0].toPorts[0].rules.HTTP", 11, "duplicate field (http and HTTP are the same field)"},
		{"Http", pre + tcp80 + "      rules: {Http: [{}]}",
			"spec.ingress[0].toPorts[0].rules.Http", 11, "unknown field (field names are case-sensitive; write http)"},
		{"unknown HTTP field", pre + tcp80 + "      rules: {http: [{methods: GET}]}",
			"spec.ingress[0].toPorts[0].rules.http[0].methods", 11, ReasonUnknownField},
		{"kafka after http", pre + tcp80 + "      rules: {http: [{}], kafka: []}",
			"spec.ingress[0].toPorts[0].rules.kafka", 11, ReasonNotSupported},
		{"http in a deny rule", "  endpointSelector: {}\n  egressDeny:\n  - toPorts:\n" + tcp80 + "      rules: {http: [{}]}",
			"spec.egressDeny[0].toPorts[0].rules", 11, ReasonUnknownField},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pe := parseErr(t, "c.yaml", cnpHeader+"spec:\n"+c.spec+"\n")
			wantErr(t, pe, c.field, c.line, c.reason)
		})
	}
}

func TestParseHeaderString(t *testing.T) {
	cases := []struct {
		in   string
		want HeaderMatch
		err  string
	}{
		{"X-Token", HeaderMatch{Name: "x-token"}, ""},
		{"X-My-Header: true", HeaderMatch{Name: "x-my-header", Value: "true"}, ""},
		// Cilium splits at the first space and drops the colon; a space-separated value
		// without a colon is therefore the same.
		{"X-My-Header true", HeaderMatch{Name: "x-my-header", Value: "true"}, ""},
		{"Accept: text/html, application/json", HeaderMatch{Name: "accept", Value: "text/html, application/json"}, ""},
		{"X-A: ", HeaderMatch{Name: "x-a"}, ""}, // an empty value: presence, as in Envoy
		{"X-A:b", HeaderMatch{}, "invalid header name"},
		{"X-A:", HeaderMatch{Name: "x-a"}, ""}, // the colon is dropped: presence
		{"X-A: b ", HeaderMatch{}, "white space"},
		{" X-A", HeaderMatch{}, "empty header name"},
		{"", HeaderMatch{}, "empty header"},
		{"X-A: b\x00", HeaderMatch{}, "control characters"},
		{"Ünicode: x", HeaderMatch{}, "invalid header name"},
	}
	for _, c := range cases {
		got, err := ParseHeaderString(c.in)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ParseHeaderString(%q) error = %v, want %q", c.in, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("ParseHeaderString(%q): %v", c.in, err)
		case c.err == "" && got != c.want:
			t.Errorf("ParseHeaderString(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

func TestCheckL7(t *testing.T) {
	ok := []HTTPRule{{Method: "GET", Path: "/a.*", Headers: []HeaderMatch{{Name: "x-a", Value: "b"}}}}
	cases := []struct {
		pr  PortRule
		err string
	}{
		{PortRule{Protocol: ProtoTCP, Port: 80}, ""},
		{PortRule{Protocol: ProtoTCP, Port: 80, HTTP: ok}, ""},
		{PortRule{Protocol: ProtoTCP, Name: "http", HTTP: ok}, ""},
		{PortRule{Protocol: ProtoTCP, Port: 80, EndPort: 80, HTTP: ok}, ""},
		{PortRule{Protocol: ProtoAny, Port: 80, HTTP: ok}, "only TCP"},
		{PortRule{Protocol: ProtoUDP, Port: 80, HTTP: ok}, "only TCP"},
		{PortRule{Protocol: ProtoICMP, Port: 8, ICMPType: true, HTTP: ok}, "only TCP"},
		{PortRule{Protocol: ProtoTCP, HTTP: ok}, "need one port"},
		{PortRule{Protocol: ProtoTCP, Port: 80, EndPort: 81, HTTP: ok}, "port range"},
		{PortRule{Protocol: ProtoTCP, Port: 80, HTTP: []HTTPRule{}}, "no HTTP rule"},
		{PortRule{Protocol: ProtoTCP, Port: 80, HTTP: []HTTPRule{{Path: "("}}}, "path: invalid regular expression"},
		{PortRule{Protocol: ProtoTCP, Port: 80, HTTP: []HTTPRule{{Headers: []HeaderMatch{{Name: "X-A"}}}}}, "not in lower case"},
		{PortRule{Protocol: ProtoTCP, Port: 80, HTTP: []HTTPRule{{Headers: []HeaderMatch{{Name: "x a"}}}}}, "invalid header name"},
		{PortRule{Protocol: ProtoTCP, Port: 80, HTTP: []HTTPRule{{Headers: []HeaderMatch{{Name: "x", Value: "a\nb"}}}}}, "control characters"},
	}
	for _, c := range cases {
		err := c.pr.CheckL7()
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("CheckL7(%+v) = %v, want %q", c.pr, err, c.err)
		}
	}
}

func TestHTTPRuleEqual(t *testing.T) {
	a := HTTPRule{Method: "GET", Headers: []HeaderMatch{{Name: "a"}, {Name: "b", Value: "c"}}}
	b := HTTPRule{Method: "GET", Headers: []HeaderMatch{{Name: "a"}, {Name: "b", Value: "c"}}}
	if !a.Equal(b) {
		t.Error("equal rules differ")
	}
	b.Headers[1].Value = "d"
	if a.Equal(b) || a.Equal(HTTPRule{Method: "GET"}) || a.Equal(HTTPRule{Method: "POST", Headers: a.Headers}) {
		t.Error("different rules are equal")
	}
}
