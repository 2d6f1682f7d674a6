package l7

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/policy"
)

// request is what a matcher sees of an HTTP request.
type request struct{ method, path, host, header string }

// matches evaluates an HTTP rule as Cilium defines it: method, path and host are regular
// expressions matched against the whole value; every header must be present (with its
// value, if given).
func matches(t *testing.T, h policy.HTTPRule, r request) bool {
	t.Helper()
	full := func(re, v string) bool {
		if re == "" {
			return true
		}
		return regexp.MustCompile("^(?:" + re + ")$").MatchString(v)
	}
	if !full(h.Method, r.method) || !full(h.Path, r.path) || !full(h.Host, r.host) {
		return false
	}
	for _, hm := range h.Headers {
		name, value, _ := strings.Cut(r.header, ": ")
		if !strings.EqualFold(name, hm.Name) || (hm.Value != "" && value != hm.Value) {
			return false
		}
	}
	return true
}

// TestManifests parses every configuration's policy with the parser rampartd uses and
// checks it says what the configuration claims: the L3 rule any port, the L4 rule the
// HTTP port, the L7 rules GET /v1 (the many-rules case: fillers first, none of which allows
// the benchmark's request, and the matching rule last).
func TestManifests(t *testing.T) {
	cases, err := buildCases(nil, 40)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cases {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, CaseNames) {
		t.Fatalf("configurations %v, want %v", names, CaseNames)
	}
	bench := request{"GET", benchPath, "198.18.1.11:8080", ""}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.Manifest == nil {
				if c.Name != CaseNone || c.Rules != 0 {
					t.Fatalf("%s has no policy", c.Name)
				}
				return
			}
			ps, err := policy.ParseDocuments(c.Name+".yaml", c.Manifest)
			if err != nil {
				t.Fatalf("parsing: %v\n%s", err, c.Manifest)
			}
			if len(ps) != 1 || len(ps[0].Rules) != 1 {
				t.Fatalf("want one policy with one rule, got %d policies", len(ps))
			}
			r := ps[0].Rules[0]
			if r.Direction != policy.Ingress || r.Deny || len(r.Peers) != 1 || r.Peers[0].Kind != policy.PeerEndpoints {
				t.Errorf("rule %s: want an ingress allow from one endpoint selector", policy.FormatRule(r))
			}
			if !r.Subject.Matches(map[string]string{"app": serverApp, "io.kubernetes.pod.namespace": benchNamespace}) ||
				!r.Peers[0].Selector.Matches(map[string]string{"app": clientApp, "io.kubernetes.pod.namespace": benchNamespace}) ||
				r.Peers[0].Selector.Matches(map[string]string{"app": bystanderApp, "io.kubernetes.pod.namespace": benchNamespace}) {
				t.Errorf("rule %s does not select the server from the client only", policy.FormatRule(r))
			}
			if c.Layer == "L3" {
				if len(r.Ports) != 0 {
					t.Errorf("L3 rule has ports %v", r.Ports)
				}
				return
			}
			if len(r.Ports) != 1 || r.Ports[0].Port != httpPort || r.Ports[0].Protocol != policy.ProtoTCP || r.Ports[0].EndPort != 0 {
				t.Fatalf("ports %+v, want TCP %d", r.Ports, httpPort)
			}
			http := r.Ports[0].HTTP
			if !c.L7 {
				if http != nil {
					t.Errorf("L4 rule has HTTP rules %v", http)
				}
				return
			}
			if len(http) != c.Rules {
				t.Fatalf("%d HTTP rules, want %d", len(http), c.Rules)
			}
			for i, h := range http {
				last := i == len(http)-1
				if got := matches(t, h, bench); got != last {
					t.Errorf("HTTP rule %d (%s) matches GET %s: %v, want %v", i, policy.FormatHTTPRule(h), benchPath, got, last)
				}
				for _, other := range []request{{"PUT", benchPath, bench.host, ""}, {"GET", "/v2", bench.host, ""}} {
					if matches(t, h, other) {
						t.Errorf("HTTP rule %d (%s) allows %s %s, which the probes expect to be denied", i, policy.FormatHTTPRule(h), other.method, other.path)
					}
				}
			}
			if c.Rules > 1 {
				// The filler probe's request is allowed by filler 0 only.
				f := request{"GET", fillerPath(0), bench.host, ""}
				if !matches(t, http[0], f) || slices.ContainsFunc(http[1:], func(h policy.HTTPRule) bool { return matches(t, h, f) }) {
					t.Errorf("GET %s should be allowed by filler 0 alone", fillerPath(0))
				}
				// Every filler shape is there, and each one is live: a request made for it
				// passes that rule.
				for i := range 4 {
					h := http[i]
					r := bench
					switch i {
					case 0:
						r.path = fillerPath(0)
					case 1:
						r.method = "POST"
					case 2:
						r.host = "filler02.example"
					case 3:
						r.header = "X-Filler-03: yes"
					}
					if !matches(t, h, r) {
						t.Errorf("filler %d (%s) does not allow the request %+v made for it", i, policy.FormatHTTPRule(h), r)
					}
				}
			}
		})
	}
}

func TestBuildCasesFilter(t *testing.T) {
	cs, err := buildCases([]string{CaseL7, CaseNone}, 40)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].Name != CaseNone || cs[1].Name != CaseL7 {
		t.Errorf("filtered cases not in report order: %v", cs)
	}
	if _, err := buildCases([]string{"l5"}, 40); err == nil {
		t.Error("unknown configuration accepted")
	}
	if _, err := buildCases(nil, 1); err == nil {
		t.Error("a many-rules case with one rule accepted")
	}
	cs, err = buildCases([]string{CaseL7Many}, 7)
	if err != nil || cs[0].Rules != 7 || strings.Count(string(cs[0].Manifest), "- method:") != 7 {
		t.Errorf("7 rules: %v %v", err, cs)
	}
}
