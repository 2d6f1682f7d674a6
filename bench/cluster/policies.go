package cluster

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// The pods live in one Kubernetes-style namespace, so plain NetworkPolicy podSelectors
// reach them; remote pods are selected by the labels declared with them.
const (
	benchNamespace = "bench"
	clientApp      = "bench-client"
	serverApp      = "bench-server"
)

// Ports on the server pods.
const (
	iperfPort  = 5201 // iperf3 server (TCP control and data, UDP data)
	rrPort     = 5202 // request/response server
	closedPort = 5203 // nothing listens: refused without policy, dropped with it
)

// fillerPortBase is the first port of the policies that do not match; two apart, so no
// two of them can merge into one port prefix in the policy map.
const fillerPortBase = 20000

// MaxPolicies is the most policies policiesManifest makes (ports up to 60,000).
const MaxPolicies = 20000

func header(b *bytes.Buffer, name, server, client string) {
	benchkit.NetworkPolicyHead(b, name, benchNamespace, server)
	fmt.Fprintf(b, `  ingress:
  - from:
    - podSelector:
        matchLabels:
          app: %s
    ports:
`, client)
}

func port(b *bytes.Buffer, proto string, p int) {
	fmt.Fprintf(b, "    - protocol: %s\n      port: %d\n", proto, p)
}

// pairsPolicy admits the clients to the servers' iperf3 port, TCP and UDP: the policy
// the pod scalability experiment measures with.
func pairsPolicy() []byte {
	var b bytes.Buffer
	header(&b, "bench-pairs", serverApp, clientApp)
	port(&b, "TCP", iperfPort)
	port(&b, "UDP", iperfPort)
	return b.Bytes()
}

// policiesManifest returns n NetworkPolicies selecting the policy experiment's server, as the paper builds
// them (seeds/001, Fig. 4): they differ by port only, and the traffic matches the last.
// The n-1 before it admit the client to port fillerPortBase+2i, where nothing listens;
// the last admits it to the iperf3 and request/response ports. Each yields one policy
// map entry of its own (the last two), so the server holds n+1.
func policiesManifest(n int) ([]byte, error) {
	if n < 1 || n > MaxPolicies {
		return nil, fmt.Errorf("policy count %d: want 1..%d", n, MaxPolicies)
	}
	var b bytes.Buffer
	for i := range n - 1 {
		header(&b, fmt.Sprintf("bench-policy-%05d", i), policyServerApp, policyClientApp)
		port(&b, "TCP", fillerPortBase+2*i)
		b.WriteString("---\n")
	}
	header(&b, fmt.Sprintf("bench-policy-%05d", n-1), policyServerApp, policyClientApp)
	port(&b, "TCP", iperfPort)
	port(&b, "TCP", rrPort)
	return b.Bytes(), nil
}

// writeFile writes a manifest into dir.
func writeFile(dir, name string, data []byte) (string, error) {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return "", fmt.Errorf("writing %s: %w", name, err)
	}
	return p, nil
}
