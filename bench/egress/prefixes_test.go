package egress

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var testProbe = netip.MustParseAddr("198.19.7.10")

func TestGenerate(t *testing.T) {
	const n = 200_001
	list, err := Generate(n, DefaultMix, 42, testProbe)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != n {
		t.Fatalf("%d prefixes, want %d", len(list), n)
	}
	if last := list[n-1]; last.NetIP() != netip.PrefixFrom(testProbe, 32) {
		t.Errorf("last prefix %v, want the probe address", last)
	}
	byBits := map[uint8]int{}
	seen := map[Prefix]bool{}
	for _, p := range list {
		byBits[p.Bits]++
		if seen[p] {
			t.Fatalf("prefix %v drawn twice", p)
		}
		seen[p] = true
		if p.Addr&^mask(p.Bits) != 0 {
			t.Fatalf("prefix %v has host bits", p)
		}
	}
	n16, n24, n32 := DefaultMix.Counts(n - 1)
	if byBits[16] != n16 || byBits[24] != n24 || byBits[32] != n32+1 {
		t.Errorf("lengths %v, want %d /16, %d /24, %d /32 (+ probe)", byBits, n16, n24, n32)
	}
	// The mix of the original benchmark: 1 % /16, 10 % /24.
	if n16 != 2000 || n24 != 20000 {
		t.Errorf("mix of %d: %d /16 and %d /24", n-1, n16, n24)
	}
	// No drawn prefix covers another, and none touches the benchmark's addresses.
	in16 := map[uint32]bool{}
	in24 := map[uint32]bool{}
	for _, p := range list[:n-1] {
		switch p.Bits {
		case 16:
			in16[p.Addr>>16] = true
		case 24:
			in24[p.Addr>>8] = true
		}
	}
	for _, p := range list[:n-1] {
		if p.Bits > 16 && in16[p.Addr>>16] || p.Bits > 24 && in24[p.Addr>>8] {
			t.Fatalf("%v is inside another drawn prefix", p)
		}
		first := p.Addr >> 24
		if first == 0 || first == 127 || first >= 224 || p.Addr>>16 == 169<<8|254 {
			t.Fatalf("%v is not global unicast space", p)
		}
	}
	for _, a := range []string{"198.18.0.1", "198.18.200.10", "198.19.7.11", "198.19.255.255"} {
		if Covers(list[:n-1], netip.MustParseAddr(a)) {
			t.Errorf("a drawn prefix covers the benchmark address %s", a)
		}
	}
	if !Covers(list, testProbe) || Covers(list, netip.MustParseAddr("198.19.7.11")) {
		t.Error("the list must cover the probe address and not its neighbour")
	}

	again, _ := Generate(n, DefaultMix, 42, testProbe)
	other, _ := Generate(n, DefaultMix, 43, testProbe)
	checkSeededShuffled(t, list, again, other, func(p Prefix) uint8 { return p.Bits })
}

// checkSeededShuffled checks a list drawn with a seed: again (the same seed) is the same
// list, other (another seed) another, and the lengths are mixed, not in blocks.
func checkSeededShuffled[P comparable](t *testing.T, list, again, other []P, bits func(P) uint8) {
	t.Helper()
	if !slices.Equal(list, again) {
		t.Error("the same seed gave another list")
	}
	if slices.Equal(list[:100], other[:100]) {
		t.Error("another seed gave the same list")
	}
	blocks := 0
	for i := 1; i < 1000; i++ {
		if bits(list[i]) != bits(list[i-1]) {
			blocks++
		}
	}
	if blocks < 50 {
		t.Errorf("only %d length changes in the first 1000 prefixes: not shuffled", blocks)
	}
}

func TestGenerateEdges(t *testing.T) {
	one, err := Generate(1, DefaultMix, 1, testProbe)
	if err != nil || len(one) != 1 || one[0].NetIP() != netip.PrefixFrom(testProbe, 32) {
		t.Errorf("a list of one: %v %v", one, err)
	}
	if _, err := Generate(0, DefaultMix, 1, testProbe); err == nil {
		t.Error("a list of none accepted")
	}
	if _, err := Generate(10, DefaultMix, 1, netip.MustParseAddr("8.8.8.8")); err == nil {
		t.Error("a probe address outside the benchmark range accepted")
	}
	// The /16 cap: 1 % of ten million is more than there are /16s.
	if n16, _, n32 := DefaultMix.Counts(10_000_000 - 1); n16 != DefaultMix.Max16 || n32 != 10_000_000-1-n16-999_999 {
		t.Errorf("10M: %d /16, %d /32", n16, n32)
	}
}

func TestPrefixText(t *testing.T) {
	list := []Prefix{{Addr: 0x01020300, Bits: 24}, {Addr: 0xc0a80001, Bits: 32}, {Addr: 0x0a000000, Bits: 8}}
	var b bytes.Buffer
	if err := WriteLines(&b, list, "add s ", "\n"); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != "add s 1.2.3.0/24\nadd s 192.168.0.1/32\nadd s 10.0.0.0/8\n" {
		t.Errorf("written %q", got)
	}
	for _, p := range list {
		if p.NetIP().String() != p.String() {
			t.Errorf("%v and %v differ", p.NetIP(), p)
		}
	}
	path := filepath.Join(t.TempDir(), "list")
	big, _ := Generate(5000, DefaultMix, 9, testProbe)
	if err := writeFile(path, func(w io.Writer) error { return WriteLines(w, big, "", "\n") }); err != nil {
		t.Fatal(err)
	}
	back, err := ReadList(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, big) {
		t.Error("a written list reads back different")
	}
	for _, bad := range []string{"1.2.3.4", "1.2.3.4/33", "1.2.3/24", "256.1.1.1/32", "1.2.3.4/24", "1.2.3.4/", "a.b.c.d/8", "1..2.3/8", "1.2.3.0/24x", "1234.1.1.1/32"} {
		if p, err := parsePrefix([]byte(bad)); err == nil {
			t.Errorf("%q parsed as %v", bad, p)
		}
	}
	for _, good := range []string{"0.0.0.0/0", "255.255.255.255/32", "10.0.0.0/8"} {
		p, err := parsePrefix([]byte(good))
		if err != nil || p.String() != good {
			t.Errorf("%q: %v %v", good, p, err)
		}
	}
	if err := os.WriteFile(path, []byte("1.2.3.0/24\nbad\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadList(path); err == nil || !bytes.Contains([]byte(err.Error()), []byte("line 2")) {
		t.Errorf("bad line: %v", err)
	}
}

func TestContains(t *testing.T) {
	p := Prefix{Addr: 0xc6120000, Bits: 15}
	for a, want := range map[string]bool{"198.18.0.0": true, "198.19.255.255": true, "198.20.0.0": false, "198.17.255.255": false} {
		b := netip.MustParseAddr(a).As4()
		if got := p.Contains(binary.BigEndian.Uint32(b[:])); got != want {
			t.Errorf("%v contains %s: %v", p, a, got)
		}
	}
	if !(Prefix{Bits: 0}).Contains(12345) {
		t.Error("/0 does not contain everything")
	}
}
