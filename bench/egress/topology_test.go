package egress

import (
	"net/netip"
	"testing"
)

func TestRange6Of(t *testing.T) {
	for in, want := range map[string]string{"198.18.7.0/24": "2001:2:0:7::/64", "198.19.7.0/24": "2001:2:0:107::/64", "198.19.255.0/24": "2001:2:0:1ff::/64"} {
		got := range6Of(netip.MustParsePrefix(in), true)
		if got.String() != want || !benchRange6.NetIP().Contains(got.Addr()) {
			t.Errorf("range6Of(%s) = %v, want %s", in, got, want)
		}
	}
	if range6Of(netip.MustParsePrefix("198.18.7.0/24"), false).IsValid() {
		t.Error("an IPv4-only run got an IPv6 range")
	}
	probe, neighbour := worldAddrs6(netip.MustParsePrefix("198.19.7.0/24"))
	if probe.String() != "2001:2:0:107::a" || neighbour.String() != "2001:2:0:107::b" {
		t.Errorf("world addresses %v %v", probe, neighbour)
	}
}
