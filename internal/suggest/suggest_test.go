package suggest

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/policy"
)

var t0 = time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)

// ep is an endpoint; peer is it as a flow shows it (identity labels: own and namespace's).
func ep(ns, name string, kv ...string) Endpoint {
	l := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return Endpoint{Namespace: ns, Name: name, Labels: l}
}

func peer(e Endpoint) Peer {
	var l []string
	for k, v := range e.Labels {
		l = append(l, k+"="+v)
	}
	l = append(l, "io.kubernetes.pod.namespace="+e.Namespace)
	slices.Sort(l)
	return Peer{Namespace: e.Namespace, Name: e.Name, IP: "198.18.0.9", Labels: l}
}

// starWars are the Star Wars scenario's deathstar, tiefighter and xwing.
func starWars() (Endpoint, Endpoint, Endpoint) {
	return ep("default", "deathstar", "org", "empire", "class", "deathstar"),
		ep("default", "tiefighter", "org", "empire", "class", "tiefighter"),
		ep("default", "xwing", "org", "alliance", "class", "xwing")
}

func conn(from, to Peer, proto string, p uint16) Flow {
	return Flow{Time: t0, Verdict: VerdictForwarded, Protocol: proto, Port: p, Source: from, Dest: to}
}

// suggest runs Suggest and checks its output with the agent's parser, as
// `rampart apply --dry-run` does.
func suggest(t *testing.T, flows []Flow, eps []Endpoint, opts Options) (Result, string) {
	t.Helper()
	res, err := Suggest(flows, eps, opts)
	if err != nil {
		t.Fatal(err)
	}
	out := string(res.YAML())
	if len(res.Policies) > 0 {
		d, err := policy.ParseRequest(policy.Parse, []policy.Manifest{{Source: "suggested.yaml", Data: res.YAML()}})
		if err == nil {
			err = policy.CheckUnique(d)
		}
		if err != nil {
			t.Fatalf("the agent's parser refuses the suggestion: %v\n%s", err, out)
		}
		if len(d.Policies) != len(res.Policies) {
			t.Fatalf("parsed %d policies, suggested %d:\n%s", len(d.Policies), len(res.Policies), out)
		}
	}
	return res, out
}

func policyNamed(t *testing.T, res Result, name string) string {
	t.Helper()
	for _, p := range res.Policies {
		if p.Name == name {
			return string(p.YAML)
		}
	}
	var names []string
	for _, p := range res.Policies {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	t.Fatalf("no policy %s; got %v", name, names)
	return ""
}

func wantYAML(t *testing.T, got, want string) {
	t.Helper()
	if strings.TrimSpace(got) != strings.TrimSpace(want) {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// Replicas differ in their per-pod labels only: one workload, selected by its stable
// labels, and no per-pod key in any selector.
func TestPerPodLabelsExcluded(t *testing.T) {
	web1 := ep("shop", "web-7d9f-abcde", "app", "web", "pod-template-hash", "7d9f")
	web2 := ep("shop", "web-6c8e-fghij", "app", "web", "pod-template-hash", "6c8e")
	db0 := ep("shop", "db-0", "app", "db", "controller-revision-hash", "db-5b7", "statefulset.kubernetes.io/pod-name", "db-0")
	db1 := ep("shop", "db-1", "app", "db", "controller-revision-hash", "db-5b7", "statefulset.kubernetes.io/pod-name", "db-1")
	eps := []Endpoint{web1, web2, db0, db1}
	flows := []Flow{
		conn(peer(web1), peer(db0), "TCP", 5432),
		conn(peer(web2), peer(db1), "TCP", 5432),
	}
	res, out := suggest(t, flows, eps, Options{})
	for _, k := range PerPodKeys {
		if strings.Contains(out, k) {
			t.Errorf("output names per-pod key %s:\n%s", k, out)
		}
	}
	if len(res.Policies) != 2 {
		t.Fatalf("want db ingress and web egress, got:\n%s", out)
	}
	wantYAML(t, policyNamed(t, res, "suggested-db-ingress"), `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: suggested-db-ingress
  namespace: shop
spec:
  podSelector:
    matchLabels:
      app: db
  policyTypes:
    - Ingress
  ingress:
    - from:
        - podSelector:
            matchLabels:
              app: web
      ports:
        - protocol: TCP
          port: 5432`)
	wantYAML(t, policyNamed(t, res, "suggested-web-egress"), `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: suggested-web-egress
  namespace: shop
spec:
  podSelector:
    matchLabels:
      app: web
  policyTypes:
    - Egress
  egress:
    - to:
        - podSelector:
            matchLabels:
              app: db
      ports:
        - protocol: TCP
          port: 5432`)
}

// The Star Wars endpoints: the smallest label set that selects exactly the peers seen,
// and more labels (one selector per workload) when no common label does.
func TestMinimalSelectors(t *testing.T) {
	ds, tie, xw := starWars()
	eps := []Endpoint{ds, tie, xw}

	// Empire ships to the xwing: org=empire selects both and nothing else.
	res, _ := suggest(t, []Flow{conn(peer(ds), peer(xw), "TCP", 80), conn(peer(tie), peer(xw), "TCP", 80)}, eps, Options{})
	in := policyNamed(t, res, "suggested-xwing-ingress")
	if !strings.Contains(in, "podSelector:\n            matchLabels:\n              org: empire\n") ||
		!strings.Contains(in, "podSelector:\n    matchLabels:\n      class: xwing\n") {
		t.Errorf("xwing ingress: want from org=empire, selector class=xwing:\n%s", in)
	}

	// Tiefighter and xwing to the deathstar share no label that excludes the deathstar:
	// one peer each, by class (org=empire would select the deathstar too).
	res, _ = suggest(t, []Flow{conn(peer(tie), peer(ds), "TCP", 80), conn(peer(xw), peer(ds), "TCP", 80)}, eps, Options{})
	in = policyNamed(t, res, "suggested-deathstar-ingress")
	for _, want := range []string{"class: tiefighter", "class: xwing", "class: deathstar"} {
		if !strings.Contains(in, want) {
			t.Errorf("deathstar ingress lacks %q:\n%s", want, in)
		}
	}
	if strings.Contains(in, "org:") {
		t.Errorf("deathstar ingress selects by org:\n%s", in)
	}

	// A workload whose labels are a subset of another's: its stable labels cannot tell
	// them apart, so its endpoint is selected by all its labels.
	a := ep("x", "a", "app", "web")
	b := ep("x", "b", "app", "web", "track", "canary")
	c := ep("x", "c", "app", "client")
	res, _ = suggest(t, []Flow{conn(peer(a), peer(c), "TCP", 80)}, []Endpoint{a, b, c}, Options{})
	if len(res.Notes) == 0 {
		t.Errorf("no note that the web selector also selects x/b")
	}
}

// Ports seen from one peer merge into one rule; peers seen on the same ports share it;
// other ports make another rule.
func TestPortsMerged(t *testing.T) {
	web := ep("shop", "web", "app", "web")
	a := ep("shop", "a", "app", "a")
	b := ep("shop", "b", "app", "b")
	c := ep("shop", "c", "app", "c")
	flows := []Flow{
		conn(peer(a), peer(web), "TCP", 443), conn(peer(a), peer(web), "TCP", 80), conn(peer(a), peer(web), "UDP", 53),
		conn(peer(a), peer(web), "TCP", 80), // again: one port
		conn(peer(b), peer(web), "UDP", 53), conn(peer(b), peer(web), "TCP", 443), conn(peer(b), peer(web), "TCP", 80),
		conn(peer(c), peer(web), "TCP", 8080),
	}
	res, _ := suggest(t, flows, []Endpoint{web, a, b, c}, Options{})
	wantYAML(t, policyNamed(t, res, "suggested-web-ingress"), `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: suggested-web-ingress
  namespace: shop
spec:
  podSelector:
    matchLabels:
      app: web
  policyTypes:
    - Ingress
  ingress:
    - from:
        - podSelector:
            matchLabels:
              app: a
        - podSelector:
            matchLabels:
              app: b
      ports:
        - protocol: TCP
          port: 80
        - protocol: TCP
          port: 443
        - protocol: UDP
          port: 53
    - from:
        - podSelector:
            matchLabels:
              app: c
      ports:
        - protocol: TCP
          port: 8080`)
}

// HTTP requests become Cilium L7 rules on the destination's ingress; refused requests are
// listed as dropped, not admitted; without --l7 the policy is L3/L4.
func TestL7Rules(t *testing.T) {
	ds, tie, xw := starWars()
	eps := []Endpoint{ds, tie, xw}
	req := func(from Endpoint, method, path, verdict string) Flow {
		f := conn(peer(from), peer(ds), "TCP", 80)
		f.Verdict, f.HTTP = verdict, &HTTP{Method: method, Path: path}
		if verdict == VerdictDropped {
			f.Reason = "l7-denied"
		}
		return f
	}
	redirected := conn(peer(tie), peer(ds), "TCP", 80)
	redirected.Verdict = VerdictRedirected
	xwingConn := conn(peer(xw), peer(ds), "TCP", 80)
	xwingConn.Verdict = VerdictRedirected
	flows := []Flow{
		redirected,
		req(tie, "POST", "/v1/request-landing", VerdictForwarded),
		req(tie, "POST", "/v1/request-landing", VerdictForwarded),
		req(tie, "GET", "/v1", VerdictForwarded),
		req(tie, "PUT", "/v1/exhaust-port", VerdictDropped),
		xwingConn,
		req(xw, "PUT", "/v1/exhaust-port", VerdictDropped),
	}
	res, out := suggest(t, flows, eps, Options{L7: true})
	wantYAML(t, policyNamed(t, res, "suggested-deathstar-ingress"), `
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: suggested-deathstar-ingress
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      class: deathstar
  ingress:
    - fromEndpoints:
        - matchLabels:
            class: tiefighter
      toPorts:
        - ports:
            - port: "80"
              protocol: TCP
          rules:
            http:
              - method: GET
                path: /v1
              - method: POST
                path: /v1/request-landing`)
	for _, want := range []string{
		"#   default/tiefighter -> default/deathstar 80/TCP PUT /v1/exhaust-port (l7-denied)",
		"#   default/xwing -> default/deathstar 80/TCP PUT /v1/exhaust-port (l7-denied)",
		"default/xwing -> default/deathstar 80/TCP is left out: the L7 proxy saw no allowed request of it",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("header lacks %q:\n%s", want, out)
		}
	}
	res, out = suggest(t, flows, eps, Options{})
	if !strings.Contains(out, "suggest with --l7 to keep them refused") {
		t.Errorf("without L7: no note that refused requests' ports are admitted:\n%s", out)
	}
	if in := policyNamed(t, res, "suggested-deathstar-ingress"); !strings.Contains(in, "kind: NetworkPolicy") || strings.Contains(in, "http") {
		t.Errorf("without L7: want an L3/L4 NetworkPolicy:\n%s", in)
	}
}

// Peers in other namespaces, outside the cluster and the host: a namespaceSelector, an
// ipBlock (the address, or the prefix the user gave) and a Cilium entity.
func TestPeersOutsideTheNamespace(t *testing.T) {
	web := ep("shop", "web", "app", "web")
	mon := ep("ops", "prometheus", "app", "prometheus")
	all := ep("guests", "visitor", "app", "visitor")
	eps := []Endpoint{web, mon, all}
	world := Peer{IP: "203.0.113.7", Labels: []string{"reserved:world"}}
	world2 := Peer{IP: "192.0.2.44", Labels: []string{"reserved:world"}}
	host := Peer{IP: "10.0.0.1", Labels: []string{"reserved:host"}}
	flows := []Flow{
		conn(peer(mon), peer(web), "TCP", 9090),
		conn(peer(all), peer(web), "TCP", 80),
		conn(world, peer(web), "TCP", 80),
		conn(peer(web), world2, "TCP", 443),
	}
	res, _ := suggest(t, flows, eps, Options{Namespace: "shop", CIDRs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, Audit: true})
	in := policyNamed(t, res, "suggested-web-ingress")
	for _, want := range []string{
		"annotations:\n    policy.rampart.io/audit: \"true\"",
		"- namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: guests\n",
		"- namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: ops\n",
		"- ipBlock:\n            cidr: 203.0.113.7/32",
	} {
		if !strings.Contains(in, want) {
			t.Errorf("web ingress lacks %q:\n%s", want, in)
		}
	}
	if eg := policyNamed(t, res, "suggested-web-egress"); !strings.Contains(eg, "cidr: 192.0.2.0/24") {
		t.Errorf("web egress: want the user's prefix 192.0.2.0/24:\n%s", eg)
	}
	if len(res.Policies) != 2 {
		t.Errorf("--namespace shop: want policies of shop only, got %d", len(res.Policies))
	}

	// The host cannot be said in a NetworkPolicy: a CiliumNetworkPolicy with an entity.
	res, _ = suggest(t, []Flow{conn(host, peer(web), "TCP", 80), conn(peer(mon), peer(web), "ICMP", 8)}, eps, Options{Endpoints: []string{"shop/web"}})
	wantYAML(t, policyNamed(t, res, "suggested-web-ingress"), `
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: suggested-web-ingress
  namespace: shop
spec:
  endpointSelector:
    matchLabels:
      app: web
  ingress:
    - fromEntities:
        - host
      toPorts:
        - ports:
            - port: "80"
              protocol: TCP
    - fromEndpoints:
        - matchLabels:
            app: prometheus
            k8s:io.kubernetes.pod.namespace: ops
      icmps:
        - fields:
            - type: 8
              family: IPv4`)
	if len(res.Policies) != 1 {
		t.Errorf("--endpoint shop/web: want its ingress only, got %d policies", len(res.Policies))
	}
}

// The same flows in any order give the same bytes.
func TestDeterministic(t *testing.T) {
	var eps []Endpoint
	var flows []Flow
	for i, ns := range []string{"org-a", "org-b", "org-c"} {
		for _, n := range []string{"1", "2"} {
			eps = append(eps, ep(ns, ns[4:]+"-"+n, "id.pod", "Organization"+strings.ToUpper(ns[4:]), "pod-template-hash", n+ns))
		}
		_ = i
	}
	for _, a := range eps {
		for _, b := range eps {
			if a.Namespace != b.Namespace || a.Name == b.Name {
				flows = append(flows, conn(peer(a), peer(b), "TCP", 8080))
			}
		}
	}
	drop := conn(peer(eps[0]), peer(eps[5]), "TCP", 81)
	drop.Verdict, drop.Reason = VerdictDropped, "policy-default-deny"
	flows = append(flows, drop)
	_, first := suggest(t, flows, eps, Options{})
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		r.Shuffle(len(flows), func(i, j int) { flows[i], flows[j] = flows[j], flows[i] })
		r.Shuffle(len(eps), func(i, j int) { eps[i], eps[j] = eps[j], eps[i] })
		if _, out := suggest(t, flows, eps, Options{}); out != first {
			t.Fatalf("output differs with the flows in another order:\n%s\nfirst:\n%s", out, first)
		}
	}
	for _, want := range []string{
		"#   org-a/a-1 -> org-c/c-2 81/TCP (policy-default-deny)",
		"kubernetes.io/metadata.name: org-b",
		"name: suggested-organizationa-ingress",
	} {
		if !strings.Contains(first, want) {
			t.Errorf("output lacks %q:\n%s", want, first)
		}
	}
	if strings.Contains(first, "pod-template-hash") {
		t.Errorf("per-pod label in the output:\n%s", first)
	}
}

func TestBadOptions(t *testing.T) {
	if _, err := Suggest(nil, nil, Options{Endpoints: []string{"web"}}); err == nil {
		t.Error("endpoint without namespace accepted")
	}
}

// A connection forwarded out of its source and dropped into its destination (each end
// reports it: on two nodes, or with policy on both ends) is not admitted at either end;
// another connection of the same pair and port that did go through still is.
func TestConnectionDroppedAtTheFarEnd(t *testing.T) {
	web := ep("shop", "web", "app", "web")
	other := ep("shop", "other", "app", "other")
	client := ep("shop", "client", "app", "client")
	at := func(e Endpoint, ip string) Peer { p := peer(e); p.IP = ip; return p }
	w, o, c := at(web, "198.18.0.7"), at(other, "198.18.0.5"), at(client, "198.18.0.6")
	out := conn(o, w, "TCP", 8080)
	out.SourcePort = 40000
	in := out
	in.Verdict, in.Reason = VerdictDropped, "policy-default-deny"
	ok := conn(c, w, "TCP", 8080)
	ok.SourcePort = 40000 // the same port from another address: another connection
	res, text := suggest(t, []Flow{out, in, ok}, []Endpoint{web, other, client}, Options{})
	if strings.Contains(text, "app: other") {
		t.Errorf("the dropped connection is admitted:\n%s", text)
	}
	if !strings.Contains(policyNamed(t, res, "suggested-web-ingress"), "app: client") {
		t.Errorf("the client's connection is not admitted:\n%s", text)
	}
	if len(res.Dropped) != 1 || !slices.ContainsFunc(res.Notes, func(n string) bool { return strings.Contains(n, "dropped at the other") }) {
		t.Errorf("dropped %q, notes %q", res.Dropped, res.Notes)
	}
}
