package egress

import (
	"bytes"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var testProbe6 = netip.MustParseAddr("2001:2:0:107::a")

func TestGenerate6(t *testing.T) {
	const n = 100_001
	list, err := Generate6(n, DefaultMix6, 42, testProbe6)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != n {
		t.Fatalf("%d prefixes, want %d", len(list), n)
	}
	if last := list[n-1]; last.NetIP() != netip.PrefixFrom(testProbe6, 128) {
		t.Errorf("last prefix %v, want the probe address", last)
	}
	byBits := map[uint8]int{}
	seen := map[Prefix6]bool{}
	in32, in48 := map[uint64]bool{}, map[uint64]bool{}
	for _, p := range list[:n-1] {
		byBits[p.Bits]++
		if seen[p] {
			t.Fatalf("prefix %v drawn twice", p)
		}
		seen[p] = true
		if p.NetIP().Masked() != p.NetIP() {
			t.Fatalf("prefix %v has host bits", p)
		}
		if p.Hi>>61 != 1 {
			t.Fatalf("%v is not in 2000::/3", p)
		}
		switch p.Bits {
		case 32:
			in32[p.Hi>>32] = true
		case 48:
			in48[p.Hi>>16] = true
		}
	}
	n32, n48, n128 := DefaultMix6.Counts(n - 1)
	if byBits[32] != n32 || byBits[48] != n48 || byBits[128] != n128 {
		t.Errorf("lengths %v, want %d /32, %d /48, %d /128", byBits, n32, n48, n128)
	}
	// The mix: 1 % /32, 10 % /48, the rest /128.
	if n32 != 1000 || n48 != 10000 || n128 != 89000 {
		t.Errorf("mix of %d: %d /32, %d /48, %d /128", n-1, n32, n48, n128)
	}
	// No drawn prefix inside another, none overlapping the benchmark's range.
	bench := benchRange6.NetIP()
	for _, p := range list[:n-1] {
		if p.Bits > 32 && in32[p.Hi>>32] || p.Bits > 48 && in48[p.Hi>>16] {
			t.Fatalf("%v is inside another drawn prefix", p)
		}
		if p.NetIP().Overlaps(bench) {
			t.Fatalf("%v overlaps the benchmark range %v", p, bench)
		}
	}
	for _, a := range []string{"2001:2::1", "2001:2:0:107::b", "2001:2:ffff:ffff:ffff:ffff:ffff:ffff"} {
		if Covers6(list[:n-1], netip.MustParseAddr(a)) {
			t.Errorf("a drawn prefix covers the benchmark address %s", a)
		}
	}
	if !Covers6(list, testProbe6) || Covers6(list, netip.MustParseAddr("2001:2:0:107::b")) {
		t.Error("the list must cover the probe address and not its neighbour")
	}

	again, _ := Generate6(n, DefaultMix6, 42, testProbe6)
	other, _ := Generate6(n, DefaultMix6, 43, testProbe6)
	checkSeededShuffled(t, list, again, other, func(p Prefix6) uint8 { return p.Bits })
}

func TestGenerate6Edges(t *testing.T) {
	one, err := Generate6(1, DefaultMix6, 1, testProbe6)
	if err != nil || len(one) != 1 || one[0].NetIP() != netip.PrefixFrom(testProbe6, 128) {
		t.Errorf("a list of one: %v %v", one, err)
	}
	if _, err := Generate6(0, DefaultMix6, 1, testProbe6); err == nil {
		t.Error("a list of none accepted")
	}
	for _, bad := range []string{"2001:db8::1", "198.19.7.10", "::ffff:198.19.7.10"} {
		if _, err := Generate6(10, DefaultMix6, 1, netip.MustParseAddr(bad)); err == nil {
			t.Errorf("probe address %s outside the benchmark range accepted", bad)
		}
	}
	// The /32 cap binds only above 1M.
	if n32, _, _ := DefaultMix6.Counts(MaxCount6); n32 != DefaultMix6.Max32 {
		t.Errorf("%d: %d /32", MaxCount6, n32)
	}
	if n32, _, _ := DefaultMix6.Counts(999_999); n32 != 9999 {
		t.Errorf("1M: %d /32", n32)
	}
}

func TestPrefix6Text(t *testing.T) {
	list := []Prefix6{
		prefix6Of(netip.MustParsePrefix("2a00:1450::/32")),
		prefix6Of(netip.MustParsePrefix("2600:1f18:1234::/48")),
		prefix6Of(netip.MustParsePrefix("2001:db8::1/128")),
	}
	var b bytes.Buffer
	if err := (List{V6: list}).WriteLines(&b, "add s ", "\n"); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != "add s 2a00:1450::/32\nadd s 2600:1f18:1234::/48\nadd s 2001:db8::1/128\n" {
		t.Errorf("written %q", got)
	}
	path := filepath.Join(t.TempDir(), "list")
	big, _ := Generate6(5000, DefaultMix6, 9, testProbe6)
	l := List{V6: big}
	if l.Len() != 5000 {
		t.Errorf("length %d", l.Len())
	}
	if err := writeFile(path, func(w io.Writer) error { return l.WriteLines(w, "", "\n") }); err != nil {
		t.Fatal(err)
	}
	back, err := ReadList6(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, big) {
		t.Error("a written list reads back different")
	}
	for _, bad := range []string{"2001:db8::1/64", "198.18.0.0/15", "2001:db8::/129", "::ffff:1.2.3.4/128", "x"} {
		if err := os.WriteFile(path, []byte("2001:db8::/32\n"+bad+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadList6(path); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("bad line %q: %v", bad, err)
		}
	}
}

func TestPrefix6Contains(t *testing.T) {
	for p, cases := range map[string]map[string]bool{
		"2001:2::/48":       {"2001:2::": true, "2001:2:0:ffff:1::1": true, "2001:3::": false, "2001:1:ffff::": false},
		"2001:2:0:107::/64": {"2001:2:0:107::a": true, "2001:2:0:108::a": false},
		"2001:db8::1/128":   {"2001:db8::1": true, "2001:db8::2": false},
		"::/0":              {"2001:db8::1": true},
	} {
		pp := prefix6Of(netip.MustParsePrefix(p))
		for a, want := range cases {
			if got := Covers6([]Prefix6{pp}, netip.MustParseAddr(a)); got != want {
				t.Errorf("%s contains %s: %v", p, a, got)
			}
		}
	}
}
