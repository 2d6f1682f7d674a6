package mapstate

import (
	"math/rand"
	"reflect"
	"slices"
	"testing"

	"github.com/rampartnet/rampart/internal/policy"
)

// minimalCover is the canonical decomposition of lo..hi into port prefixes, computed top
// down over the binary trie of ports (an independent construction from SplitPortRange's
// greedy bottom-up one): a trie node fully inside the range is one prefix, a node
// overlapping it is split in two.
func minimalCover(lo, hi uint32, base uint32, plen uint8, out *[]PortPrefix) {
	size := uint32(1) << (16 - plen)
	end := base + size - 1
	if end < lo || base > hi {
		return
	}
	if lo <= base && end <= hi {
		*out = append(*out, PortPrefix{Port: uint16(base), Len: plen})
		return
	}
	minimalCover(lo, hi, base, plen+1, out)
	minimalCover(lo, hi, base+size/2, plen+1, out)
}

func checkSplit(t *testing.T, lo, hi uint16) {
	t.Helper()
	got := SplitPortRange(lo, hi)
	var want []PortPrefix
	minimalCover(uint32(lo), uint32(hi), 0, 0, &want)
	if !slices.Equal(got, want) {
		t.Fatalf("SplitPortRange(%d, %d) = %v, want %v", lo, hi, got, want)
	}
	// Independently of the reference: blocks are aligned, contiguous, in order, and cover
	// exactly lo..hi.
	next := uint32(lo)
	for _, p := range got {
		size := uint32(1) << (16 - p.Len)
		if uint32(p.Port)%size != 0 || uint32(p.Port) != next {
			t.Fatalf("SplitPortRange(%d, %d): block %v misaligned or not contiguous", lo, hi, p)
		}
		next += size
	}
	if next != uint32(hi)+1 {
		t.Fatalf("SplitPortRange(%d, %d) covers up to %d", lo, hi, next-1)
	}
}

func TestSplitPortRangeExhaustiveSmall(t *testing.T) {
	for lo := 0; lo < 300; lo++ {
		for hi := lo; hi < 300; hi++ {
			checkSplit(t, uint16(lo), uint16(hi))
		}
	}
	// The top of the port space, where 16-bit arithmetic would overflow.
	for lo := 65535 - 300; lo <= 65535; lo++ {
		for hi := lo; hi <= 65535; hi++ {
			checkSplit(t, uint16(lo), uint16(hi))
		}
	}
}

func TestSplitPortRangeRandomLarge(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 20000; i++ {
		a, b := uint16(rng.Intn(65536)), uint16(rng.Intn(65536))
		if a > b {
			a, b = b, a
		}
		checkSplit(t, a, b)
	}
}

func TestSplitPortRangeKnown(t *testing.T) {
	var oneToMax []PortPrefix // 1/16, 2/15, 4/14, ..., 32768/1
	for k := 0; k < 16; k++ {
		oneToMax = append(oneToMax, PortPrefix{Port: 1 << k, Len: uint8(16 - k)})
	}
	cases := []struct {
		lo, hi uint16
		want   []PortPrefix
	}{
		{0, 65535, []PortPrefix{{0, 0}}},
		{80, 80, []PortPrefix{{80, 16}}},
		{80, 81, []PortPrefix{{80, 15}}},
		{79, 81, []PortPrefix{{79, 16}, {80, 15}}},
		{1024, 2047, []PortPrefix{{1024, 6}}},
		{1, 65535, oneToMax},
		{65535, 65535, []PortPrefix{{65535, 16}}},
	}
	for _, c := range cases {
		if got := SplitPortRange(c.lo, c.hi); !slices.Equal(got, c.want) {
			t.Errorf("SplitPortRange(%d, %d) = %v, want %v", c.lo, c.hi, got, c.want)
		}
	}
	if got := SplitPortRange(10, 9); got != nil {
		t.Errorf("empty range gave %v", got)
	}
}

func TestExpandPort(t *testing.T) {
	cases := []struct {
		name string
		in   policy.PortRule
		want []l4
	}{
		{"single tcp", tcp(80), []l4{{policy.ProtoTCP, 80, 16}}},
		{"all udp ports", policy.PortRule{Protocol: policy.ProtoUDP}, []l4{{policy.ProtoUDP, 0, 0}}},
		{"any proto with port", policy.PortRule{Protocol: policy.ProtoAny, Port: 53}, []l4{
			{policy.ProtoTCP, 53, 16}, {policy.ProtoUDP, 53, 16}, {policy.ProtoSCTP, 53, 16}}},
		{"any proto all ports", policy.PortRule{Protocol: policy.ProtoAny}, []l4{
			{policy.ProtoTCP, 0, 0}, {policy.ProtoUDP, 0, 0}, {policy.ProtoSCTP, 0, 0}}},
		{"range", policy.PortRule{Protocol: policy.ProtoTCP, Port: 80, EndPort: 83}, []l4{{policy.ProtoTCP, 80, 14}}},
		{"range 81-84", policy.PortRule{Protocol: policy.ProtoSCTP, Port: 81, EndPort: 84}, []l4{
			{policy.ProtoSCTP, 81, 16}, {policy.ProtoSCTP, 82, 15}, {policy.ProtoSCTP, 84, 16}}},
		{"endport not above port", policy.PortRule{Protocol: policy.ProtoTCP, Port: 80, EndPort: 80}, []l4{{policy.ProtoTCP, 80, 16}}},
		{"icmp type 0 is exact", policy.PortRule{Protocol: policy.ProtoICMP, Port: 0, ICMPType: true}, []l4{{policy.ProtoICMP, 0, 16}}},
		{"icmpv6 type", policy.PortRule{Protocol: policy.ProtoICMPv6, Port: 128, ICMPType: true}, []l4{{policy.ProtoICMPv6, 128, 16}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := expandPort(c.in); !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestStaticL4(t *testing.T) {
	keys, named := staticL4(nil, false)
	if !slices.Equal(l4s(keys), []l4{anyL4}) || named != nil {
		t.Fatalf("no ports: got %v %v, want any-protocol", keys, named)
	}
	keys, named = staticL4([]policy.PortRule{tcp(80), {Name: "http", Protocol: policy.ProtoTCP}, tcp(80)}, false)
	if !slices.Equal(l4s(keys), []l4{{policy.ProtoTCP, 80, 16}}) || len(named) != 1 || named[0].Name != "http" {
		t.Fatalf("got %v %v", keys, named)
	}
	// Only named ports: no static keys at all (not "all ports").
	keys, _ = staticL4([]policy.PortRule{{Name: "http", Protocol: policy.ProtoTCP}}, false)
	if len(keys) != 0 {
		t.Fatalf("named-only rule got static keys %v", keys)
	}
}

func TestResolveNamed(t *testing.T) {
	set := namedPortSet{}
	set.add(map[string]NamedPort{"http": {Port: 8080, Protocol: policy.ProtoTCP}, "dns": {Port: 53, Protocol: policy.ProtoUDP}})
	set.add(map[string]NamedPort{"http": {Port: 8081, Protocol: policy.ProtoTCP}, "zero": {Port: 0, Protocol: policy.ProtoTCP}})
	cases := []struct {
		name string
		pr   policy.PortRule
		want []l4
	}{
		{"tcp union", policy.PortRule{Name: "http", Protocol: policy.ProtoTCP}, []l4{{policy.ProtoTCP, 8080, 16}, {policy.ProtoTCP, 8081, 16}}},
		{"protocol mismatch", policy.PortRule{Name: "dns", Protocol: policy.ProtoTCP}, nil},
		{"any protocol", policy.PortRule{Name: "dns", Protocol: policy.ProtoAny}, []l4{{policy.ProtoUDP, 53, 16}}},
		{"unknown name", policy.PortRule{Name: "nope", Protocol: policy.ProtoTCP}, nil},
		{"port zero declaration ignored", policy.PortRule{Name: "zero", Protocol: policy.ProtoTCP}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := l4s(dedupKeys(resolveNamed([]policy.PortRule{c.pr}, set, false)))
			if len(got) == 0 && len(c.want) == 0 {
				return
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

// l4s drops the L7 part of keys.
func l4s(keys []portKey) []l4 {
	var out []l4
	for _, k := range keys {
		out = append(out, k.l4)
	}
	return out
}

func TestL7Keys(t *testing.T) {
	get := policy.HTTPRule{Method: "GET"}
	post := policy.HTTPRule{Method: "POST"}
	l7 := func(port uint16, hs ...policy.HTTPRule) policy.PortRule {
		return policy.PortRule{Protocol: policy.ProtoTCP, Port: port, HTTP: hs}
	}
	tcp80 := l4{policy.ProtoTCP, 80, 16}
	cases := []struct {
		name  string
		ports []policy.PortRule
		deny  bool
		want  []portKey
	}{
		{"one L7 port", []policy.PortRule{l7(80, get)}, false, []portKey{{tcp80, true, []policy.HTTPRule{get}, nil}}},
		{"two toPorts entries on one port: union", []policy.PortRule{l7(80, get), l7(80, post, get)}, false,
			[]portKey{{tcp80, true, []policy.HTTPRule{get, post}, nil}}},
		{"a plain port rule on the same port allows every request", []policy.PortRule{l7(80, get), tcp(80)}, false,
			[]portKey{{tcp80, true, allowAllHTTP, nil}}},
		{"plain first", []policy.PortRule{tcp(80), l7(80, get)}, false, []portKey{{tcp80, true, allowAllHTTP, nil}}},
		{"an empty HTTP rule allows every request", []policy.PortRule{l7(80, get), l7(80, policy.HTTPRule{})}, false,
			[]portKey{{tcp80, true, allowAllHTTP, nil}}},
		{"a broader plain port stays a separate key", []policy.PortRule{l7(80, get), {Protocol: policy.ProtoTCP}}, false,
			[]portKey{{l4{policy.ProtoTCP, 0, 0}, false, nil, nil}, {tcp80, true, []policy.HTTPRule{get}, nil}}},
		{"deny rules ignore HTTP", []policy.PortRule{l7(80, get)}, true, []portKey{{tcp80, false, nil, nil}}},
		// Invalid L7 port rules yield nothing: fail closed.
		{"L7 on a range", []policy.PortRule{{Protocol: policy.ProtoTCP, Port: 80, EndPort: 90, HTTP: []policy.HTTPRule{get}}}, false, nil},
		{"L7 on ANY", []policy.PortRule{{Protocol: policy.ProtoAny, Port: 80, HTTP: []policy.HTTPRule{get}}}, false, nil},
		{"L7 on all ports", []policy.PortRule{{Protocol: policy.ProtoTCP, HTTP: []policy.HTTPRule{get}}}, false, nil},
		{"L7 without HTTP rules", []policy.PortRule{{Protocol: policy.ProtoTCP, Port: 80, HTTP: []policy.HTTPRule{}}}, false, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, _ := staticL4(c.ports, c.deny)
			if len(got) == 0 && len(c.want) == 0 {
				return
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}

	set := namedPortSet{}
	set.add(map[string]NamedPort{"http": {Port: 8080, Protocol: policy.ProtoTCP}, "any": {Port: 81, Protocol: policy.ProtoAny}, "dns": {Port: 53, Protocol: policy.ProtoUDP}})
	got := dedupKeys(resolveNamed([]policy.PortRule{
		{Protocol: policy.ProtoTCP, Name: "http", HTTP: []policy.HTTPRule{get}},
		{Protocol: policy.ProtoTCP, Name: "any", HTTP: []policy.HTTPRule{post}},
		{Protocol: policy.ProtoTCP, Name: "dns", HTTP: []policy.HTTPRule{post}},
		{Protocol: policy.ProtoAny, Name: "http", HTTP: []policy.HTTPRule{post}}, // invalid: nothing
	}, set, false))
	want := []portKey{
		{l4{policy.ProtoTCP, 81, 16}, true, []policy.HTTPRule{post}, nil},
		{l4{policy.ProtoTCP, 8080, 16}, true, []policy.HTTPRule{get}, nil},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("named L7 ports: got %+v, want %+v", got, want)
	}
}
