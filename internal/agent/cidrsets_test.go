package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv"
)

var bg = context.Background()

func prefixes(ss ...string) api.PrefixList {
	var l api.PrefixList
	for _, s := range ss {
		if !strings.Contains(s, "/") {
			a := netip.MustParseAddr(s)
			s = netip.PrefixFrom(a, a.BitLen()).String()
		}
		l.Add(netip.MustParsePrefix(s))
	}
	return l
}

func (h *harness) load(name string, ss ...string) api.CIDRSetChange {
	h.t.Helper()
	res, err := h.a.LoadCIDRSet(bg, api.CIDRSetRequest{Name: name, Source: "file test.txt", Prefixes: prefixes(ss...)})
	if err != nil {
		h.t.Fatalf("loading %s: %v", name, err)
	}
	return res
}

// member reports whether the fake dataplane has addr in set index.
func (h *harness) member(addr string, index uint8) bool {
	h.t.Helper()
	m, err := h.dp.CIDRSetMembership(netip.MustParseAddr(addr))
	if err != nil {
		h.t.Fatal(err)
	}
	return m&(1<<index) != 0
}

// denyThreats blocks egress from x/a to the CIDR group "threats".
const denyThreats = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: block, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  egressDeny:
  - toCIDRSet: [{cidrGroupRef: threats}]
  enableDefaultDeny: {egress: false}
`

const threatsGroup = `apiVersion: cilium.io/v2alpha1
kind: CiliumCIDRGroup
metadata: {name: threats}
spec:
  externalCIDRs: [203.0.113.0/24, 198.51.100.7/32]
`

// egressEntries returns the egress entries of endpoint epID for identity id.
func (h *harness) egressEntries(epID uint32, id identity.Identity) []mapstate.Value {
	h.t.Helper()
	_, eps := h.dp.snapshot()
	var out []mapstate.Value
	for _, ep := range eps {
		if ep.info.EpID != epID {
			continue
		}
		for k, v := range ep.pol.Entries {
			if k.Identity == id && k.Direction == policy.Egress {
				out = append(out, v)
			}
		}
	}
	return out
}

// A change's answer says where its time went, so that a slow load can be explained: the
// decoding of the body (before the agent got the request), the table rebuild, the files,
// each within the whole and in order.
func TestCIDRSetChangeTiming(t *testing.T) {
	h := newHarness(t)
	const decode, rebuild = 30 * time.Millisecond, 20 * time.Millisecond
	h.dp.fakeCIDRSets.mu.Lock()
	h.dp.replaceDelay = rebuild
	h.dp.fakeCIDRSets.mu.Unlock()
	check := func(what string, tm *api.CIDRSetTiming, minReceive, minDataplane, maxDataplane time.Duration) {
		t.Helper()
		if tm == nil {
			t.Fatalf("%s: no timing", what)
		}
		stages := tm.ReceiveMs + tm.SortMs + tm.WaitMs + tm.DataplaneMs + tm.PolicyMs + tm.PersistMs
		if tm.ReceiveMs < ms(minReceive) || tm.DataplaneMs < ms(minDataplane) || tm.DataplaneMs > ms(maxDataplane) ||
			tm.PersistMs <= 0 || stages > tm.TotalMs+0.01 {
			t.Errorf("%s: timing %+v (stages add up to %.3f ms)", what, *tm, stages)
		}
	}
	res, err := h.a.LoadCIDRSet(bg, api.CIDRSetRequest{Name: "threats", Prefixes: prefixes("203.0.113.0/24"), Received: time.Now().Add(-decode)})
	if err != nil {
		t.Fatal(err)
	}
	check("load", res.Timing, decode, rebuild, time.Hour)
	// In place: no rebuild.
	res, err = h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "threats", Prefixes: prefixes("198.51.100.7")})
	if err != nil || !res.InPlace {
		t.Fatalf("add: %+v, %v", res, err)
	}
	check("add", res.Timing, 0, 0, rebuild)
}

func TestCIDRSetLoadAndDenyPolicy(t *testing.T) {
	h := newHarness(t)
	a := h.add("x", "a", map[string]string{"pod": "a"})
	res := h.load("threats", "203.0.113.0/24", "198.51.100.7", "203.0.113.0/24", "2001:db8::/32")
	if res.Action != "created" || res.Given != 4 || res.Duplicates != 1 || res.Added != 3 || res.Set.Index != 0 ||
		res.Set.Identity != identity.CIDRSet(0) || res.Set.IPv4 != 2 || res.Set.IPv6 != 1 || res.Set.LastLoad == nil ||
		res.Set.ByLength["v4/24"] != 1 || res.Set.ByLength["v4/32"] != 1 || res.Set.ByLength["v6/32"] != 1 ||
		res.Set.AgentBytes != 2*8+32 || res.Set.MemoryBytes != 1<<20+2*8+32 || res.Set.LastLoad.DataplaneBytes != 1<<20 ||
		res.Set.LastLoad.TotalPrefixes != 3 || res.Set.LastLoad.BytesPerPrefix != float64(1<<20)/3 {
		t.Fatalf("load result %+v (set %+v)", res, res.Set)
	}
	if !h.member("203.0.113.9", 0) || !h.member("198.51.100.7", 0) || h.member("198.51.100.8", 0) || !h.member("2001:db8::1", 0) {
		t.Fatal("dataplane set 0 has the wrong members")
	}
	// No policy names the set yet: no entry has its identity.
	if got := h.egressEntries(a.EpID, identity.CIDRSet(0)); len(got) != 0 {
		t.Fatalf("entries before any policy: %+v", got)
	}
	if _, err := h.apply("deny.yaml", denyThreats); err != nil {
		t.Fatal(err)
	}
	got := h.egressEntries(a.EpID, identity.CIDRSet(0))
	if len(got) != 1 || !got[0].Deny {
		t.Fatalf("egress entries for the set: %+v", got)
	}
	// Trace names the set that decided.
	tr, err := h.a.Trace(bg, api.TraceRequest{From: "x/a", To: "203.0.113.9", Port: 443, Protocol: "TCP"})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Allowed || len(tr.Sides) != 1 || tr.Sides[0].CIDRGroup != "threats" || tr.Sides[0].Rule == nil ||
		tr.Sides[0].Rule.Rule != "spec.egressDeny[0]" || !slices.Equal(tr.ToCIDRGroups, []string{"threats"}) {
		t.Fatalf("trace %+v", tr)
	}
	tr, err = h.a.Trace(bg, api.TraceRequest{From: "x/a", To: "198.51.100.8", Port: 443, Protocol: "TCP"})
	if err != nil || !tr.Allowed || tr.Sides[0].CIDRGroup != "" {
		t.Fatalf("trace of the neighbour: %+v, %v", tr, err)
	}
	sets, _ := h.a.ListCIDRSets(bg)
	if len(sets) != 1 || !slices.Equal(sets[0].ReferencedBy, []string{"CiliumNetworkPolicy/x/block"}) {
		t.Fatalf("list %+v", sets)
	}
	// Loading the same content again changes nothing.
	n := len(h.dp.calls())
	if res := h.load("threats", "2001:db8::/32", "198.51.100.7/32", "203.0.113.0/24"); res.Action != "unchanged" || len(h.dp.calls()) != n {
		t.Fatalf("reload of equal content: %s, %d set calls", res.Action, len(h.dp.calls())-n)
	}
	// A reload replaces the content in one switch.
	res = h.load("threats", "192.0.2.0/24")
	if res.Action != "replaced" || res.Added != 1 || res.Removed != 3 || res.Set.Index != 0 {
		t.Fatalf("replace result %+v", res)
	}
	if c := h.dp.calls(); c[len(c)-1].op != "replace" || h.member("203.0.113.9", 0) || !h.member("192.0.2.1", 0) {
		t.Fatalf("after replace: calls %+v", c)
	}
}

func TestCIDRSetBadRequests(t *testing.T) {
	h := newHarness(t)
	var e *api.Error
	if _, err := h.a.LoadCIDRSet(bg, api.CIDRSetRequest{Name: "Bad_Name"}); !errors.As(err, &e) || e.Status != http.StatusBadRequest {
		t.Errorf("bad name: %v", err)
	}
	if _, err := h.a.RemoveCIDRs(bg, api.CIDRSetRequest{Name: "nope", Prefixes: prefixes("10.0.0.0/8")}); !api.IsNotFound(err) {
		t.Errorf("remove from a missing set: %v", err)
	}
	if _, err := h.a.DeleteCIDRSet(bg, "nope", false); !api.IsNotFound(err) {
		t.Errorf("delete of a missing set: %v", err)
	}
	if _, err := h.a.GetCIDRSet(bg, "nope"); !api.IsNotFound(err) {
		t.Errorf("get of a missing set: %v", err)
	}
}

func TestCIDRSetGroupBeforePolicyAndBack(t *testing.T) {
	h := newHarness(t)
	a := h.add("x", "a", map[string]string{"pod": "a"})
	before := len(h.dp.applied)
	res, err := h.apply("both.yaml", threatsGroup+"---\n"+denyThreats)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changes) != 2 || res.Changes[0].Kind != "CiliumCIDRGroup" || res.Changes[0].Action != "created" {
		t.Fatalf("changes %+v", res.Changes)
	}
	// The set's content reached the dataplane before the entries that name it.
	calls := h.dp.calls()
	if len(calls) != 1 || calls[0].op != "replace" || calls[0].sets[0] != 2 {
		t.Fatalf("set calls %+v", calls)
	}
	var firstEP int64
	for _, ap := range h.dp.applied[before:] {
		if ap.epID == a.EpID {
			firstEP = ap.seq
			break
		}
	}
	if firstEP == 0 || firstEP < calls[0].seq {
		t.Fatalf("endpoint updated at %d, set loaded at %d: the policy came first", firstEP, calls[0].seq)
	}
	s, err := h.a.GetCIDRSet(bg, "threats")
	if err != nil || !strings.HasPrefix(s.Source, "CiliumCIDRGroup both.yaml: document 1") {
		t.Fatalf("set %+v, %v", s, err)
	}
	// Applying the same group again is unchanged; a changed group replaces the set.
	if res, err := h.apply("g.yaml", threatsGroup); err != nil || res.Changes[0].Action != "unchanged" {
		t.Fatalf("reapply: %+v, %v", res, err)
	}
	if res, err := h.apply("g.yaml", strings.Replace(threatsGroup, "203.0.113.0/24, ", "", 1)); err != nil || res.Changes[0].Action != "configured" {
		t.Fatalf("changed group: %+v, %v", res, err)
	}
	if h.member("203.0.113.9", 0) || !h.member("198.51.100.7", 0) {
		t.Fatal("changed group not in the dataplane")
	}

	// Deleting the group alone is refused while the policy names it.
	_, err = h.a.Delete(bg, api.DeleteRequest{Documents: []api.Document{{Source: "g.yaml", Data: threatsGroup}}})
	var e *api.Error
	if !errors.As(err, &e) || e.Status != http.StatusConflict || !strings.Contains(err.Error(), "CiliumNetworkPolicy/x/block") {
		t.Fatalf("delete of a named group: %v", err)
	}
	if _, err := h.a.GetCIDRSet(bg, "threats"); err != nil {
		t.Fatal("refused delete removed the set")
	}
	// Both together: the policy goes first, then the set.
	n := len(h.dp.calls())
	if _, err := h.a.Delete(bg, api.DeleteRequest{Documents: []api.Document{{Source: "both.yaml", Data: threatsGroup + "---\n" + denyThreats}}}); err != nil {
		t.Fatal(err)
	}
	if got := h.egressEntries(a.EpID, identity.CIDRSet(0)); len(got) != 0 {
		t.Fatalf("entries left: %+v", got)
	}
	calls = h.dp.calls()[n:]
	if len(calls) != 1 || calls[0].op != "replace" || len(calls[0].sets) != 0 {
		t.Fatalf("set calls of the delete: %+v", calls)
	}
	if _, err := os.Stat(setFilePath(h.cfg.StateDir, "threats")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("set file left: %v", err)
	}
}

func TestCIDRSetMissingGroupSelectsNothing(t *testing.T) {
	h := newHarness(t)
	a := h.add("x", "a", map[string]string{"pod": "a"})
	if _, err := h.apply("deny.yaml", denyThreats); err != nil {
		t.Fatalf("a policy naming a missing group is accepted (as in Cilium): %v", err)
	}
	pols, _ := h.a.ListPolicies(bg)
	if len(pols) != 1 || !slices.Equal(pols[0].MissingCIDRGroups, []string{"threats"}) {
		t.Fatalf("policies %+v", pols)
	}
	tr, err := h.a.Trace(bg, api.TraceRequest{From: "x/a", To: "203.0.113.9", Port: 443, Protocol: "TCP"})
	if err != nil || !tr.Allowed || !strings.Contains(tr.Diagnostic, "threats") {
		t.Fatalf("trace %+v, %v", tr, err)
	}
	// Creating the group later makes the policy block.
	h.load("threats", "203.0.113.0/24")
	if got := h.egressEntries(a.EpID, identity.CIDRSet(0)); len(got) != 1 || !got[0].Deny {
		t.Fatalf("entries after the group came: %+v", got)
	}
	pols, _ = h.a.ListPolicies(bg)
	if len(pols[0].MissingCIDRGroups) != 0 {
		t.Fatalf("still missing: %v", pols[0].MissingCIDRGroups)
	}
	// Deleting it needs force while the policy names it; then the entries go before the
	// set is emptied.
	var e *api.Error
	if _, err := h.a.DeleteCIDRSet(bg, "threats", false); !errors.As(err, &e) || e.Status != http.StatusConflict {
		t.Fatalf("delete without force: %v", err)
	}
	before := len(h.dp.applied)
	if _, err := h.a.DeleteCIDRSet(bg, "threats", true); err != nil {
		t.Fatal(err)
	}
	calls := h.dp.calls()
	last := calls[len(calls)-1]
	if last.op != "replace" || len(last.sets) != 0 {
		t.Fatalf("last set call %+v", last)
	}
	for _, ap := range h.dp.applied[before:] {
		if ap.epID == a.EpID && ap.seq > last.seq {
			t.Fatal("the set was emptied before the entries naming it were removed")
		}
	}
	if got := h.egressEntries(a.EpID, identity.CIDRSet(0)); len(got) != 0 {
		t.Fatalf("entries after forced delete: %+v", got)
	}
}

func TestCIDRSetIndexesAreStableAndLimited(t *testing.T) {
	h := newHarness(t)
	for i := range maxCIDRSets {
		if res := h.load(fmt.Sprintf("s%02d", i), "10.0.0.0/8"); int(res.Set.Index) != i {
			t.Fatalf("set %d got index %d", i, res.Set.Index)
		}
	}
	var e *api.Error
	_, err := h.a.LoadCIDRSet(bg, api.CIDRSetRequest{Name: "one-too-many", Prefixes: prefixes("10.0.0.0/8")})
	if !errors.As(err, &e) || e.Status != http.StatusConflict || !strings.Contains(err.Error(), "all 32 CIDR sets are in use") {
		t.Fatalf("33rd set: %v", err)
	}
	if _, err := h.a.DeleteCIDRSet(bg, "s05", false); err != nil {
		t.Fatal(err)
	}
	if res := h.load("new", "10.0.0.0/8"); res.Set.Index != 5 {
		t.Fatalf("new set got index %d, want the free 5", res.Set.Index)
	}
	// Restart: every set comes back from its file with its index, and the dataplane is
	// loaded with them before the policy state.
	h.restart()
	calls := h.dp.calls()
	if len(calls) != 1 || calls[0].op != "replace" || len(calls[0].sets) != maxCIDRSets {
		t.Fatalf("set calls at start: %+v", calls)
	}
	sets, _ := h.a.ListCIDRSets(bg)
	if len(sets) != maxCIDRSets {
		t.Fatalf("%d sets after restart", len(sets))
	}
	for _, s := range sets {
		want := s.Name[1:]
		if s.Name == "new" {
			want = "05"
		}
		if fmt.Sprintf("%02d", s.Index) != want {
			t.Errorf("set %s has index %d after restart", s.Name, s.Index)
		}
	}
}

func TestCIDRSetAddRemoveInPlace(t *testing.T) {
	h := newHarness(t)
	h.load("s", "10.0.0.0/8", "192.0.2.0/24")
	n := len(h.dp.calls())
	res, err := h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("198.51.100.1", "192.0.2.0/24", "2001:db8::/48")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != "changed" || !res.InPlace || res.Added != 2 || res.Duplicates != 1 || res.Set.Prefixes != 4 {
		t.Fatalf("add %+v", res)
	}
	if c := h.dp.calls()[n:]; len(c) != 1 || c[0].op != "add" || c[0].n != 2 {
		t.Fatalf("add calls %+v", c)
	}
	if !h.member("198.51.100.1", 0) || !strings.Contains(res.Set.Source, "file test.txt") {
		t.Fatalf("after add: member %v, source %q", h.member("198.51.100.1", 0), res.Set.Source)
	}
	// Removing a prefix nothing else overlaps: in place.
	n = len(h.dp.calls())
	res, err = h.a.RemoveCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("192.0.2.0/24", "203.0.113.0/24")})
	if err != nil || !res.InPlace || res.Removed != 1 || res.NotFound != 1 {
		t.Fatalf("remove %+v, %v", res, err)
	}
	if c := h.dp.calls()[n:]; len(c) != 1 || c[0].op != "remove" || h.member("192.0.2.1", 0) {
		t.Fatalf("remove calls %+v", c)
	}
	// Removing a prefix inside another prefix of the set, or containing one, is in place
	// too: the dataplane keeps what the other prefix lists.
	h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("10.1.0.0/16", "172.16.0.0/12", "172.16.5.0/24")})
	for _, p := range []string{"10.1.0.0/16", "172.16.0.0/12"} {
		n = len(h.dp.calls())
		res, err = h.a.RemoveCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes(p)})
		if err != nil || !res.InPlace || res.Removed != 1 {
			t.Fatalf("remove %s: %+v, %v", p, res, err)
		}
		if c := h.dp.calls()[n:]; len(c) != 1 || c[0].op != "remove" {
			t.Fatalf("remove %s calls %+v", p, c)
		}
	}
	if !h.member("10.1.2.3", 0) || !h.member("172.16.5.1", 0) || h.member("172.17.0.1", 0) {
		t.Fatal("overlapping removals unlisted the wrong addresses")
	}
	n = len(h.dp.calls())
	if res, err = h.a.RemoveCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("2001:db8::/48")}); err != nil || !res.InPlace {
		t.Fatalf("v6 remove %+v, %v", res, err)
	}
	// An add the dataplane refuses in place (table full) is done by a rebuild.
	h.dp.failAddCIDRs = true
	res, err = h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("100.64.0.0/10")})
	if err != nil || res.InPlace || !h.member("100.64.1.1", 0) {
		t.Fatalf("add after a refused in-place add: %+v, %v", res, err)
	}
	// Adding to a set that does not exist creates it.
	res, err = h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "fresh", Prefixes: prefixes("192.0.2.0/25")})
	if err != nil || res.Action != "created" || res.Set.Index != 1 || res.Set.Source != "cidrset add" {
		t.Fatalf("add to a new set: %+v, %v", res, err)
	}
	// Everything survives a restart.
	h.restart()
	s, err := h.a.GetCIDRSet(bg, "s")
	if err != nil || s.Prefixes != 4 || !h.member("172.16.5.1", 0) || h.member("192.0.2.1", 0) {
		t.Fatalf("after restart: %+v, %v", s, err)
	}
}

func TestCIDRSetFailureKeepsPreviousContent(t *testing.T) {
	h := newHarness(t)
	h.add("x", "a", map[string]string{"pod": "a"})
	h.load("threats", "203.0.113.0/24")
	if _, err := h.apply("deny.yaml", denyThreats); err != nil {
		t.Fatal(err)
	}
	file, _ := os.ReadFile(setFilePath(h.cfg.StateDir, "threats"))
	// The new content cannot be loaded: nothing changes.
	h.dp.failReplace = 1
	if _, err := h.a.LoadCIDRSet(bg, api.CIDRSetRequest{Name: "threats", Prefixes: prefixes("192.0.2.0/24")}); err == nil {
		t.Fatal("load succeeded with the dataplane failing")
	}
	if !h.member("203.0.113.1", 0) || h.member("192.0.2.1", 0) {
		t.Fatal("dataplane not restored")
	}
	if now, _ := os.ReadFile(setFilePath(h.cfg.StateDir, "threats")); string(now) != string(file) {
		t.Fatal("set file changed by a failed load")
	}
	s, _ := h.a.GetCIDRSet(bg, "threats")
	if s.Prefixes != 1 || s.ByLength["v4/24"] != 1 {
		t.Fatalf("set after failed load %+v", s)
	}
	// A new set whose policy state cannot be applied: the set goes again.
	h.dp.failEndpointAfter = 0
	if _, err := h.apply("g.yaml", strings.Replace(threatsGroup, "threats", "other", 1)+"---\n"+strings.ReplaceAll(denyThreats, "threats", "other")); err == nil {
		t.Fatal("apply succeeded with the endpoint update failing")
	}
	h.dp.failEndpointAfter = -1
	if _, err := h.a.GetCIDRSet(bg, "other"); !api.IsNotFound(err) {
		t.Fatalf("set of a failed apply exists: %v", err)
	}
	if _, err := os.Stat(setFilePath(h.cfg.StateDir, "other")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("set file of a failed apply exists")
	}
	if m, _ := h.dp.CIDRSetMembership(netip.MustParseAddr("198.51.100.7")); m != 0 {
		t.Fatalf("dataplane still lists the failed set: %#x", m)
	}
}

func TestCIDRSetDamagedFileStopsStart(t *testing.T) {
	h := newHarness(t)
	h.load("threats", "203.0.113.0/24")
	h.a.Close()
	h.a = nil
	path := setFilePath(h.cfg.StateDir, "threats")
	b, _ := os.ReadFile(path)
	os.WriteFile(path, b[:len(b)-2], 0o600)
	h.dp = h.dp.reopen()
	dp := h.dp
	h.cfg.OpenKernel = func(Config) (Kernel, error) { return dp.kernel(), nil }
	if a, err := New(h.cfg); err == nil {
		a.Close()
		t.Fatal("agent started with a damaged set file")
	} else if !strings.Contains(err.Error(), "threats.set") {
		t.Fatalf("error does not name the file: %v", err)
	}
}

func TestCIDRSetFlowsAndIdentities(t *testing.T) {
	h := newHarness(t)
	a := h.add("x", "a", map[string]string{"pod": "a"})
	h.load("other", "192.0.2.0/24")
	h.load("threats", "203.0.113.0/24")
	if _, err := h.apply("deny.yaml", denyThreats); err != nil {
		t.Fatal(err)
	}
	pols, _ := h.a.ListPolicies(bg)
	ruleID := pols[0].Rules[0].ID
	h.dp.events <- flow.Event{Time: time.Now(), Source: netip.MustParseAddr(a.IP), Destination: netip.MustParseAddr("203.0.113.9"), SourcePort: 40000, DestinationPort: 443,
		EpID: a.EpID, SrcIdentity: a.Identity, DstIdentity: identity.World, RuleID: ruleID, MatchIdentity: identity.CIDRSet(1),
		Type: flow.EventDrop, Verdict: flow.VerdictDropped, Reason: flow.ReasonPolicyDeny, Direction: policy.Egress, Protocol: 6}
	var f api.Flow
	if !testenv.Eventually(5*time.Second, func() bool {
		var flows []api.Flow
		h.a.Observe(bg, api.ObserveRequest{SinceStart: true}, func(fl api.Flow) error { flows = append(flows, fl); return nil })
		if len(flows) > 0 {
			f = flows[0]
		}
		return len(flows) > 0
	}) {
		t.Fatal("no flow")
	}
	if f.CIDRGroup != "threats" || f.Rule == nil || f.Rule.Rule != "spec.egressDeny[0]" {
		t.Fatalf("flow %+v", f)
	}
	ids, _ := h.a.ListIdentities(bg)
	var sets []string
	for _, id := range ids {
		if id.Kind == "cidrset" {
			sets = append(sets, fmt.Sprintf("%d:%s", id.ID, strings.Join(id.Labels, ",")))
		}
	}
	want := []string{fmt.Sprintf("%d:cidrgroup:other", identity.CIDRSet(0)), fmt.Sprintf("%d:cidrgroup:threats", identity.CIDRSet(1))}
	if !slices.Equal(sets, want) {
		t.Fatalf("set identities %v, want %v", sets, want)
	}
}

func TestCIDRSetJournal(t *testing.T) {
	h := newHarness(t)
	h.load("s", "10.0.0.0/8", "192.0.2.0/24")
	base := setFilePath(h.cfg.StateDir, "s")
	log := setLogPath(h.cfg.StateDir, "s")
	before, _ := os.ReadFile(base)
	if _, err := os.Stat(log); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("journal after a load: %v", err)
	}
	// In-place changes go to the journal; the base stays as it was.
	if _, err := h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("198.51.100.1", "2001:db8::/32")}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.a.RemoveCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("192.0.2.0/24")}); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.ReadFile(base); !bytes.Equal(now, before) {
		t.Fatal("an in-place change rewrote the base")
	}
	fi, err := os.Stat(log)
	if err != nil || fi.Size() == 0 {
		t.Fatalf("journal: %v", err)
	}
	// A torn record at the end (a crash while appending) is not replayed.
	if _, err := h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("203.0.113.0/24")}); err != nil {
		t.Fatal(err)
	}
	h.a.Close()
	full, _ := os.ReadFile(log)
	os.WriteFile(log, full[:len(full)-3], 0o600)
	h.a = nil
	h.dp = h.dp.reopen()
	h.start()
	s, err := h.a.GetCIDRSet(bg, "s")
	if err != nil || s.Prefixes != 3 || s.IPv6 != 1 || !h.member("198.51.100.1", 0) || h.member("192.0.2.1", 0) || h.member("203.0.113.1", 0) {
		t.Fatalf("after restart with a torn journal: %+v, %v", s, err)
	}
	// Start folded the journal into a new base.
	if _, err := os.Stat(log); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("journal left after start: %v", err)
	}
	if now, _ := os.ReadFile(base); bytes.Equal(now, before) {
		t.Fatal("base not rewritten at start")
	}
	// A journal of another base (crash between writing a new base and removing the old
	// journal) is ignored.
	h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("203.0.113.0/24")})
	stale, _ := os.ReadFile(log)
	h.load("s", "100.64.0.0/10")
	os.WriteFile(log, stale, 0o600)
	h.restart()
	if s, _ := h.a.GetCIDRSet(bg, "s"); s.Prefixes != 1 || h.member("203.0.113.1", 0) || !h.member("100.64.0.1", 0) {
		t.Fatalf("stale journal replayed: %+v", s)
	}
	// Past the size limit an in-place change writes a new base.
	defer func(old int64) { setLogLimit = old }(setLogLimit)
	setLogLimit = 10
	h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("198.51.100.2")})
	h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("198.51.100.3")})
	if fi, err := os.Stat(log); err == nil && fi.Size() > 200 {
		t.Fatalf("journal of %d bytes not folded", fi.Size())
	}
	h.restart()
	if s, _ := h.a.GetCIDRSet(bg, "s"); s.Prefixes != 3 || !h.member("198.51.100.3", 0) {
		t.Fatalf("after folding: %+v", s)
	}
	// Deleting removes both files.
	h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "s", Prefixes: prefixes("198.51.100.4")})
	if _, err := h.a.DeleteCIDRSet(bg, "s", false); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{base, log} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after delete", p)
		}
	}
}

// TestCIDRSetConcurrentAdds: adds to a set that does not exist yet, at the same time, all
// end up in it (the first creates it, the others add in place).
func TestCIDRSetConcurrentAdds(t *testing.T) {
	h := newHarness(t)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := h.a.AddCIDRs(bg, api.CIDRSetRequest{Name: "c", Prefixes: prefixes(fmt.Sprintf("192.0.2.%d", i))}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	s, err := h.a.GetCIDRSet(bg, "c")
	if err != nil || s.Prefixes != 8 {
		t.Fatalf("set after concurrent adds: %+v, %v", s, err)
	}
	for i := range 8 {
		if !h.member(fmt.Sprintf("192.0.2.%d", i), s.Index) {
			t.Errorf("192.0.2.%d not in the dataplane", i)
		}
	}
}
