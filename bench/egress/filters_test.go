package egress

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"
)

// TestPrepareFamily checks the set-up files the netfilter peers write for each family:
// the commands and set types of IPv6 where the list is IPv6.
func TestPrepareFamily(t *testing.T) {
	v4 := List{V4: []Prefix{{Addr: 0x01020300, Bits: 24}}}
	v6 := List{V6: []Prefix6{prefix6Of(netip.MustParsePrefix("2600:1f18:1234::/48"))}}
	for _, c := range []struct {
		name string
		list List
		fam  family
		want map[string][]string // filter -> lines its file must hold
	}{
		{"IPv4", v4, familyOf(false), map[string][]string{
			FilterIptables: {"-A OUTPUT -o eth0 -d 1.2.3.0/24 -j DROP"},
			FilterIpset:    {"create rpbench hash:net family inet maxelem 65536", "add rpbench 1.2.3.0/24"},
			FilterNft:      {"table ip rpbench {", "type ipv4_addr", "1.2.3.0/24,", `oifname "eth0" ip daddr @deny drop`},
		}},
		{"IPv6", v6, familyOf(true), map[string][]string{
			FilterIptables: {"-A OUTPUT -o eth0 -d 2600:1f18:1234::/48 -j DROP"},
			FilterIpset:    {"create rpbench hash:net family inet6 maxelem 65536", "add rpbench 2600:1f18:1234::/48"},
			FilterNft:      {"table ip6 rpbench {", "type ipv6_addr", "2600:1f18:1234::/48,", `oifname "eth0" ip6 daddr @deny drop`},
		}},
	} {
		nb := netfilterBase{fam: c.fam, iptables: "legacy"}
		for _, f := range []interface {
			filter
			file() string
		}{&iptablesFilter{netfilterBase: nb}, &ipsetFilter{nb}, &nftFilter{nb}} {
			if err := f.Prepare(context.Background(), c.list, "", t.TempDir()); err != nil {
				t.Fatalf("%s %s: %v", c.name, f.Name(), err)
			}
			b, err := os.ReadFile(f.file())
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range c.want[f.Name()] {
				if !strings.Contains(string(b), line+"\n") {
					t.Errorf("%s %s: no line %q in\n%s", c.name, f.Name(), line, b)
				}
			}
		}
	}
	if got := (&netfilterBase{fam: familyOf(true), iptables: "nft"}).ipt(); got != "ip6tables-nft" {
		t.Errorf("IPv6 iptables command %q", got)
	}
}

func (b *netfilterBase) file() string { return b.input }
