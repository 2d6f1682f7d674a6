package e2e

import (
	"fmt"
	"strings"
)

// peer is a probe source or destination: an endpoint "ns/pod", or the host or world.
type peer struct {
	ns, pod string // empty for host and world
	special string // "host" or "world"
}

func (p peer) String() string {
	if p.special != "" {
		return p.special
	}
	return p.ns + "/" + p.pod
}

func (p peer) isPod() bool { return p.special == "" }

// probe is one connection attempt of the truth table.
type probe struct {
	from, to peer
	port     int
	proto    string // "tcp" or "udp"
	ipv6     bool   // between the peers' IPv6 addresses
}

func (p probe) String() string {
	family := ""
	if p.ipv6 {
		family = " IPv6"
	}
	return fmt.Sprintf("%s -> %s %d/%s%s", p.from, p.to, p.port, p.proto, family)
}

// expectFn says whether a probe should connect under the case's policy.
type expectFn func(p probe) bool

// step changes the cluster; cases run their steps in order, then probe the truth table.
type step func(c cluster) error

// netpolCase is one case of the truth-table suite, modelled on the Kubernetes network
// policy end-to-end tests: namespaces x, y, z with pods a, b, c, every ordered pair probed
// on 80 and 81, TCP and UDP, compared with the expected table as a whole.
type netpolCase struct {
	name   string
	steps  []step
	expect expectFn
	// extraPods are endpoints a case adds; they join the table as sources and destinations.
	extraPods []peer
	// probeHostWorld adds the host and an outside (world) address as sources and
	// destinations of the table.
	probeHostWorld bool
}

// cluster is what the cases need of the system under test.
type cluster interface {
	apply(manifest string) error
	remove(manifest string) error
	addEndpoint(ns, name string, labels map[string]string, ports []string) error
	deleteEndpoint(ns, name string) error
	labelEndpoint(ns, name string, labels map[string]string) error
	labelNamespace(ns string, labels map[string]string) error
	ip(ns, name string) string
	ip6(ns, name string) string
	podCIDR6() string
}

func apply(m string) step { return func(c cluster) error { return c.apply(m) } }
func remove(m string) step {
	return func(c cluster) error { return c.remove(m) }
}

// applyf renders a manifest that needs endpoint addresses: {{ip x/a}} and {{ip6 x/a}}
// placeholders, and {{podcidr6}} for the IPv6 pod range.
func applyf(tmpl string) step {
	return func(c cluster) error { return c.apply(expandIPs(c, tmpl)) }
}

func expandIPs(c cluster, s string) string {
	s = strings.ReplaceAll(s, "{{podcidr6}}", c.podCIDR6())
	for _, f := range []struct {
		open string
		addr func(ns, name string) string
	}{{"{{ip ", c.ip}, {"{{ip6 ", c.ip6}} {
		for {
			i := strings.Index(s, f.open)
			if i < 0 {
				break
			}
			j := strings.Index(s[i:], "}}")
			ref := strings.TrimSpace(s[i+len(f.open) : i+j])
			ns, name, _ := strings.Cut(ref, "/")
			s = s[:i] + f.addr(ns, name) + s[i+j+2:]
		}
	}
	return s
}

func is(p peer, ref string) bool { return p.String() == ref }

func inNS(p peer, ns ...string) bool {
	for _, n := range ns {
		if p.isPod() && p.ns == n {
			return true
		}
	}
	return false
}

func podIs(p peer, pods ...string) bool {
	for _, n := range pods {
		if p.isPod() && p.pod == n {
			return true
		}
	}
	return false
}

func allowAll(probe) bool { return true }

const denyAllIngressX = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all-ingress, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`

const denyAllEgressX = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all-egress, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]
`

func cases() []netpolCase {
	return []netpolCase{
		{
			name:   "no policy allows everything",
			expect: allowAll, probeHostWorld: true,
		},
		{
			name:   "default deny ingress",
			steps:  []step{apply(denyAllIngressX)},
			expect: func(p probe) bool { return !inNS(p.to, "x") },
		},
		{
			name:   "default deny egress",
			steps:  []step{apply(denyAllEgressX)},
			expect: func(p probe) bool { return !inNS(p.from, "x") },
		},
		{
			name: "default deny both directions by policyTypes alone",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: y}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
`)},
			expect: func(p probe) bool { return !inNS(p.from, "y") && !inNS(p.to, "y") },
		},
		{
			name: "allow all ingress beside a default deny",
			steps: []step{apply(denyAllIngressX), apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all, namespace: x}
spec:
  podSelector: {}
  ingress: [{}]
`)},
			expect: allowAll,
		},
		{
			name: "allow from the same namespace",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-same-ns, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - podSelector: {}
`)},
			expect: func(p probe) bool { return !is(p.to, "x/a") || inNS(p.from, "x") },
		},
		{
			name: "allow from another namespace by namespaceSelector",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-ns-y, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: y}}
`)},
			expect: func(p probe) bool { return !is(p.to, "x/a") || inNS(p.from, "y") },
		},
		{
			name: "podSelector AND namespaceSelector in one peer",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-y-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: y}}
      podSelector: {matchLabels: {pod: b}}
`)},
			expect: func(p probe) bool { return !is(p.to, "x/a") || is(p.from, "y/b") },
		},
		{
			name: "podSelector OR namespaceSelector as two peers",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-y-or-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: y}}
    - podSelector: {matchLabels: {pod: b}}
`)},
			expect: func(p probe) bool {
				return !is(p.to, "x/a") || inNS(p.from, "y") || is(p.from, "x/b")
			},
		},
		{
			name: "matchExpressions In and NotIn",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-exprs, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector:
        matchExpressions:
        - {key: ns, operator: NotIn, values: [z]}
      podSelector:
        matchExpressions:
        - {key: pod, operator: In, values: [b, c]}
`)},
			expect: func(p probe) bool {
				return !is(p.to, "x/a") || (podIs(p.from, "b", "c") && !inNS(p.from, "z"))
			},
		},
		{
			name: "matchExpressions Exists and DoesNotExist",
			steps: []step{
				func(c cluster) error { return c.labelNamespace("z", map[string]string{"ns": "z", "team": "blue"}) },
				apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-team, namespace: y}
spec:
  podSelector:
    matchExpressions:
    - {key: pod, operator: Exists}
    - {key: secret, operator: DoesNotExist}
  ingress:
  - from:
    - namespaceSelector:
        matchExpressions:
        - {key: team, operator: Exists}
`)},
			expect: func(p probe) bool { return !inNS(p.to, "y") || inNS(p.from, "z") },
		},
		{
			name: "a port only",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-80, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports:
    - port: 80
`)},
			// A port without protocol means TCP.
			expect: func(p probe) bool { return !is(p.to, "x/a") || (p.port == 80 && p.proto == "tcp") },
		},
		{
			name: "endPort range",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-range, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: y}}}]
    ports:
    - {protocol: TCP, port: 79, endPort: 81}
`)},
			expect: func(p probe) bool { return !is(p.to, "x/b") || (inNS(p.from, "y") && p.proto == "tcp") },
		},
		{
			name: "endPort range that excludes 81",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-range, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress:
  - ports:
    - {protocol: TCP, port: 70, endPort: 80}
    - {protocol: UDP, port: 81, endPort: 90}
`)},
			expect: func(p probe) bool {
				return !is(p.to, "x/b") || (p.port == 80 && p.proto == "tcp") || (p.port == 81 && p.proto == "udp")
			},
		},
		{
			name: "UDP only",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-udp-81, namespace: z}
spec:
  podSelector: {matchLabels: {pod: c}}
  ingress:
  - ports:
    - {protocol: UDP, port: 81}
`)},
			expect: func(p probe) bool { return !is(p.to, "z/c") || (p.port == 81 && p.proto == "udp") },
		},
		{
			name: "ipBlock with except",
			steps: []step{applyf(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-cidr, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - ipBlock:
        cidr: 198.18.0.0/16
        except: [{{ip y/b}}/32, {{ip z/c}}/32]
    - ipBlock:
        cidr: {{podcidr6}}
        except: ["{{ip6 y/b}}/128", "{{ip6 z/c}}/128"]
`)},
			expect: func(p probe) bool {
				return !is(p.to, "x/a") || (p.from.isPod() && !is(p.from, "y/b") && !is(p.from, "z/c")) || p.from.special == "host"
			},
			probeHostWorld: true,
		},
		{
			name: "egress ipBlock to one address",
			steps: []step{applyf(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-cidr, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: "{{ip z/c}}/32"}
    - ipBlock: {cidr: "{{ip6 z/c}}/128"}
`)},
			expect: func(p probe) bool { return !is(p.from, "x/a") || is(p.to, "z/c") },
		},
		{
			name: "several policies selecting one endpoint are a union",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-y-80, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: y}}}]
    ports: [{port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-z-81, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: z}}}]
    ports: [{port: 81, protocol: UDP}]
`)},
			expect: func(p probe) bool {
				return !is(p.to, "x/a") ||
					(inNS(p.from, "y") && p.port == 80 && p.proto == "tcp") ||
					(inNS(p.from, "z") && p.port == 81 && p.proto == "udp")
			},
		},
		{
			name: "egress-only policyTypes ignores ingress rules",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-only, namespace: y}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: nobody}}}]
  egress:
  - to: [{namespaceSelector: {matchLabels: {ns: z}}}]
`)},
			expect: func(p probe) bool { return !is(p.from, "y/a") || inNS(p.to, "z") },
		},
		{
			name: "egress to a namespace on one port",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-y-80, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {matchLabels: {ns: y}}}]
    ports: [{port: 80, protocol: TCP}]
`)},
			expect: func(p probe) bool {
				return !inNS(p.from, "x") || (inNS(p.to, "y") && p.port == 80 && p.proto == "tcp")
			},
		},
		{
			name: "policy updated in place",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-from, namespace: x}
spec:
  podSelector: {matchLabels: {pod: c}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: y}}}]
`), apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-from, namespace: x}
spec:
  podSelector: {matchLabels: {pod: c}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: z}}}]
`)},
			expect: func(p probe) bool { return !is(p.to, "x/c") || inNS(p.from, "z") },
		},
		{
			name:   "policy deleted",
			steps:  []step{apply(denyAllIngressX), apply(denyAllEgressX), remove(denyAllIngressX)},
			expect: func(p probe) bool { return !inNS(p.from, "x") },
		},
		{
			name: "endpoint added after the policy",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-from-d, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {}
      podSelector: {matchLabels: {pod: d}}
`), apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all-ingress, namespace: z}
spec: {podSelector: {}, policyTypes: [Ingress]}
`), func(c cluster) error {
				return c.addEndpoint("y", "d", map[string]string{"pod": "d"}, nil)
			}, func(c cluster) error {
				return c.addEndpoint("z", "d", map[string]string{"pod": "d"}, nil)
			}},
			extraPods: []peer{{ns: "y", pod: "d"}, {ns: "z", pod: "d"}},
			expect: func(p probe) bool {
				if is(p.to, "x/a") {
					return podIs(p.from, "d")
				}
				return !inNS(p.to, "z")
			},
		},
		{
			name: "relabelled endpoint",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-from-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: b}}}]
`), func(c cluster) error {
				// x/c now looks like b; x/b is relabelled away and loses access.
				if err := c.labelEndpoint("x", "c", map[string]string{"pod": "b"}); err != nil {
					return err
				}
				return c.labelEndpoint("x", "b", map[string]string{"pod": "e"})
			}},
			expect: func(p probe) bool { return !is(p.to, "x/a") || is(p.from, "x/c") },
		},
		{
			name: "relabelled namespace",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-trusted, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {trusted: "yes"}}}]
`), func(c cluster) error {
				return c.labelNamespace("y", map[string]string{"ns": "y", "trusted": "yes"})
			}},
			expect: func(p probe) bool { return !inNS(p.to, "x") || inNS(p.from, "y") },
		},
		{
			name: "named port",
			steps: []step{apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-named, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports: [{port: serve-81, protocol: UDP}]
`)},
			// Every pod declares serve-81=81/UDP (see the suite set-up).
			expect: func(p probe) bool { return !inNS(p.to, "x") || (p.port == 81 && p.proto == "udp") },
		},
		{
			name: "Cilium deny overrides an allow",
			steps: []step{apply(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: allow-all-deny-y, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  ingress:
  - fromEntities: [all]
  ingressDeny:
  - fromEndpoints:
    - matchLabels: {k8s:io.kubernetes.pod.namespace: y}
`)},
			expect: func(p probe) bool { return !is(p.to, "x/a") || !inNS(p.from, "y") },
		},
		{
			name: "Cilium egressDeny on a port overrides allow-all egress",
			steps: []step{apply(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: no-81, namespace: z}
spec:
  endpointSelector: {}
  egress:
  - toEntities: [all]
  egressDeny:
  - toPorts:
    - ports: [{port: "81", protocol: ANY}]
`)},
			expect: func(p probe) bool { return !inNS(p.from, "z") || p.port != 81 },
		},
		{
			name: "Cilium deny in one policy beats an allow in another",
			steps: []step{apply(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: allow-b, namespace: y}
spec:
  endpointSelector: {matchLabels: {pod: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {pod: a, k8s:io.kubernetes.pod.namespace: x}}]
  - fromEndpoints: [{matchLabels: {pod: a, k8s:io.kubernetes.pod.namespace: z}}]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: deny-z-80}
spec:
  endpointSelector: {matchLabels: {pod: b, io.kubernetes.pod.namespace: y}}
  ingressDeny:
  - fromEndpoints: [{matchLabels: {io.kubernetes.pod.namespace: z}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
`)},
			expect: func(p probe) bool {
				if is(p.to, "y/b") {
					return is(p.from, "x/a") || (is(p.from, "z/a") && !(p.port == 80 && p.proto == "tcp"))
				}
				return true
			},
		},
		{
			name: "Cilium fromEndpoints is scoped to the policy's namespace",
			steps: []step{apply(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: same-ns, namespace: z}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  ingress:
  - fromEndpoints: [{}]
`)},
			expect: func(p probe) bool { return !is(p.to, "z/a") || inNS(p.from, "z") },
		},
		{
			name: "Cilium clusterwide policy selects peers in every namespace",
			steps: []step{apply(`
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: from-c}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  ingress:
  - fromEndpoints: [{matchLabels: {pod: c}}]
    toPorts: [{ports: [{port: "80"}]}]
`)},
			// toPorts without protocol means ANY: TCP and UDP.
			expect: func(p probe) bool { return !podIs(p.to, "a") || (podIs(p.from, "c") && p.port == 80) },
		},
		{
			name: "Cilium empty ingress rule turns on default deny",
			steps: []step{apply(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: lockdown, namespace: y}
spec:
  endpointSelector: {matchLabels: {pod: c}}
  ingress: [{}]
`)},
			expect: func(p probe) bool { return !is(p.to, "y/c") },
		},
		{
			name: "Cilium L4-only rule with protocol ANY",
			steps: []step{apply(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: l4-any, namespace: x}
spec:
  endpointSelector: {}
  ingress:
  - toPorts: [{ports: [{port: "81", protocol: ANY}]}]
`)},
			expect: func(p probe) bool { return !inNS(p.to, "x") || p.port == 81 },
		},
		{
			name: "Cilium matchExpressions on namespace labels",
			steps: []step{apply(`
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: from-not-z}
spec:
  endpointSelector: {matchLabels: {pod: b}}
  ingress:
  - fromEndpoints:
    - matchExpressions:
      - {key: io.cilium.k8s.namespace.labels.ns, operator: NotIn, values: [z]}
      - {key: pod, operator: in, values: [a, c]}
`)},
			expect: func(p probe) bool {
				return !podIs(p.to, "b") || (!inNS(p.from, "z") && podIs(p.from, "a", "c"))
			},
		},
		{
			name: "entity host",
			steps: []step{apply(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: from-host, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  ingress:
  - fromEntities: [host]
  egress:
  - toEntities: [host]
`)},
			probeHostWorld: true,
			expect: func(p probe) bool {
				if is(p.to, "x/a") {
					return p.from.special == "host"
				}
				if is(p.from, "x/a") {
					return p.to.special == "host"
				}
				return true
			},
		},
		{
			name: "entity world",
			steps: []step{apply(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: world-only, namespace: y}
spec:
  endpointSelector: {}
  ingress:
  - fromEntities: [world]
  egress:
  - toEntities: [world]
`)},
			probeHostWorld: true,
			expect: func(p probe) bool {
				if inNS(p.to, "y") {
					return p.from.special == "world"
				}
				if inNS(p.from, "y") {
					return p.to.special == "world"
				}
				return true
			},
		},
		{
			name: "entity cluster excludes world",
			steps: []step{apply(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: cluster-only, namespace: z}
spec:
  endpointSelector: {matchLabels: {pod: b}}
  ingress:
  - fromEntities: [cluster]
`)},
			probeHostWorld: true,
			expect:         func(p probe) bool { return !is(p.to, "z/b") || p.from.special != "world" },
		},
		{
			name: "Cilium toCIDRSet with except",
			steps: []step{applyf(`
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: egress-cidr, namespace: z}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  egress:
  - toCIDRSet:
    - cidr: 198.18.0.0/16
      except: ["{{ip x/a}}/32"]
    - cidr: {{podcidr6}}
      except: ["{{ip6 x/a}}/128"]
`)},
			expect: func(p probe) bool { return !is(p.from, "z/a") || (p.to.isPod() && !is(p.to, "x/a")) },
		},
	}
}
