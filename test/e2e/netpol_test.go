package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// The truth-table suite: for each case a fresh dual-stack agent (own node namespace, pins
// and state), namespaces x, y, z labelled ns=<name>, pods a, b, c in each labelled
// pod=<name> serving TCP and UDP echo on ports 80 and 81, plus a host server (in the node
// namespace) and a world server (a namespace outside the pod range behind the node). Every
// ordered pair is probed on every port and protocol, over IPv4 and over IPv6, in parallel
// with short timeouts, and the whole table is compared with the case's expectation: the
// same for both families, since policy selects endpoints, not address families (the cases
// with CIDR peers name both families' prefixes).

var (
	namespaces = []string{"x", "y", "z"}
	podNames   = []string{"a", "b", "c"}
	ports      = []int{80, 81}
	protos     = []string{"tcp", "udp"}
)

const (
	// probeTimeout bounds one connection attempt. Allowed probes answer in well under a
	// millisecond here; a denied one is a dropped SYN or datagram, so the attempt runs
	// into this timeout. Failed probes are retried once before they count (see probeAll).
	probeTimeout = 700 * time.Millisecond
	worldAddr    = "198.19.250.2"
	worldGateway = "198.19.250.1"
	// worldAddr6 is outside podCIDR6, in a /64 of its own behind the node.
	worldAddr6 = "2001:2:ff::2"
)

// podCIDR6 is the harness agents' IPv6 pod range (the IPv4 one is the default).
var podCIDR6 = netip.MustParsePrefix("2001:2::/64")

type harness struct {
	t     *testing.T
	env   *agenttest.Env
	world string // world namespace path
	node  string // node namespace path
	dir   string
}

func (h *harness) apply(m string) error {
	f := h.writeManifest(m)
	if out, errs, code := h.env.CLI("apply", "-f", f); code != 0 {
		return fmt.Errorf("apply: exit %d: %s%s", code, out, errs)
	}
	return nil
}

func (h *harness) remove(m string) error {
	f := h.writeManifest(m)
	if out, errs, code := h.env.CLI("delete", "-f", f); code != 0 {
		return fmt.Errorf("delete: exit %d: %s%s", code, out, errs)
	}
	return nil
}

func (h *harness) writeManifest(m string) string {
	f, err := os.CreateTemp(h.dir, "policy-*.yaml")
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := f.WriteString(m); err != nil {
		h.t.Fatal(err)
	}
	f.Close()
	return f.Name()
}

func (h *harness) addEndpoint(ns, name string, labels map[string]string, extra []string) error {
	h.env.AddEndpoint(ns, name, labels, append([]string{"--port", "serve-80=80/TCP", "--port", "serve-81=81/UDP"}, extra...)...)
	return nil
}

func (h *harness) deleteEndpoint(ns, name string) error {
	h.env.DeleteEndpoint(ns + "/" + name)
	return nil
}

func kv(labels map[string]string) []string {
	var out []string
	for k, v := range labels {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func (h *harness) labelEndpoint(ns, name string, labels map[string]string) error {
	if out, errs, code := h.env.CLI(append([]string{"endpoint", "label", ns + "/" + name}, kv(labels)...)...); code != 0 {
		return fmt.Errorf("endpoint label: exit %d: %s%s", code, out, errs)
	}
	return nil
}

func (h *harness) labelNamespace(ns string, labels map[string]string) error {
	if out, errs, code := h.env.CLI(append([]string{"namespace", "label", ns}, kv(labels)...)...); code != 0 {
		return fmt.Errorf("namespace label: exit %d: %s%s", code, out, errs)
	}
	return nil
}

func (h *harness) ip(ns, name string) string  { return h.env.IP(ns + "/" + name).String() }
func (h *harness) ip6(ns, name string) string { return h.env.IP6(ns + "/" + name).String() }
func (h *harness) podCIDR6() string           { return podCIDR6.String() }

// addr is where a probe to p connects, over IPv6 or IPv4.
func (h *harness) addr(p peer, ipv6 bool) netip.Addr {
	switch {
	case p.special == "host" && ipv6:
		return podCIDR6.Addr().Next() // the IPv6 router address, on the node's lo
	case p.special == "host":
		return h.env.Config.PodCIDR.Addr().Next() // the router address, on the node's lo
	case p.special == "world" && ipv6:
		return netip.MustParseAddr(worldAddr6)
	case p.special == "world":
		return netip.MustParseAddr(worldAddr)
	case ipv6:
		return h.env.IP6(p.String())
	}
	return h.env.IP(p.String())
}

// nsPath is the network namespace a probe from p runs in.
func (h *harness) nsPath(p peer) string {
	switch p.special {
	case "host":
		return h.node
	case "world":
		return h.world
	}
	return agenttest.NetnsPathOf(h.env.Config.Instance, p.ns, p.pod)
}

// setUpWorld creates a namespace outside the pod range, linked to the node namespace, with
// echo servers; and starts echo servers in the node namespace (the host).
func (h *harness) setUpWorld() {
	w := agenttest.AddWorld(h.t, h.env, netip.MustParseAddr(worldGateway),
		[]netip.Addr{netip.MustParseAddr(worldAddr), netip.MustParseAddr(worldAddr6)}, []uint16{80, 81}, []uint16{80, 81})
	h.world = w.Path
	s, err := testenv.Serve(h.node, []uint16{80, 81}, []uint16{80, 81})
	if err != nil {
		h.t.Fatalf("serving in the node namespace: %v", err)
	}
	h.t.Cleanup(s.Close)
}

func newHarness(t *testing.T) *harness {
	// The host is judged by policy like any peer (the cases probe it as a source and
	// select it with fromEntities host); the default, which admits it into every endpoint,
	// is tested in internal/cli (TestHostTraffic).
	env := agenttest.StartAgent(t, agenttest.Options{HostTraffic: agent.HostTrafficPolicy, PodCIDR6: podCIDR6})
	h := &harness{t: t, env: env, dir: t.TempDir(), node: endpoint.NetnsPath(env.Config.NodeNetns)}
	for _, ns := range namespaces {
		if err := h.labelNamespace(ns, map[string]string{"ns": ns}); err != nil {
			t.Fatal(err)
		}
		for _, p := range podNames {
			if err := h.addEndpoint(ns, p, map[string]string{"pod": p}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.setUpWorld()
	return h
}

// probeAll probes every probe in parallel and returns the ones whose outcome differs from
// expect. A probe that fails is retried once, so a lost packet on a loaded machine does
// not read as a deny; a probe that succeeds never needs a retry (a leak is a leak).
func (h *harness) probeAll(probes []probe, expect expectFn) []string {
	type result struct {
		p  probe
		ok bool
	}
	results := make([]result, len(probes))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 128)
	for i, p := range probes {
		wg.Add(1)
		go func(i int, p probe) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			to := netip.AddrPortFrom(h.addr(p.to, p.ipv6), uint16(p.port))
			ok := testenv.Probe(h.nsPath(p.from), to, p.proto, probeTimeout)
			if !ok && expect(p) {
				ok = testenv.Probe(h.nsPath(p.from), to, p.proto, probeTimeout)
			}
			results[i] = result{p, ok}
		}(i, p)
	}
	wg.Wait()
	var wrong []string
	for _, r := range results {
		if want := expect(r.p); r.ok != want {
			w := "expected allowed, was blocked"
			if !want {
				w = "expected blocked, was allowed"
			}
			wrong = append(wrong, fmt.Sprintf("%s: %s", r.p, w))
		}
	}
	sort.Strings(wrong)
	return wrong
}

func tableFor(c netpolCase) []probe {
	var peers []peer
	for _, ns := range namespaces {
		for _, p := range podNames {
			peers = append(peers, peer{ns: ns, pod: p})
		}
	}
	peers = append(peers, c.extraPods...)
	if c.probeHostWorld {
		peers = append(peers, peer{special: "host"}, peer{special: "world"})
	}
	var out []probe
	for _, from := range peers {
		for _, to := range peers {
			if from == to || (!from.isPod() && !to.isPod()) {
				continue
			}
			for _, port := range ports {
				for _, proto := range protos {
					for _, ipv6 := range []bool{false, true} {
						out = append(out, probe{from: from, to: to, port: port, proto: proto, ipv6: ipv6})
					}
				}
			}
		}
	}
	return out
}

func TestNetworkPolicyTruthTables(t *testing.T) {
	testenv.RequireRoot(t)
	all := cases()
	if len(all) < 30 {
		t.Fatalf("only %d cases", len(all))
	}
	for _, c := range all {
		c := c
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			h := newHarness(t)
			for i, s := range c.steps {
				if err := s(h); err != nil {
					t.Fatalf("step %d: %v", i+1, err)
				}
			}
			probes := tableFor(c)
			// Policy is applied synchronously by the agent before the CLI returns, so the
			// table is probed at once; no settling delay.
			wrong := h.probeAll(probes, c.expect)
			if len(wrong) > 0 {
				out, _, _ := h.env.CLI("observe", "--last", "40")
				t.Errorf("%d of %d probes differ from the expected truth table:\n  %s\nrecent flows:\n%s",
					len(wrong), len(probes), strings.Join(wrong, "\n  "), out)
			}
			// Sanity: the expectation must not be trivial for cases with policy.
			if len(c.steps) > 0 {
				denied := 0
				for _, p := range probes {
					if !c.expect(p) {
						denied++
					}
				}
				if denied == 0 && c.name != "allow all ingress beside a default deny" && c.name != "policy deleted" {
					t.Errorf("case expects no denied probe: the table would not show the policy working")
				}
			}
		})
	}
}
