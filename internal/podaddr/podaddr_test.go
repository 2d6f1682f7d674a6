package podaddr_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/podaddr"
)

func TestAddrs(t *testing.T) {
	for _, c := range []struct {
		cidr4, cidr6, ip4, ip6, ll string
	}{
		{"198.18.0.0/24", "2001:2::/64", "198.18.0.5", "2001:2::5", "fe80::5"},
		{"198.18.0.0/24", "2001:2::/64", "198.18.0.255", "2001:2::ff", "fe80::ff"},
		{"198.18.0.0/16", "2001:2:0:7::/64", "198.18.1.2", "2001:2:0:7::102", "fe80::102"},
		// The IPv6 range may start anywhere, and have more host bits than needed.
		{"198.18.4.0/24", "2001:2::/48", "198.18.4.10", "2001:2::a", "fe80::a"},
		{"198.18.4.0/22", "2001:2::ab:0/112", "198.18.7.1", "2001:2::ab:301", "fe80::ab:301"},
		// Exactly as many host bits, and a range whose interface identifiers are not
		// all zero.
		{"198.18.0.0/24", "2001:2::1:0:0:100/120", "198.18.0.7", "2001:2::1:0:0:107", "fe80::1:0:0:107"},
		// Unmasked ranges count by their network address.
		{"198.18.0.9/24", "2001:2::9/64", "198.18.0.9", "2001:2::9", "fe80::9"},
	} {
		ip6, ll, err := podaddr.Addrs(netip.MustParsePrefix(c.cidr4), netip.MustParsePrefix(c.cidr6), netip.MustParseAddr(c.ip4))
		if err != nil || ip6 != netip.MustParseAddr(c.ip6) || ll != netip.MustParseAddr(c.ll) {
			t.Errorf("Addrs(%s, %s, %s) = %v, %v, %v; want %s, %s", c.cidr4, c.cidr6, c.ip4, ip6, ll, err, c.ip6, c.ll)
		}
	}
}

func TestAddrsIPv4Only(t *testing.T) {
	ip6, ll, err := podaddr.Addrs(netip.MustParsePrefix("198.18.0.0/24"), netip.Prefix{}, netip.MustParseAddr("198.18.0.5"))
	if err != nil || ip6.IsValid() || ll.IsValid() {
		t.Fatalf("IPv4-only: %v, %v, %v; want nothing", ip6, ll, err)
	}
}

func TestAddrsRefused(t *testing.T) {
	for _, c := range []struct {
		cidr4, cidr6, ip4, want string
	}{
		{"198.18.0.0/24", "2001:2::/64", "198.19.0.5", "not in the IPv4 pod range"},
		{"198.18.0.0/16", "2001:2::/120", "198.18.0.5", "fewer than the IPv4 pod range"},
		{"198.18.0.0/24", "198.18.1.0/24", "198.18.0.5", "not an IPv6 prefix"},
		{"198.18.0.0/24", "::ffff:198.18.1.0/120", "198.18.0.5", "IPv4-mapped"},
		{"198.18.0.0/24", "2001:2::/40", "198.18.0.5", "from /48 to /120"},
		{"198.18.0.0/28", "2001:2::/124", "198.18.0.5", "from /48 to /120"},
		// The router's offset: its link-local address is the host veths'.
		{"198.18.0.0/24", "2001:2::/64", "198.18.0.1", "router's"},
	} {
		_, _, err := podaddr.Addrs(netip.MustParsePrefix(c.cidr4), netip.MustParsePrefix(c.cidr6), netip.MustParseAddr(c.ip4))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Addrs(%s, %s, %s): error %v, want one saying %q", c.cidr4, c.cidr6, c.ip4, err, c.want)
		}
	}
}

func TestRouter6AndLinkLocal(t *testing.T) {
	if got := podaddr.Router6(netip.MustParsePrefix("2001:2::/64")); got != netip.MustParseAddr("2001:2::1") {
		t.Errorf("Router6 = %v", got)
	}
	if got := podaddr.LinkLocal(netip.MustParseAddr("2001:2::aa:bb:cc:dd")); got != netip.MustParseAddr("fe80::aa:bb:cc:dd") {
		t.Errorf("LinkLocal = %v", got)
	}
}
