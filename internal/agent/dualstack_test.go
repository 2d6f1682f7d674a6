package agent

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/overlay"
)

func TestParsePodCIDRs(t *testing.T) {
	for _, c := range []struct{ in, v4, v6 string }{
		{"198.18.0.0/16", "198.18.0.0/16", "invalid Prefix"},
		{"198.18.0.0/24,2001:2::/64", "198.18.0.0/24", "2001:2::/64"},
		{"2001:2::/64, 198.18.0.0/24", "198.18.0.0/24", "2001:2::/64"},
		{"198.18.0.0/24,2001:2::/120", "198.18.0.0/24", "2001:2::/120"},
	} {
		v4, v6, err := ParsePodCIDRs(c.in)
		if err != nil || v4.String() != c.v4 || v6.String() != c.v6 {
			t.Errorf("ParsePodCIDRs(%q) = %v, %v, %v; want %s, %s", c.in, v4, v6, err, c.v4, c.v6)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"198.18.0.0/24,198.19.0.0/24", "two prefixes of one family"},
		{"2001:2::/64,2001:3::/64", "two prefixes of one family"},
		{"2001:2::/64", "no IPv4 prefix"},
		{"198.18.0.0/24,::ffff:198.19.0.0/120", "IPv4-mapped"},
		{"198.18.0.0/24,2001:2::/40", "from /48 to /120"},
		{"198.18.0.0/24,2001:2::/121", "from /48 to /120"},
		{"198.18.0.0/16,2001:2::/120", "8 host bits, fewer than the IPv4 pod range 198.18.0.0/16's 16"},
		{"198.18.0.0/24,2001:2::/64,2001:3::/64", "want one prefix, or an IPv4 and an IPv6 one"},
		{"198.18.0.0/24,nonsense", "nonsense"},
	} {
		if _, _, err := ParsePodCIDRs(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParsePodCIDRs(%q): error %v, want one saying %q", c.in, err, c.want)
		}
	}
}

// newDualStackHarness is newHarness restarted with the IPv6 pod range 2001:2::/64 beside
// the default 198.18.0.0/16, before any endpoint exists.
func newDualStackHarness(t *testing.T) *harness {
	t.Helper()
	return newDualStackHarnessOn(t, "")
}

// newDualStackHarnessOn is newDualStackHarness on overlay mode ("": the default).
func newDualStackHarnessOn(t *testing.T, mode overlay.Mode) *harness {
	t.Helper()
	h := newHarness(t)
	h.a.Close()
	h.a = nil
	h.cfg.PodCIDR6 = netip.MustParsePrefix("2001:2::/64")
	if mode != "" {
		h.cfg.Tunnel = mode
	}
	h.dp = h.dp.reopen()
	h.start()
	return h
}

// installedEP is the dataplane's info of endpoint epID.
func installedEP(t *testing.T, h *harness, epID uint32) datapath.EndpointInfo {
	t.Helper()
	_, eps := h.dp.snapshot()
	for _, ep := range eps {
		if ep.info.EpID == epID {
			return ep.info
		}
	}
	t.Fatalf("endpoint %d not in the dataplane", epID)
	return datapath.EndpointInfo{}
}

// A dual-stack endpoint: its IPv6 address paired with its IPv4 one in the API, the
// dataplane's endpoint info (with its link-local address) and the ipcache (with the
// router's IPv6 addresses as the host's); kept across a restart, also from an endpoint
// file an older agent wrote without it.
func TestDualStackEndpoint(t *testing.T) {
	h := newDualStackHarness(t)
	ctx := context.Background()
	a := h.add("x", "a", map[string]string{"app": "a"})
	if a.IP != "198.18.0.2" || a.IP6 != "2001:2::2" {
		t.Fatalf("endpoint addresses %q %q, want 198.18.0.2 2001:2::2", a.IP, a.IP6)
	}
	info := installedEP(t, h, a.EpID)
	if info.Addr != netip.MustParseAddr("198.18.0.2") || info.Addr6 != netip.MustParseAddr("2001:2::2") || info.LinkLocal6 != netip.MustParseAddr("fe80::2") {
		t.Fatalf("endpoint info %+v", info)
	}
	ipc, _ := h.dp.snapshot()
	v4 := ipc[netip.MustParsePrefix("198.18.0.2/32")]
	if v4.EndpointID != a.EpID || v4.Identity != identity.Identity(a.Identity) {
		t.Fatalf("ipcache of the IPv4 address: %+v", v4)
	}
	for p, want := range map[string]mapstate.IPCacheEntry{
		"2001:2::2/128": v4,
		"2001:2::1/128": {Identity: identity.Host},
		"fe80::1/128":   {Identity: identity.Host},
	} {
		if got, ok := ipc[netip.MustParsePrefix(p)]; !ok || got != want {
			t.Errorf("ipcache[%s] = %+v (present %v), want %+v", p, got, ok, want)
		}
	}
	st, err := h.a.Status(ctx)
	if err != nil || st.PodCIDR6 != "2001:2::/64" || st.Router6 != "2001:2::1" {
		t.Errorf("status: IPv6 pod CIDR %q router %q (%v)", st.PodCIDR6, st.Router6, err)
	}

	// An endpoint file of an older agent: no ip6.
	path := endpointFile(h.cfg.StateDir, "x", "a")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if rec["ip6"] != "2001:2::2" {
		t.Fatalf("endpoint file has ip6 %v", rec["ip6"])
	}
	delete(rec, "ip6")
	if b, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	h.restart()
	if got, err := h.a.GetEndpoint(ctx, "x", "a"); err != nil || got.IP6 != "2001:2::2" {
		t.Fatalf("after a restart: %+v, %v", got, err)
	}
	if info := installedEP(t, h, a.EpID); info.Addr6 != netip.MustParseAddr("2001:2::2") || info.LinkLocal6 != netip.MustParseAddr("fe80::2") {
		t.Fatalf("endpoint info after a restart %+v", info)
	}

	// Its endpoints have addresses of the stored range (or none): another range, or none,
	// is refused while they exist.
	h.a.Close()
	h.a = nil
	for _, cidr6 := range []netip.Prefix{netip.MustParsePrefix("2001:3::/64"), {}} {
		cfg := h.cfg
		cfg.PodCIDR6 = cidr6
		cfg.OpenKernel = func(Config) (Kernel, error) { return h.dp.reopen().kernel(), nil }
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "IPv6 pod CIDR") || !strings.Contains(err.Error(), "which endpoints use") {
			t.Errorf("restart with IPv6 pod CIDR %v: %v", cidr6, err)
		}
	}
}

// A dual-stack CNI endpoint's result has both addresses, each family's gateway and
// default route.
func TestDualStackCNIResult(t *testing.T) {
	h := newDualStackHarness(t)
	r := cniAdd(t, h, "c1", "eth0", "shop", "web")
	if r.IP != "198.18.0.2/32" || r.Gateway != "198.18.0.1" || r.IP6 != "2001:2::2/128" || r.Gateway6 != "fe80::1" || !slices.Equal(r.Routes, []string{"0.0.0.0/0", "::/0"}) {
		t.Fatalf("ADD result: %s via %s, %s via %s, routes %v", r.IP, r.Gateway, r.IP6, r.Gateway6, r.Routes)
	}
	if c, err := h.a.CNICheck(context.Background(), api.CNICheckRequest{CNIAttachment: api.CNIAttachment{ContainerID: "c1", IfName: "eth0"}}); err != nil || c.IP6 != r.IP6 {
		t.Fatalf("CHECK: %+v, %v", c, err)
	}
}

// An IPv4-only agent: no IPv6 address anywhere, none in its files.
func TestIPv4OnlyHasNoIPv6(t *testing.T) {
	h := newHarness(t)
	a := h.add("x", "a", nil)
	if a.IP6 != "" {
		t.Fatalf("IPv4-only endpoint has IPv6 address %s", a.IP6)
	}
	if info := installedEP(t, h, a.EpID); info.Addr6.IsValid() || info.LinkLocal6.IsValid() {
		t.Fatalf("IPv4-only endpoint info %+v", info)
	}
	ipc, _ := h.dp.snapshot()
	for p := range ipc {
		if p.Addr().Is6() && p.Bits() != 0 {
			t.Errorf("IPv4-only ipcache has %v", p)
		}
	}
	for _, path := range []string{endpointFile(h.cfg.StateDir, "x", "a"), statePath(h.cfg.StateDir)} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "ip6") || strings.Contains(string(b), "podCIDR6") {
			t.Errorf("%s mentions IPv6: %s", path, b)
		}
	}
	st, err := h.a.Status(context.Background())
	if err != nil || st.PodCIDR6 != "" || st.Router6 != "" {
		t.Errorf("IPv4-only status: %q %q (%v)", st.PodCIDR6, st.Router6, err)
	}
}

func TestConfigRefusesBadPodCIDR6(t *testing.T) {
	cfg := Config{PodCIDR: netip.MustParsePrefix("198.18.0.0/16"), PodCIDR6: netip.MustParsePrefix("2001:2::/120")}.WithDefaults()
	if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), "IPv6 pod CIDR 2001:2::/120: 8 host bits") {
		t.Fatalf("validate: %v", err)
	}
	cfg.PodCIDR6 = netip.MustParsePrefix("2001:2::5/64")
	if cfg = cfg.WithDefaults(); cfg.PodCIDR6 != netip.MustParsePrefix("2001:2::/64") || cfg.validate() != nil {
		t.Fatalf("an unmasked IPv6 range: %v, %v", cfg.PodCIDR6, cfg.validate())
	}
}

// Endpoints made without an IPv6 range have no IPv6 address: turning dual stack on under
// them is refused, saying why.
func TestRestartRefusesNewPodCIDR6UnderEndpoints(t *testing.T) {
	h := newHarness(t)
	h.add("x", "a", nil)
	h.a.Close()
	h.a = nil
	cfg := h.cfg
	cfg.PodCIDR6 = netip.MustParsePrefix("2001:2::/64")
	cfg.OpenKernel = func(Config) (Kernel, error) { return h.dp.reopen().kernel(), nil }
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "IPv6 pod CIDR 2001:2::/64 differs from the stored none, which endpoints use") {
		t.Fatalf("restart with an IPv6 range: %v", err)
	}
	h.dp = h.dp.reopen()
	h.start() // without one, as before
}

// policy trace takes an endpoint's IPv6 address and IPv6 CIDR peers, and ICMPv6.
func TestDualStackTrace(t *testing.T) {
	h := newDualStackHarness(t)
	ctx := context.Background()
	h.add("x", "a", map[string]string{"app": "a"})
	h.add("x", "b", map[string]string{"app": "b"})
	if _, err := h.apply("np.yaml", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-in, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: b}}}]
    ports: [{port: 80, protocol: TCP}]
  - from: [{ipBlock: {cidr: "2001:db8::/32"}}]
    ports: [{port: 443, protocol: TCP}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a-l7, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: a}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: b}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}], rules: {http: [{method: GET}]}}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-dns, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: b}}
  egress:
  - toCIDR: ["2001:db8::/32", "198.51.100.0/24"]
    toPorts: [{ports: [{port: "53", protocol: UDP}], rules: {dns: [{matchPattern: "*"}]}}]
  - toEndpoints: [{matchLabels: {app: a}}]
`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		from, to, proto string
		port            uint16
		allowed         bool
	}{
		{"2001:2::3", "2001:2::2", "TCP", 80, true},
		{"2001:2::3", "x/a", "TCP", 81, false},
		{"2001:db8::9", "2001:2::2", "TCP", 443, true},
		{"2001:db9::9", "2001:2::2", "TCP", 443, false},
		{"198.51.100.9", "x/a", "TCP", 443, false},
		{"x/b", "2001:2::2", "ICMPv6", 128, false},
		// L7 rules: redirected over both families (the fast path listens for IPv6 too).
		{"x/b", "x/a", "TCP", 8080, true},
		{"2001:2::3", "2001:2::2", "TCP", 8080, true},
		// DNS rules: the DNS proxy takes both families.
		{"x/b", "198.51.100.53", "UDP", 53, true},
		{"2001:2::3", "2001:db8::53", "UDP", 53, true},
	} {
		res, err := h.a.Trace(ctx, api.TraceRequest{From: c.from, To: c.to, Protocol: c.proto, Port: c.port})
		if err != nil {
			t.Errorf("trace %s -> %s %s %d: %v", c.from, c.to, c.proto, c.port, err)
			continue
		}
		if res.Allowed != c.allowed {
			t.Errorf("trace %s -> %s %s %d: allowed %v, want %v (%+v)", c.from, c.to, c.proto, c.port, res.Allowed, c.allowed, res)
		}
	}
}
