package identity

import (
	"encoding/json"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/rampartnet/rampart/internal/labels"
)

func TestForLabelsStableAndShared(t *testing.T) {
	a := NewAllocator()
	web := labels.Labels{"app": "web", labels.KeyNamespace: "x"}
	db := labels.Labels{"app": "db", labels.KeyNamespace: "x"}

	idWeb := a.ForLabels(web)
	if idWeb < FirstEndpoint || idWeb >= FirstCIDR {
		t.Fatalf("endpoint identity %d outside [%d, %d)", idWeb, FirstEndpoint, FirstCIDR)
	}
	// A different map with the same content (a replica) shares the identity.
	if got := a.ForLabels(labels.Labels{labels.KeyNamespace: "x", "app": "web"}); got != idWeb {
		t.Fatalf("replica got %d, want shared %d", got, idWeb)
	}
	idDB := a.ForLabels(db)
	if idDB == idWeb {
		t.Fatalf("different label sets share identity %d", idDB)
	}
	got, ok := a.Labels(idWeb)
	if !ok || !got.Equal(web) {
		t.Fatalf("Labels(%d) = %v, %v; want %v", idWeb, got, ok, web)
	}
	// The returned labels are a copy: changing them must not change the allocation.
	got["app"] = "evil"
	if again, _ := a.Labels(idWeb); again["app"] != "web" {
		t.Fatalf("Labels returned the allocator's own map")
	}
	// So is the stored one: changing the caller's map must not change the allocation.
	web["app"] = "changed"
	if again, _ := a.Labels(idWeb); again["app"] != "web" {
		t.Fatalf("allocator kept the caller's map")
	}
}

func TestLabelsKeyIsUnambiguous(t *testing.T) {
	a := NewAllocator()
	one := a.ForLabels(labels.Labels{"a": "b,c=d"})
	two := a.ForLabels(labels.Labels{"a": "b", "c": "d"})
	if one == two {
		t.Fatalf("label sets {a=b,c=d} (one label) and {a=b, c=d} (two) share identity %d", one)
	}
	empty := a.ForLabels(labels.Labels{})
	if empty == one || empty == two || a.ForLabels(nil) != empty {
		t.Fatalf("empty label set: got %d, nil gave %d", empty, a.ForLabels(nil))
	}
}

func TestForCIDR(t *testing.T) {
	a := NewAllocator()
	p := netip.MustParsePrefix("10.1.0.0/16")
	id := a.ForCIDR(p)
	if !IsCIDR(id) || id&EndpointCIDRFlag != 0 {
		t.Fatalf("CIDR identity %#x not in the CIDR range or flagged", id)
	}
	// Unmasked and IPv4-mapped spellings of the same network share the identity.
	if got := a.ForCIDR(netip.MustParsePrefix("10.1.2.3/16")); got != id {
		t.Fatalf("unmasked prefix got %d, want %d", got, id)
	}
	if got := a.ForCIDR(netip.MustParsePrefix("::ffff:10.1.0.0/112")); got != id {
		t.Fatalf("4in6 prefix got %d, want %d", got, id)
	}
	if got := a.ForCIDR(netip.MustParsePrefix("10.1.0.0/17")); got == id {
		t.Fatalf("different prefix length shares identity %d", id)
	}
	if got, ok := a.Prefix(id); !ok || got != p {
		t.Fatalf("Prefix(%d) = %v, %v", id, got, ok)
	}
	if got, ok := a.Prefix(id | EndpointCIDRFlag); !ok || got != p {
		t.Fatalf("Prefix(flagged) = %v, %v", got, ok)
	}
	if _, ok := a.Prefix(FirstEndpoint); ok {
		t.Fatalf("Prefix of an endpoint identity reported ok")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Errorf("ForCIDR on an invalid prefix did not panic")
			}
		}()
		a.ForCIDR(netip.Prefix{})
	}()
}

func TestReservedLabels(t *testing.T) {
	a := NewAllocator()
	l, ok := a.Labels(Host)
	if !ok || len(l) != 1 || !strings.HasPrefix(l.String(), "reserved:host") {
		t.Fatalf("Labels(Host) = %v, %v", l, ok)
	}
	if _, ok := a.Labels(FirstEndpoint + 1000); ok {
		t.Fatalf("unallocated identity reported ok")
	}
}

func TestRetainFreesAndDoesNotReuseSoon(t *testing.T) {
	a := NewAllocator()
	keep := labels.Labels{"app": "keep"}
	drop := labels.Labels{"app": "drop"}
	idKeep := a.ForLabels(keep)
	idDrop := a.ForLabels(drop)
	pKeep := netip.MustParsePrefix("10.0.0.0/8")
	pDrop := netip.MustParsePrefix("192.168.0.0/16")
	cKeep := a.ForCIDR(pKeep)
	cDrop := a.ForCIDR(pDrop)

	freed := a.Retain([]labels.Labels{{"app": "keep"}}, []netip.Prefix{netip.MustParsePrefix("10.9.9.9/8")})
	if len(freed) != 2 || freed[0] != idDrop || freed[1] != cDrop {
		t.Fatalf("freed %v, want [%d %d]", freed, idDrop, cDrop)
	}
	if _, ok := a.Labels(idDrop); ok {
		t.Fatalf("dropped identity still has labels")
	}
	if _, ok := a.Prefix(cDrop); ok {
		t.Fatalf("dropped CIDR identity still has a prefix")
	}
	if a.ForLabels(keep) != idKeep || a.ForCIDR(pKeep) != cKeep {
		t.Fatalf("retained identities changed")
	}
	// The dropped label set comes back with a new number, not its old one.
	if again := a.ForLabels(drop); again == idDrop || again == idKeep {
		t.Fatalf("re-allocated %d (old %d, kept %d)", again, idDrop, idKeep)
	}
	if again := a.ForCIDR(pDrop); again == cDrop || again == cKeep {
		t.Fatalf("re-allocated CIDR %d (old %d)", again, cDrop)
	}
}

func TestCursorWrapsToFreedNumbers(t *testing.T) {
	a := NewAllocator()
	// Put the cursor at the end of the range, as after 16.7M allocations.
	a.nextEndpoint = lastEndpoint
	first := a.ForLabels(labels.Labels{"n": "1"})
	if first != lastEndpoint {
		t.Fatalf("got %d, want %d", first, lastEndpoint)
	}
	second := a.ForLabels(labels.Labels{"n": "2"})
	if second != FirstEndpoint {
		t.Fatalf("after wrap got %d, want %d", second, FirstEndpoint)
	}
	third := a.ForLabels(labels.Labels{"n": "3"})
	if third != FirstEndpoint+1 {
		t.Fatalf("got %d, want %d", third, FirstEndpoint+1)
	}
}

// TestCIDRNeverReachesSetIdentities: at the end of the CIDR range the cursor wraps before
// FirstCIDRSet, and a saved cursor pointing into the set range is put back into range, so
// no prefix ever gets a CIDR set's fixed identity.
func TestCIDRNeverReachesSetIdentities(t *testing.T) {
	a := NewAllocator()
	a.nextCIDR = FirstCIDRSet - 1
	last := a.ForCIDR(netip.MustParsePrefix("10.0.0.0/8"))
	if last != FirstCIDRSet-1 || !IsCIDR(last) {
		t.Fatalf("got %#x, want %#x (a CIDR identity)", last, FirstCIDRSet-1)
	}
	if next := a.ForCIDR(netip.MustParsePrefix("11.0.0.0/8")); next != FirstCIDR {
		t.Fatalf("after the end of the range got %#x, want %#x", next, FirstCIDR)
	}

	var b Allocator
	if err := json.Unmarshal([]byte(`{"nextCIDR":2147483393}`), &b); err != nil {
		t.Fatal(err)
	}
	if got := b.ForCIDR(netip.MustParsePrefix("1.0.0.0/8")); got != FirstCIDR {
		t.Fatalf("cursor inside the set range: got %#x, want %#x", got, FirstCIDR)
	}
}

func TestCIDRSetIdentities(t *testing.T) {
	for i := uint8(0); i < MaxCIDRSets; i++ {
		id := CIDRSet(i)
		if id != 0x7FFFFF00+Identity(i) {
			t.Fatalf("CIDRSet(%d) = %#x", i, id)
		}
		if got, ok := IsCIDRSet(id); !ok || got != i {
			t.Fatalf("IsCIDRSet(%#x) = %d, %v", id, got, ok)
		}
		if IsCIDR(id) || IsCIDR(id|EndpointCIDRFlag) {
			t.Fatalf("set identity %#x counts as a prefix's CIDR identity", id)
		}
	}
	for _, id := range []Identity{FirstCIDRSet - 1, FirstCIDRSet + MaxCIDRSets, World, FirstCIDR} {
		if _, ok := IsCIDRSet(id); ok {
			t.Errorf("IsCIDRSet(%#x) = true", id)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("CIDRSet(32) did not panic")
		}
	}()
	CIDRSet(MaxCIDRSets)
}

func TestFindFreeSkipsUsedAndReportsExhaustion(t *testing.T) {
	a := NewAllocator()
	cursor := Identity(10)
	used := map[Identity]bool{10: true, 11: true, 12: true, 13: true}
	id, ok := a.findFree(&cursor, 10, 13, func(i Identity) bool { return used[i] })
	if ok {
		t.Fatalf("full range returned %d", id)
	}
	delete(used, 11)
	cursor = 12
	id, ok = a.findFree(&cursor, 10, 13, func(i Identity) bool { return used[i] })
	if !ok || id != 11 || cursor != 12 {
		t.Fatalf("got %d %v cursor %d, want 11 true cursor 12", id, ok, cursor)
	}
}

func TestJSONRoundTripKeepsNumbersAndCursors(t *testing.T) {
	a := NewAllocator()
	web := a.ForLabels(labels.Labels{"app": "web"})
	gone := a.ForLabels(labels.Labels{"app": "gone"})
	cidr := a.ForCIDR(netip.MustParsePrefix("10.0.0.0/8"))
	v6 := a.ForCIDR(netip.MustParsePrefix("2001:db8::/32"))
	a.Retain([]labels.Labels{{"app": "web"}}, []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32"),
	})

	data, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var b Allocator
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatalf("unmarshal %s: %v", data, err)
	}
	if got := b.ForLabels(labels.Labels{"app": "web"}); got != web {
		t.Fatalf("after restore web = %d, want %d", got, web)
	}
	if got := b.ForCIDR(netip.MustParsePrefix("10.0.0.0/8")); got != cidr {
		t.Fatalf("after restore cidr = %d, want %d", got, cidr)
	}
	if got := b.ForCIDR(netip.MustParsePrefix("2001:db8::/32")); got != v6 {
		t.Fatalf("after restore v6 = %d, want %d", got, v6)
	}
	// The cursor survived: the number freed before the restart is not reused after it.
	if got := b.ForLabels(labels.Labels{"app": "new"}); got == gone || got == web {
		t.Fatalf("after restore new label set got %d (freed %d, web %d)", got, gone, web)
	}
	if list := b.List(); len(list) != 4 {
		t.Fatalf("List = %+v, want 4 entries", list)
	}
}

func TestUnmarshalRejectsBadState(t *testing.T) {
	cases := map[string]string{
		"endpoint out of range": `{"endpoints":[{"identity":5,"labels":{"a":"b"}}]}`,
		"cidr out of range":     `{"cidrs":[{"identity":300,"prefix":"10.0.0.0/8"}]}`,
		"cidr flagged":          `{"cidrs":[{"identity":2147483649,"prefix":"10.0.0.0/8"}]}`,
		"cidr set identity":     `{"cidrs":[{"identity":2147483392,"prefix":"10.0.0.0/8"}]}`,
		"duplicate id":          `{"endpoints":[{"identity":300,"labels":{"a":"b"}},{"identity":300,"labels":{"a":"c"}}]}`,
		"duplicate labels":      `{"endpoints":[{"identity":300,"labels":{"a":"b"}},{"identity":301,"labels":{"a":"b"}}]}`,
		"duplicate prefix":      `{"cidrs":[{"identity":16777216,"prefix":"10.0.0.0/8"},{"identity":16777217,"prefix":"10.0.0.0/8"}]}`,
		"unmasked prefix":       `{"cidrs":[{"identity":16777216,"prefix":"10.1.0.0/8"}]}`,
		"missing prefix":        `{"cidrs":[{"identity":16777216}]}`,
		"not json":              `{`,
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			a := NewAllocator()
			id := a.ForLabels(labels.Labels{"keep": "me"})
			if err := a.UnmarshalJSON([]byte(in)); err == nil {
				t.Fatalf("accepted %s", in)
			} else if !strings.Contains(err.Error(), "identity state") {
				t.Fatalf("error lacks context: %v", err)
			}
			if got := a.ForLabels(labels.Labels{"keep": "me"}); got != id {
				t.Fatalf("failed restore changed state: %d, want %d", got, id)
			}
		})
	}
}

func TestUnmarshalFixesCursorsOutOfRange(t *testing.T) {
	var a Allocator
	if err := json.Unmarshal([]byte(`{"nextEndpoint":3,"nextCIDR":0,"endpoints":[{"identity":256,"labels":{}}]}`), &a); err != nil {
		t.Fatal(err)
	}
	if got := a.ForLabels(labels.Labels{"x": "y"}); got != FirstEndpoint+1 {
		t.Fatalf("got %d, want %d", got, FirstEndpoint+1)
	}
	if got := a.ForCIDR(netip.MustParsePrefix("1.0.0.0/8")); got != FirstCIDR {
		t.Fatalf("got %d, want %d", got, FirstCIDR)
	}
}

func TestConcurrentAllocationSharesNumbers(t *testing.T) {
	a := NewAllocator()
	var wg sync.WaitGroup
	ids := make([]Identity, 16)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = a.ForLabels(labels.Labels{"app": "same"})
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent callers got different identities: %v", ids)
		}
	}
}

// Claim gives a label set the number the cluster chose: what the allocator held for the
// number or for the labels yields, a claimed number is not handed to other labels, and a
// reserved number is refused.
func TestClaim(t *testing.T) {
	a := NewAllocator()
	mine := labels.Labels{"pod": "a"}
	theirs := labels.Labels{"pod": "b"}
	idA := a.ForLabels(mine)
	if err := a.Claim(theirs, idA+1); err != nil {
		t.Fatal(err)
	}
	if got := a.ForLabels(theirs); got != idA+1 {
		t.Fatalf("claimed labels got %d, want %d", got, idA+1)
	}
	if err := a.Claim(theirs, idA+1); err != nil {
		t.Errorf("claiming again the same number: %v", err)
	}
	if got := a.ForLabels(labels.Labels{"pod": "c"}); got == idA+1 || got == idA {
		t.Errorf("new labels got a taken number %d", got)
	}
	// The number of other labels here: theirs now, mine get another.
	if err := a.Claim(theirs, idA); err != nil {
		t.Fatal(err)
	}
	if l, ok := a.Labels(idA); !ok || !maps.Equal(l, theirs) {
		t.Errorf("identity %d has labels %v, want %v", idA, l, theirs)
	}
	if _, ok := a.Labels(idA + 1); ok {
		t.Errorf("identity %d still held after its labels claimed %d", idA+1, idA)
	}
	if got := a.ForLabels(mine); got == idA || got == idA+1 {
		t.Errorf("labels whose number was claimed got %d again", got)
	}
	if err := a.Claim(labels.Labels{"pod": "d"}, Host); err == nil {
		t.Error("claimed a reserved identity")
	}
}

// TestCloneIsIndependentAndEqual: a clone saves as the original does, and allocating or
// releasing in either leaves the other as it was.
func TestCloneIsIndependentAndEqual(t *testing.T) {
	a := NewAllocator()
	x := labels.Labels{"app": "x"}
	a.ForLabels(x)
	a.ForLabels(labels.Labels{"app": "y"})
	a.ForCIDR(netip.MustParsePrefix("198.18.0.0/24"))
	a.ForCIDR(netip.MustParsePrefix("198.18.1.0/24"))
	c := a.Clone()
	want, _ := a.MarshalJSON()
	got, _ := c.MarshalJSON()
	if string(got) != string(want) {
		t.Fatalf("clone saves as\n%s\nthe original as\n%s", got, want)
	}
	c.ForLabels(labels.Labels{"app": "z"})
	c.ForCIDR(netip.MustParsePrefix("198.18.2.0/24"))
	c.Retain([]labels.Labels{x}, nil)
	x["app"] = "changed" // a caller's map: neither allocator may share it
	if after, _ := a.MarshalJSON(); string(after) != string(want) {
		t.Errorf("changing the clone changed the original:\n%s", after)
	}
	zc := c.ForLabels(labels.Labels{"app": "z"})
	if l, ok := a.Labels(zc); ok {
		t.Errorf("the original knows the clone's new identity %d (%v)", zc, l)
	}
}
