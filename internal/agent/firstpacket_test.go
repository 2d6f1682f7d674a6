package agent_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

const clientEgressOnlyToAllowed = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-egress, namespace: c}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: s}}
      podSelector: {matchLabels: {app: allowed}}
    ports: [{protocol: UDP, port: 80}]
`

// firstDatagram sends one UDP datagram from the namespace at nsPath to `to` and reports
// whether its echo comes back within timeout. One datagram, no retry: it is the first
// packet the endpoint ever sends (with the ARP request for the router before it). The
// timeout is below the kernel's one-second ARP retransmission, so a first ARP request or
// datagram dropped because the endpoint was not ready yet shows as no answer.
func firstDatagram(t *testing.T, nsPath string, to netip.AddrPort, timeout time.Duration) bool {
	t.Helper()
	c, err := testenv.Dial(nsPath, "udp", to, timeout)
	if err != nil {
		t.Fatalf("opening a UDP socket in %s: %v", nsPath, err)
	}
	defer c.Close()
	msg := []byte("first")
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("sending from %s: %v", nsPath, err)
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if ne, ok := err.(net.Error); err != nil && !(ok && ne.Timeout()) {
		t.Fatalf("receiving in %s: %v", nsPath, err)
	}
	return err == nil && string(buf[:n]) == string(msg)
}

// TestEndpointEnforcesWhenAddReturns: the first packet an endpoint sends right after
// `endpoint add` returns is judged by its policy: to a destination the policy allows it
// passes (the endpoint is not still dropping everything as unknown), to one it denies it
// is dropped for policy (the endpoint was not forwarding unfiltered either). Repeated on
// fresh endpoints, as pods come and go.
func TestEndpointEnforcesWhenAddReturns(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{PodCIDR: netip.MustParsePrefix("198.19.64.0/24")})
	allowed := e.AddEndpoint("s", "allowed", map[string]string{"app": "allowed"})
	denied := e.AddEndpoint("s", "denied", map[string]string{"app": "denied"})
	if _, err := e.Client.Apply(context.Background(), api.ApplyRequest{Documents: []api.Document{{Source: "client-egress.yaml", Data: clientEgressOnlyToAllowed}}}); err != nil {
		t.Fatal(err)
	}
	allowedAddr := netip.AddrPortFrom(netip.MustParseAddr(allowed.IP), 80)
	deniedAddr := netip.AddrPortFrom(netip.MustParseAddr(denied.IP), 80)

	for i := range 5 {
		name := fmt.Sprintf("c%d", i)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ep, err := e.Client.AddEndpoint(ctx, api.EndpointSpec{Namespace: "c", Name: name, Labels: map[string]string{"app": "client"}})
		cancel()
		if err != nil {
			t.Fatalf("adding c/%s: %v", name, err)
		}
		// Alternate which destination gets the very first packet.
		first, second := allowedAddr, deniedAddr
		if i%2 == 1 {
			first, second = deniedAddr, allowedAddr
		}
		got := map[netip.AddrPort]bool{}
		got[first] = firstDatagram(t, ep.Netns, first, 700*time.Millisecond)
		got[second] = firstDatagram(t, ep.Netns, second, 700*time.Millisecond)
		if !got[allowedAddr] {
			t.Errorf("c/%s: the first datagram to the allowed %v got no answer right after add", name, allowedAddr)
		}
		if got[deniedAddr] {
			t.Errorf("c/%s: the first datagram to the denied %v was answered right after add", name, deniedAddr)
		}
		// The dataplane dropped it for policy, under the new endpoint's identity: not as
		// an endpoint it did not know yet.
		var reason string
		ok := testenv.Eventually(3*time.Second, func() bool {
			reason = lastDrop(t, e, "c/"+name)
			return reason != ""
		})
		if !ok {
			t.Errorf("c/%s: no drop flow for the denied datagram", name)
		} else if reason != "policy-default-deny" {
			t.Errorf("c/%s: denied datagram dropped with reason %q, want policy-default-deny", name, reason)
		}
		if err := e.Client.DeleteEndpoint(context.Background(), "c", name); err != nil {
			t.Fatalf("deleting c/%s: %v", name, err)
		}
	}
}

// lastDrop returns the reason of the first dropped flow of endpoint ref, or "".
func lastDrop(t *testing.T, e *agenttest.Env, ref string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var reason string
	err := e.Client.Observe(ctx, api.ObserveRequest{Filter: api.FlowFilter{Endpoint: ref, Verdict: "dropped"}, SinceStart: true}, func(f api.Flow) error {
		if reason == "" {
			reason = f.Reason
		}
		return nil
	})
	if err != nil {
		t.Fatalf("observing %s: %v", ref, err)
	}
	return reason
}
