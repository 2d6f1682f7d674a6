package api

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/rampartnet/rampart/internal/tap"
)

// A match survives the trip through the API, and a bad one is an error.
func TestTapMatchRoundTrip(t *testing.T) {
	typ := uint8(3)
	for _, m := range []tap.Match{
		{Direction: tap.Both},
		{Direction: tap.Ingress, Protocol: tap.ProtoTCP, Ports: []tap.PortRange{{First: 80, Last: 80}, {First: 8000, Last: 8080}}, PeerPorts: []tap.PortRange{{First: 1024, Last: 65535}},
			PeerCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}},
		{Direction: tap.Egress, Protocol: tap.ProtoICMP, ICMPType: &typ},
	} {
		got, err := TapMatchOf(m).Match()
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("%v: round trip gave %v, %v", m, got, err)
		}
	}
	for _, bad := range []TapMatch{{Direction: "up"}, {Direction: "both", Protocol: "gre"}, {Direction: "both", Ports: []string{"0"}}, {Direction: "both", PeerCIDRs: []string{"x"}}} {
		if _, err := bad.Match(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
