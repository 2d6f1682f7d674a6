package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// A Service declared with the CLI reaches its backend endpoint, and policy judges the
// backend: an egress rule allowing only the backend's /32 admits the Service, one that
// allows another address denies it (docs/services.md).
func TestServiceThroughAgent(t *testing.T) {
	cg := testenv.JoinNewCgroup(t)
	env := agenttest.StartAgent(t, agenttest.Options{ServiceCgroup: cg})
	env.AddEndpoint("x", "client", map[string]string{"app": "client"})
	b := env.AddEndpoint("x", "web", map[string]string{"app": "web"})
	c := env.AddEndpoint("x", "other", map[string]string{"app": "other"})
	const clusterIP = "198.19.200.10"
	svc := netip.MustParseAddr(clusterIP)

	if env.Probe("x/client", svc, 8080, "tcp", time.Second) {
		t.Fatal("the Service address answered before the Service was declared")
	}
	out := env.MustCLI("service", "add", "x/web", "--cluster-ip", clusterIP, "--port", "http=8080:80/TCP", "--port", "dns=5353:80/UDP", "--selector", "app=web")
	if !strings.Contains(out, b.IP) {
		t.Errorf("service add: %q, want the backend %s", out, b.IP)
	}
	if out := env.MustCLI("service", "list"); !strings.Contains(out, "x/web") || !strings.Contains(out, b.IP) || strings.Contains(out, c.IP) {
		t.Errorf("service list: %q, want x/web with backend %s only", out, b.IP)
	}
	for _, proto := range []string{"tcp", "udp"} {
		port := map[string]uint16{"tcp": 8080, "udp": 5353}[proto]
		if !env.Probe("x/client", svc, port, proto, 5*time.Second) {
			t.Errorf("%s to the Service without policy: no answer", proto)
		}
	}

	egress := func(cidr string) string {
		return fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-egress, namespace: x}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: %s/32}}]
    ports: [{protocol: TCP, port: 80}, {protocol: UDP, port: 80}]
`, cidr)
	}
	if out, errs, code := env.CLIStdin(egress(b.IP), "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply: %d %s%s", code, out, errs)
	}
	if env.Probe("x/client", netip.MustParseAddr(c.IP), 80, "tcp", time.Second) {
		t.Fatal("the policy does not enforce: x/other answered")
	}
	for _, proto := range []string{"tcp", "udp"} {
		port := map[string]uint16{"tcp": 8080, "udp": 5353}[proto]
		if !env.Probe("x/client", svc, port, proto, 5*time.Second) {
			t.Errorf("%s to the Service whose backend's /32 is allowed: no answer", proto)
		}
	}
	if out, errs, code := env.CLIStdin(egress(c.IP), "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply: %d %s%s", code, out, errs)
	}
	if env.Probe("x/client", svc, 8080, "tcp", time.Second) {
		t.Error("TCP to the Service whose backend policy does not allow: answered")
	}
	if env.Probe("x/client", svc, 5353, "udp", time.Second) {
		t.Error("UDP to the Service whose backend policy does not allow: answered")
	}

	env.MustCLI("service", "delete", "x/web")
	if out := env.MustCLI("service", "list"); strings.Contains(out, "x/web") {
		t.Errorf("service list after delete: %q", out)
	}
}
