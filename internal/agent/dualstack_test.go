package agent

import (
	"net/netip"
	"strings"
	"testing"
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
