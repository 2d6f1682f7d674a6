package applylatency

import (
	"bytes"
	"fmt"
	"net/netip"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// The benchmark's endpoints share one namespace so NetworkPolicy podSelectors reach them.
const (
	benchNamespace = "bench"
	clientApp      = "bench-client"
	serverApp      = "bench-server"
	// The bystander is a third endpoint: filler rules name it, so they produce map entries
	// for a real identity other than the client's.
	bystanderApp = "bench-bystander"
	// policyName is the one policy the benchmark applies and replaces.
	policyName = "bench-apply"
)

// Ports on the server endpoint.
const (
	// NewPort is admitted only by the last rule of the large policy.
	NewPort = 5201
	// OldPort is admitted only by the small policy the large one replaces.
	OldPort = 5202
	// fillerPortBase is the first port of the filler rules, far from the probed ports.
	fillerPortBase = 10000
)

// fillerCIDR holds the /32 peers of the address-based filler rules: in the benchmarking
// range, outside every pod range the benchmark uses, never a real host.
var fillerCIDR = netip.MustParsePrefix("198.19.128.0/17")

// MaxRules bounds the rule count: filler i uses ports fillerPortBase+4i and +4i+2.
const MaxRules = (65535 - fillerPortBase) / 4

// Format is how the benchmark writes the policy document.
type Format string

const (
	// YAML, as a user writes a manifest for rampart apply.
	YAML Format = "yaml"
	// JSON, as kubectl sends policy objects and as the agent stores the versions it
	// accepted.
	JSON Format = "json"
)

// ruleSpec is one ingress rule: a peer (an app label, or a /32) and TCP ports.
type ruleSpec struct {
	app   string
	cidr  netip.Prefix
	ports []int
}

// document renders rules as one NetworkPolicy named policyName selecting the server.
func document(rules []ruleSpec, f Format) []byte {
	var b bytes.Buffer
	b.Grow(len(rules) * 130)
	if f == JSON {
		fmt.Fprintf(&b, `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":%q,"namespace":%q},`+
			`"spec":{"podSelector":{"matchLabels":{"app":%q}},"policyTypes":["Ingress"],"ingress":[`, policyName, benchNamespace, serverApp)
		for i, r := range rules {
			if i > 0 {
				b.WriteByte(',')
			}
			if r.cidr.IsValid() {
				fmt.Fprintf(&b, `{"from":[{"ipBlock":{"cidr":%q}}],"ports":[`, r.cidr.String())
			} else {
				fmt.Fprintf(&b, `{"from":[{"podSelector":{"matchLabels":{"app":%q}}}],"ports":[`, r.app)
			}
			for j, p := range r.ports {
				if j > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `{"protocol":"TCP","port":%d}`, p)
			}
			b.WriteString("]}")
		}
		b.WriteString("]}}\n")
		return b.Bytes()
	}
	benchkit.NetworkPolicyHead(&b, policyName, benchNamespace, serverApp)
	b.WriteString("  ingress:\n")
	for _, r := range rules {
		b.WriteString("  - from:\n")
		if r.cidr.IsValid() {
			fmt.Fprintf(&b, "    - ipBlock:\n        cidr: %s\n", r.cidr)
		} else {
			fmt.Fprintf(&b, "    - podSelector:\n        matchLabels:\n          app: %s\n", r.app)
		}
		b.WriteString("    ports:\n")
		for _, p := range r.ports {
			fmt.Fprintf(&b, "    - protocol: TCP\n      port: %d\n", p)
		}
	}
	return b.Bytes()
}

// OldPolicy is the one-rule policy the measured apply replaces: the client may reach the
// server on OldPort only.
func OldPolicy(f Format) []byte {
	return document([]ruleSpec{{app: clientApp, ports: []int{OldPort}}}, f)
}

// LargePolicy is one NetworkPolicy (the same name as OldPolicy, so applying it replaces
// that one) with n ingress rules selecting the server: n-1 fillers that admit none of the
// probed flows, then the rule that admits the client on NewPort. Filler i rotates over
// three peers, each admitted on ports from fillerPortBase+4i:
//
//	i%3 == 0: the client's labels, TCP ports +4i and +4i+2
//	i%3 == 1: the bystander's labels, TCP ports +4i and +4i+2
//	i%3 == 2: one /32 of fillerCIDR (a CIDR identity of its own, and an ipcache entry),
//	          TCP port +4i
//
// Ports of one peer are two or more apart, so they never merge into one port prefix.
// Each filler yields two policy map entries of the server (the CIDR peer's one port also
// two: its entry is written for two forms of the /32's identity): 10,000 rules compute to
// 19,999 entries, and
// with the agent's entry for the host (--host-traffic=allow) the server's map holds
// 20,000, the "10,000-rule policy, 20,000 map entries" (checked by the tests).
func LargePolicy(n int, f Format) ([]byte, error) {
	if n < 1 || n > MaxRules {
		return nil, fmt.Errorf("rule count %d: want 1..%d", n, MaxRules)
	}
	rules := make([]ruleSpec, 0, n)
	base := fillerCIDR.Addr()
	for i := range n - 1 {
		port := fillerPortBase + 4*i
		switch i % 3 {
		case 0:
			rules = append(rules, ruleSpec{app: clientApp, ports: []int{port, port + 2}})
		case 1:
			rules = append(rules, ruleSpec{app: bystanderApp, ports: []int{port, port + 2}})
		case 2:
			rules = append(rules, ruleSpec{cidr: netip.PrefixFrom(benchkit.AddAddr(base, uint32(i)), 32), ports: []int{port}})
		}
	}
	rules = append(rules, ruleSpec{app: clientApp, ports: []int{NewPort}})
	return document(rules, f), nil
}
