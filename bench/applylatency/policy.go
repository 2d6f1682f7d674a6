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

func header(b *bytes.Buffer) {
	fmt.Fprintf(b, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: %s
  namespace: %s
spec:
  podSelector:
    matchLabels:
      app: %s
  policyTypes: [Ingress]
  ingress:
`, policyName, benchNamespace, serverApp)
}

func rule(b *bytes.Buffer, from string, ports ...int) {
	b.WriteString("  - from:\n")
	b.WriteString(from)
	b.WriteString("    ports:\n")
	for _, p := range ports {
		fmt.Fprintf(b, "    - protocol: TCP\n      port: %d\n", p)
	}
}

func podPeer(app string) string {
	return fmt.Sprintf("    - podSelector:\n        matchLabels:\n          app: %s\n", app)
}

// OldPolicy is the one-rule policy the measured apply replaces: the client may reach the
// server on OldPort only.
func OldPolicy() []byte {
	var b bytes.Buffer
	header(&b)
	rule(&b, podPeer(clientApp), OldPort)
	return b.Bytes()
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
// Each filler yields two policy map entries of the server (a CIDR peer one for the /32
// and one for the world identity's part of it): 10,000 rules give about 20,000 entries,
// the "10,000-rule policy, 20,000 map entries" (see the test).
func LargePolicy(n int) ([]byte, error) {
	if n < 1 || n > MaxRules {
		return nil, fmt.Errorf("rule count %d: want 1..%d", n, MaxRules)
	}
	var b bytes.Buffer
	b.Grow(n * 120)
	header(&b)
	base := fillerCIDR.Addr()
	for i := range n - 1 {
		port := fillerPortBase + 4*i
		switch i % 3 {
		case 0:
			rule(&b, podPeer(clientApp), port, port+2)
		case 1:
			rule(&b, podPeer(bystanderApp), port, port+2)
		case 2:
			rule(&b, fmt.Sprintf("    - ipBlock:\n        cidr: %s/32\n", benchkit.AddAddr(base, uint32(i))), port)
		}
	}
	rule(&b, podPeer(clientApp), NewPort)
	return b.Bytes(), nil
}
