package api

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand"
	"net/netip"
	"slices"
	"testing"

	"github.com/rampartnet/rampart/internal/testenv/alloc"
)

func TestPrefixListRoundTrip(t *testing.T) {
	var l PrefixList
	for _, s := range []string{"10.0.0.0/8", "10.1.2.3/32", "0.0.0.0/0", "10.0.0.0/8", "2001:db8::/32", "::/0", "::ffff:1.2.3.0/120", "2001:db8::1/128"} {
		l.Add(netip.MustParsePrefix(s))
	}
	if len(l.V4) != 5 || len(l.V6) != 3 {
		t.Fatalf("got %d IPv4 and %d IPv6 prefixes, want 5 and 3 (the mapped one as IPv4)", len(l.V4), len(l.V6))
	}
	var buf bytes.Buffer
	if n, err := l.WriteTo(&buf); err != nil || n != int64(buf.Len()) || n != l.EncodedSize() {
		t.Fatalf("WriteTo = %d, %v; wrote %d, EncodedSize %d", n, err, buf.Len(), l.EncodedSize())
	}
	back, err := ReadPrefixList(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.V4, l.V4) || !slices.Equal(back.V6, l.V6) {
		t.Fatalf("round trip: %v, want %v", back.Prefixes(), l.Prefixes())
	}
	if dups := back.Normalize(); dups != 1 || back.Len() != 7 {
		t.Errorf("Normalize removed %d, left %d", dups, back.Len())
	}
	if got := back.Prefixes()[0]; got != netip.MustParsePrefix("0.0.0.0/0") {
		t.Errorf("first prefix after sorting = %v", got)
	}
	if !back.Contains(netip.MustParsePrefix("1.2.3.0/24")) || back.Contains(netip.MustParsePrefix("10.0.0.0/9")) ||
		!back.Contains(netip.MustParsePrefix("2001:db8::1/128")) || back.Contains(netip.MustParsePrefix("2001:db8::/33")) {
		t.Error("Contains is wrong")
	}
}

func TestReadPrefixListRejects(t *testing.T) {
	good := func() []byte {
		l := PrefixList{V4: []uint64{V4Key(netip.MustParsePrefix("10.0.0.0/8"))}, V6: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}
		var b bytes.Buffer
		l.WriteTo(&b)
		return b.Bytes()
	}
	cases := map[string]func(b []byte) []byte{
		"magic":          func(b []byte) []byte { b[0] = 'X'; return b },
		"truncated":      func(b []byte) []byte { return b[:len(b)-1] },
		"v4 length":      func(b []byte) []byte { b[24+4] = 33; return b },
		"v4 host bits":   func(b []byte) []byte { b[24+3] = 1; return b },
		"v6 host bits":   func(b []byte) []byte { b[24+5+15] = 1; return b },
		"v6 length":      func(b []byte) []byte { b[24+5+16] = 129; return b },
		"absurd count":   func(b []byte) []byte { b[15] = 0x10; return b },
		"missing header": func(b []byte) []byte { return b[:10] },
	}
	for name, mutate := range cases {
		if _, err := ReadPrefixList(bytes.NewReader(mutate(good()))); !errors.Is(err, ErrBadPrefixList) {
			t.Errorf("%s: got %v, want ErrBadPrefixList", name, err)
		}
	}
}

func TestSortKeys(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, n := range []int{0, 1, 255, 256, 10000} {
		keys := make([]uint64, n)
		for i := range keys {
			keys[i] = V4Key(netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(rng.Intn(4)), byte(rng.Intn(256)), byte(rng.Intn(256)), byte(rng.Intn(256))}), 8+rng.Intn(25)))
		}
		want := slices.Clone(keys)
		slices.Sort(want)
		SortKeys(keys)
		if !slices.Equal(keys, want) {
			t.Fatalf("n=%d: radix sort differs", n)
		}
	}
}

func BenchmarkSortKeys10M(b *testing.B) {
	rng := rand.New(rand.NewSource(1))
	keys := make([]uint64, 10_000_000)
	for i := range keys {
		keys[i] = uint64(rng.Uint32())<<8 | 32
	}
	work := make([]uint64, len(keys))
	b.ResetTimer()
	for range b.N {
		copy(work, keys)
		SortKeys(work)
	}
}

// TestReadPrefixListAllocatesWhatArrives: a header that claims the largest list and a body
// that stops short cost what arrived, not the gigabyte the claim would take.
func TestReadPrefixListAllocatesWhatArrives(t *testing.T) {
	var b bytes.Buffer
	l := PrefixList{V4: make([]uint64, 1000)}
	for i := range l.V4 {
		l.V4[i] = V4Key(netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 32))
	}
	l.WriteTo(&b)
	data := b.Bytes()
	binary.LittleEndian.PutUint64(data[8:], MaxPrefixes) // claims 2^27, sends 1000
	var err error
	n := alloc.Bytes(func() { _, err = ReadPrefixList(bytes.NewReader(data)) })
	if !errors.Is(err, ErrBadPrefixList) {
		t.Fatalf("got %v, want ErrBadPrefixList", err)
	}
	if n > alloc.Bound(48<<20) {
		t.Errorf("reading 1000 of %d claimed prefixes allocated %d MiB, want < 48", MaxPrefixes, n>>20)
	}
}

// TestReadPrefixListStreams10M: a list of ten million prefixes streams in through a pipe
// (as over the socket), whole and in order, with room grown as it arrives rather than
// claimed at once.
func TestReadPrefixListStreams10M(t *testing.T) {
	if testing.Short() {
		t.Skip("10M prefixes: not in -short")
	}
	const n = 10_000_000
	l := PrefixList{V4: make([]uint64, n)}
	rng := rand.New(rand.NewSource(1))
	for i := range l.V4 {
		l.V4[i] = uint64(rng.Uint32())<<8 | 32 // host addresses, in random order
	}
	pr, pw := io.Pipe()
	go func() { _, err := l.WriteTo(pw); pw.CloseWithError(err) }()
	var back PrefixList
	var err error
	got := alloc.Bytes(func() { back, err = ReadPrefixList(pr) })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.V4, l.V4) {
		t.Fatal("10M prefixes came back different")
	}
	// 80 MB of keys, grown once from 32 MiB: about 112 MB allocated in all.
	if got > alloc.Bound(256<<20) {
		t.Errorf("reading 10M prefixes allocated %d MiB, want < 256", got>>20)
	}
}
