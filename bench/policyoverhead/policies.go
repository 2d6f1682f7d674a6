package policyoverhead

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// The agent-side endpoints all live in one Kubernetes-style namespace, so plain
// NetworkPolicy podSelectors reach them.
const (
	benchNamespace = "bench"
	clientApp      = "bench-client"
	serverApp      = "bench-server"
	// The bystander is a third endpoint that no matching rule allows: probes from it show
	// that the server really enforces policy, and filler rules name it so that they produce
	// map entries for a real identity.
	bystanderApp = "bench-bystander"
)

// Ports used on the server endpoint.
type Ports struct {
	Iperf  int // iperf3 server
	RR     int // request/response server
	Closed int // nothing listens: refused when unenforced, dropped when enforced
}

// fillerPortBase is the first port of the filler rules; they use distinct ports far from
// the benchmark's, so they can never match its traffic.
const fillerPortBase = 10000

// fillerCIDR holds the /32 peers of the address-based filler rules: inside the
// benchmarking range, outside every pod range the benchmark uses, never a real host.
var fillerCIDR = netip.MustParsePrefix("198.19.128.0/17")

// MaxRules is the largest rule count manyRulesPolicy can generate with distinct ports and
// addresses: bounded by the /17 of fillerCIDR (ports would last to 55,000).
const MaxRules = 1 << 15

func header(b *bytes.Buffer, name string) {
	benchkit.NetworkPolicyHead(b, name, benchNamespace, serverApp)
}

func podPeer(b *bytes.Buffer, app string) {
	fmt.Fprintf(b, "    - podSelector:\n        matchLabels:\n          app: %s\n", app)
}

func tcpPorts(b *bytes.Buffer, ports ...int) {
	b.WriteString("    ports:\n")
	for _, p := range ports {
		fmt.Fprintf(b, "    - protocol: TCP\n      port: %d\n", p)
	}
}

// allowAllPolicy selects the server and allows every peer on every port: enforcement is
// switched on (the dataplane does the full policy lookup for each new connection) but
// nothing is dropped.
func allowAllPolicy() []byte {
	var b bytes.Buffer
	header(&b, "bench-allow-all")
	b.WriteString("  ingress:\n  - {}\n")
	return b.Bytes()
}

// l3Policy allows the client (by its labels) to reach the server on any port.
func l3Policy() []byte {
	var b bytes.Buffer
	header(&b, "bench-l3")
	b.WriteString("  ingress:\n  - from:\n")
	podPeer(&b, clientApp)
	return b.Bytes()
}

// l4Rule writes the one rule that matches the benchmark's traffic: from the client's
// labels to the iperf3 and RR ports.
func l4Rule(b *bytes.Buffer, p Ports) {
	b.WriteString("  ingress:\n  - from:\n")
	podPeer(b, clientApp)
	tcpPorts(b, p.Iperf, p.RR)
}

// l4Policy allows the client to reach the server on the benchmark's ports only.
func l4Policy(p Ports) []byte {
	var b bytes.Buffer
	header(&b, "bench-l4")
	l4Rule(&b, p)
	return b.Bytes()
}

// manyRulesPolicy returns n NetworkPolicy documents selecting the server: n-1 rules that do
// not match the benchmark's traffic, then the L4 rule that does, last. Rule i of the
// fillers rotates over three shapes so that each produces at least one policy map entry
// of its own (a rule whose peers select no identity would produce none, and would not
// load the map at all):
//
//	i%3 == 0: from the client's labels, to port fillerPortBase+i
//	i%3 == 1: from the bystander's labels, to port fillerPortBase+i
//	i%3 == 2: from one /32 of fillerCIDR (no such host), to the benchmark's ports
//
// Ports of one peer are three apart, so no two of its entries can merge into one port
// prefix. The server's map therefore holds at least n entries.
func manyRulesPolicy(n int, p Ports) ([]byte, error) {
	if n < 1 || n > MaxRules {
		return nil, fmt.Errorf("rule count %d: want 1..%d", n, MaxRules)
	}
	var b bytes.Buffer
	base := fillerCIDR.Addr()
	for i := range n - 1 {
		header(&b, fmt.Sprintf("bench-rule-%05d", i))
		b.WriteString("  ingress:\n  - from:\n")
		switch i % 3 {
		case 0:
			podPeer(&b, clientApp)
			tcpPorts(&b, fillerPortBase+i)
		case 1:
			podPeer(&b, bystanderApp)
			tcpPorts(&b, fillerPortBase+i)
		case 2:
			fmt.Fprintf(&b, "    - ipBlock:\n        cidr: %s/32\n", benchkit.AddAddr(base, uint32(i)))
			tcpPorts(&b, p.Iperf, p.RR)
		}
		b.WriteString("---\n")
	}
	header(&b, fmt.Sprintf("bench-rule-%05d", n-1))
	l4Rule(&b, p)
	return b.Bytes(), nil
}

// writeFile writes a policy file into dir.
func writeFile(dir, name string, data []byte) (string, error) {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return "", fmt.Errorf("writing %s: %w", name, err)
	}
	return p, nil
}
