package cidrlist

import (
	"errors"
	"fmt"
	"math/rand"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
)

func TestParseCIDRList(t *testing.T) {
	data := "# threat list\r\n" +
		"192.0.2.0/24\r\n" +
		"  198.51.100.7   # a bare address is a /32\n" +
		"\n" +
		"\t \t\n" +
		"203.0.113.77/25\n" + // host bits cleared
		"0.0.0.0/0\n" +
		"255.255.255.255\n" +
		"2001:db8::/32\n" +
		"2001:db8::1\n" +
		"::ffff:10.1.2.3\n" + // IPv4-mapped: IPv4
		"10.0.0.0/8" // no newline at the end
	var progress atomic.Int64
	l, st, err := Parse("list.txt", []byte(data), &progress)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"192.0.2.0/24", "198.51.100.7/32", "203.0.113.0/25", "0.0.0.0/0", "255.255.255.255/32", "10.1.2.3/32", "10.0.0.0/8", "2001:db8::/32", "2001:db8::1/128"}
	var got []string
	for _, p := range l.Prefixes() {
		got = append(got, p.String())
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("prefixes %v\nwant %v", got, want)
	}
	if st.Lines != 12 || st.Entries != 9 || progress.Load() != int64(len(data)) {
		t.Errorf("stats %+v, progress %d of %d", st, progress.Load(), len(data))
	}
}

func TestParseCIDRListErrors(t *testing.T) {
	cases := []struct {
		line, reason string
	}{
		{"192.0.2.0/33", `invalid CIDR "192.0.2.0/33"`},
		{"192.0.2.256", `invalid address or CIDR "192.0.2.256"`},
		{"192.0.2", `invalid address or CIDR "192.0.2"`},
		{"192.0.2.1/", `invalid CIDR "192.0.2.1/"`},
		{"192.0.02.1", `invalid address or CIDR "192.0.02.1"`},
		{"192.0.2.1/08", `invalid CIDR "192.0.2.1/08"`},
		{"192.0.2.1 192.0.2.2", `unexpected text after "192.0.2.1" (one CIDR per line)`},
		{"192.0.2.0/24,", `invalid CIDR "192.0.2.0/24,"`},
		{"2001:db8::/129", `invalid CIDR "2001:db8::/129"`},
		{"fe80::1%eth0", `invalid address or CIDR "fe80::1%eth0"`},
		{"example.com", `invalid address or CIDR "example.com"`},
		{"-", `invalid address or CIDR "-"`},
	}
	for _, c := range cases {
		data := "10.0.0.0/8\n# comment\n\n" + c.line + "\n192.0.2.0/24\n"
		_, _, err := Parse("bad.txt", []byte(data), nil)
		var le *Error
		if !errors.As(err, &le) || le.Line != 4 || le.Reason != c.reason || err.Error() != "bad.txt:4: "+c.reason {
			t.Errorf("%q: got %v, want bad.txt:4: %s", c.line, err, c.reason)
		}
	}
}

// TestParseCIDRListChunks checks that parallel parsing gives the same list in the same
// order, and absolute line numbers for an error in any chunk.
func TestParseCIDRListChunks(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	var b strings.Builder
	var want []netip.Prefix
	for i := 0; b.Len() < 3<<20; i++ {
		switch rng.Intn(10) {
		case 0:
			b.WriteString("# comment\n")
			continue
		case 1:
			p := netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(rng.Intn(256))}), 40)
			fmt.Fprintf(&b, "%s\n", p)
			want = append(want, p.Masked())
			continue
		}
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(rng.Intn(256)), byte(rng.Intn(256)), byte(rng.Intn(256)), byte(rng.Intn(256))}), 8+rng.Intn(25))
		fmt.Fprintf(&b, "%s\r\n", p)
		want = append(want, p.Masked())
	}
	data := b.String()
	l, st, err := Parse("big.txt", []byte(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	var v4, v6 []netip.Prefix
	for _, p := range want {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	if !slices.Equal(l.Prefixes(), append(v4, v6...)) || st.Lines != strings.Count(data, "\n") {
		t.Fatalf("chunked parse differs: %d prefixes, %d lines", l.Len(), st.Lines)
	}
	// A bad line near the end (in the last chunk) is reported with its absolute number.
	lines := strings.SplitAfter(data, "\n")
	bad := len(lines) - 10
	lines[bad] = "10.0.0.0/99\n"
	_, _, err = Parse("big.txt", []byte(strings.Join(lines, "")), nil)
	if err == nil || err.Error() != fmt.Sprintf("big.txt:%d: invalid CIDR \"10.0.0.0/99\"", bad+1) {
		t.Fatalf("error %v, want line %d", err, bad+1)
	}
}

func TestParseCIDRArgs(t *testing.T) {
	l, err := ParseArgs([]string{"192.0.2.1", "10.0.0.0/8", "2001:db8::/32"})
	if err != nil || l.Len() != 3 || l.V4[0] != api.V4Key(netip.MustParsePrefix("192.0.2.1/32")) {
		t.Fatalf("got %v, %v", l.Prefixes(), err)
	}
	if _, err := ParseArgs([]string{"10.0.0.0/8", "nope"}); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("bad argument: %v", err)
	}
}

// BenchmarkParseCIDRList10M parses ten million IPv4 lines (about 10 % /24, 1 % /16, the
// rest /32, as the egress benchmark draws them).
func BenchmarkParseCIDRList10M(b *testing.B) {
	data := benchList(10_000_000)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for range b.N {
		if _, _, err := Parse("bench.txt", data, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func benchList(n int) []byte {
	rng := rand.New(rand.NewSource(1))
	var b strings.Builder
	b.Grow(n * 16)
	for range n {
		a := rng.Uint32()
		switch r := rng.Intn(100); {
		case r < 10:
			fmt.Fprintf(&b, "%d.%d.%d.0/24\n", a>>24, a>>16&0xff, a>>8&0xff)
		case r < 11:
			fmt.Fprintf(&b, "%d.%d.0.0/16\n", a>>24, a>>16&0xff)
		default:
			fmt.Fprintf(&b, "%d.%d.%d.%d\n", a>>24, a>>16&0xff, a>>8&0xff, a&0xff)
		}
	}
	return []byte(b.String())
}

// TestParseCIDRListLimit: a list with more IPv6 prefixes than the agent takes in one
// request is refused while parsing, naming the file.
func TestParseCIDRListLimit(t *testing.T) {
	var b strings.Builder
	for i := range api.MaxPrefixesV6 + 1 {
		fmt.Fprintf(&b, "2001:db8::%x:%x\n", i>>16, i&0xffff)
	}
	_, _, err := Parse("v6.txt", []byte(b.String()), nil)
	want := fmt.Sprintf("v6.txt: %d IPv6 prefixes exceed the limit of %d in one list", api.MaxPrefixesV6+1, api.MaxPrefixesV6)
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}
