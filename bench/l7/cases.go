package l7

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Configuration (case) names, in report order.
const (
	CaseNone   = "no-policy"
	CaseL3     = "l3"
	CaseL4     = "l4"
	CaseL7     = "l7"
	CaseL7Many = "l7-40"
)

// CaseNames lists every configuration in report order.
var CaseNames = []string{CaseNone, CaseL3, CaseL4, CaseL7, CaseL7Many}

// The endpoints live in one Kubernetes-style namespace; policies select them by app label.
const (
	benchNamespace = "bench"
	clientApp      = "bench-client"
	serverApp      = "bench-server"
	// The bystander is a third endpoint no rule allows: probes from it show that the
	// server really enforces the policy.
	bystanderApp = "bench-bystander"
)

// Ports on the server endpoint.
const (
	httpPort   = 8080 // the HTTP server
	closedPort = 8081 // nothing listens: refused when unenforced, dropped when enforced
)

// benchPath is what the load generator requests; the server answers it with 200.
const benchPath = "/v1"

// Probe outcomes (see probeOnce): an HTTP status code as text, or how the attempt failed.
const (
	OutcomeTimeout = "timeout" // no answer to the SYN: dropped by policy
	OutcomeRefused = "refused" // RST to the SYN: reached the host, nothing listening
	OutcomeClosed  = "closed"  // connected, then closed or reset without an HTTP response
)

// probeSpec is an enforcement check run before a case is measured: one HTTP request from
// an endpoint to the server, and the outcomes the case's policy may produce.
type probeSpec struct {
	Name   string
	From   string // "client" or "bystander"
	Method string
	Path   string
	Port   int
	Want   []string // any of these
}

// caseDef is one configuration.
type caseDef struct {
	Name        string
	Description string
	Layer       string // "", "L3", "L4", "L7"
	Rules       int    // rules in the policy (HTTP rules for L7 cases)
	Manifest    []byte // applied before measuring, deleted after; nil: no policy
	L7          bool   // needs the L7 proxy path
	Probes      []probeSpec
}

// fillerRules is how many of the L7 rules of the many-rules case do not match the
// benchmark's request, given the total.
func fillerRules(total int) int { return total - 1 }

// buildCases returns the configurations to run, filtered by names (empty: all), with the
// many-rules case having manyRules HTTP rules.
func buildCases(names []string, manyRules int) ([]caseDef, error) {
	if manyRules < 2 {
		return nil, fmt.Errorf("L7 rule count %d: want at least 2 (fillers, then the matching rule)", manyRules)
	}
	ok200 := func(from string) probeSpec {
		return probeSpec{from + " GET " + benchPath, from, "GET", benchPath, httpPort, []string{"200"}}
	}
	// The bystander's SYN is dropped by the L3 part of every policy (an L7 design that let
	// the proxy answer it with 403 would enforce too; both show the server is protected).
	bystanderDenied := probeSpec{"bystander GET " + benchPath, "bystander", "GET", benchPath, httpPort, []string{OutcomeTimeout}}
	bystanderDeniedL7 := bystanderDenied
	bystanderDeniedL7.Want = []string{OutcomeTimeout, "403"}
	// Without L7 rules the server itself answers unknown paths: 404 shows no proxy
	// filtered the request.
	other404 := probeSpec{"client GET /v2", "client", "GET", "/v2", httpPort, []string{"404"}}
	other403 := probeSpec{"client GET /v2", "client", "GET", "/v2", httpPort, []string{"403"}}
	put403 := probeSpec{"client PUT " + benchPath, "client", "PUT", benchPath, httpPort, []string{"403"}}
	closedRefused := probeSpec{"client closed port", "client", "GET", benchPath, closedPort, []string{OutcomeRefused}}
	closedDropped := probeSpec{"client closed port", "client", "GET", benchPath, closedPort, []string{OutcomeTimeout}}

	many, err := l7ManyPolicy(manyRules)
	if err != nil {
		return nil, err
	}
	all := []caseDef{
		{
			Name: CaseNone, Description: "agent running, no policy: the server does not enforce",
			Probes: []probeSpec{ok200("client"), ok200("bystander"), other404, closedRefused},
		},
		{
			Name: CaseL3, Description: "one L3 rule: ingress from the client's labels, any port",
			Layer: "L3", Rules: 1, Manifest: l3Policy(),
			Probes: []probeSpec{ok200("client"), bystanderDenied, other404, closedRefused},
		},
		{
			Name: CaseL4, Description: fmt.Sprintf("one L4 rule: ingress from the client's labels to TCP %d", httpPort),
			Layer: "L4", Rules: 1, Manifest: l4Policy(),
			Probes: []probeSpec{ok200("client"), bystanderDenied, other404, closedDropped},
		},
		{
			Name: CaseL7, Description: fmt.Sprintf("one L7 rule: the L4 rule with rules.http GET %s", benchPath),
			Layer: "L7", Rules: 1, Manifest: l7Policy(), L7: true,
			Probes: []probeSpec{ok200("client"), bystanderDeniedL7, other403, put403, closedDropped},
		},
		{
			Name: CaseL7Many, Description: fmt.Sprintf("%d L7 rules on the L4 rule: %d that do not match the benchmark's request, then GET %s", manyRules, fillerRules(manyRules), benchPath),
			Layer: "L7", Rules: manyRules, Manifest: many, L7: true,
			Probes: []probeSpec{ok200("client"), bystanderDeniedL7, other403, put403,
				// A request a filler rule allows reaches the server, which answers 404: the
				// fillers are live rules, not dead text.
				{"client GET " + fillerPath(0), "client", "GET", fillerPath(0), httpPort, []string{"404"}}},
		},
	}
	if len(names) == 0 {
		return all, nil
	}
	for _, n := range names {
		if !slices.ContainsFunc(all, func(c caseDef) bool { return c.Name == n }) {
			return nil, fmt.Errorf("unknown configuration %q (have %v)", n, CaseNames)
		}
	}
	var out []caseDef
	for _, c := range all {
		if slices.Contains(names, c.Name) {
			out = append(out, c)
		}
	}
	return out, nil
}

func header(b *bytes.Buffer, name string) {
	b.WriteString(benchkit.CiliumPolicyHead(name, benchNamespace, serverApp))
	fmt.Fprintf(b, `  ingress:
  - fromEndpoints:
    - matchLabels:
        app: %s
`, clientApp)
}

func toPorts(b *bytes.Buffer) {
	fmt.Fprintf(b, "    toPorts:\n    - ports:\n      - port: \"%d\"\n        protocol: TCP\n", httpPort)
}

// l3Policy allows the client (by its labels) to reach the server on any port.
func l3Policy() []byte {
	var b bytes.Buffer
	header(&b, "bench-l3")
	return b.Bytes()
}

// l4Policy allows the client to reach the server's HTTP port only.
func l4Policy() []byte {
	var b bytes.Buffer
	header(&b, "bench-l4")
	toPorts(&b)
	return b.Bytes()
}

// l7Policy is the L4 rule with one HTTP rule: GET /v1.
func l7Policy() []byte {
	var b bytes.Buffer
	header(&b, "bench-l7")
	toPorts(&b)
	fmt.Fprintf(&b, "      rules:\n        http:\n        - method: GET\n          path: %s\n", benchPath)
	return b.Bytes()
}

// fillerPath is the path filler rule i (of shape 0) allows.
func fillerPath(i int) string { return fmt.Sprintf("/v1/filler-%02d", i) }

// l7ManyPolicy is the L4 rule with n HTTP rules: n-1 fillers that do not match the
// benchmark's GET /v1, then GET /v1 last, so a matcher that tries rules in order does all
// the work before it allows a request. The fillers rotate over shapes that make a
// matcher look at every part of the request, not just the first field:
//
//	i%4 == 0: GET, path /v1/filler-NN           (differs in the path's tail)
//	i%4 == 1: POST|DELETE, path /v1             (right path, wrong method)
//	i%4 == 2: GET, path /v1, host fillerNN.example (right method and path, wrong host)
//	i%4 == 3: GET, path /v1, header X-Filler-NN: yes (right method and path, missing header)
func l7ManyPolicy(n int) ([]byte, error) {
	if n < 1 || n > 100 {
		return nil, fmt.Errorf("L7 rule count %d: want 1..100", n)
	}
	var b bytes.Buffer
	header(&b, "bench-l7-many")
	toPorts(&b)
	b.WriteString("      rules:\n        http:\n")
	for i := range fillerRules(n) {
		switch i % 4 {
		case 0:
			fmt.Fprintf(&b, "        - method: GET\n          path: %s\n", fillerPath(i))
		case 1:
			fmt.Fprintf(&b, "        - method: POST|DELETE\n          path: %s\n", benchPath)
		case 2:
			fmt.Fprintf(&b, "        - method: GET\n          path: %s\n          host: filler%02d\\.example\n", benchPath, i)
		case 3:
			fmt.Fprintf(&b, "        - method: GET\n          path: %s\n          headers:\n          - \"X-Filler-%02d: yes\"\n", benchPath, i)
		}
	}
	fmt.Fprintf(&b, "        - method: GET\n          path: %s\n", benchPath)
	return b.Bytes(), nil
}
