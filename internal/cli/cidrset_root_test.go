package cli_test

import (
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/cidrtable"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// The world behind the node: a namespace with a veth into the agent's node namespace and
// several addresses of one /24, so a listed address and its unlisted neighbours are served
// by the same host.
const (
	worldGW   = "198.19.250.1"
	listed    = "198.19.250.2" // in the set
	neighbour = "198.19.250.3" // never in the set
	added     = "198.19.250.4" // added and removed in place
)

var worldAddrs = []string{listed, neighbour, added}

// setUpWorld creates the world namespace and serves TCP 80 on all its addresses.
func setUpWorld(t *testing.T, e *agenttest.Env) {
	t.Helper()
	addrs := make([]netip.Addr, len(worldAddrs))
	for i, a := range worldAddrs {
		addrs[i] = netip.MustParseAddr(a)
	}
	agenttest.AddWorld(t, e, netip.MustParseAddr(worldGW), addrs, []uint16{80}, nil)
}

const blockThreats = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: block-threats, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  egressDeny:
  - toCIDRSet:
    - cidrGroupRef: threats
  enableDefaultDeny: {egress: false}
`

// writeList writes n random prefixes (outside 198.18.0.0/15, as the benchmark draws them:
// about 10 % /24, 1 % /16, the rest /32) plus extra lines, and returns the path.
func writeList(t testing.TB, dir string, n int, seed int64, extra ...string) string {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	var b strings.Builder
	b.Grow(n*17 + 64)
	b.WriteString("# test list\n")
	for range n {
		a := rng.Uint32()
		if a>>17 == 198<<7|18>>1 { // inside 198.18.0.0/15: the test's own addresses
			a ^= 1 << 31
		}
		switch r := rng.Intn(100); {
		case r < 10:
			fmt.Fprintf(&b, "%d.%d.%d.0/24\n", a>>24, a>>16&0xff, a>>8&0xff)
		case r < 11:
			fmt.Fprintf(&b, "%d.%d.0.0/16\n", a>>24, a>>16&0xff)
		default:
			fmt.Fprintf(&b, "%d.%d.%d.%d\n", a>>24, a>>16&0xff, a>>8&0xff, a&0xff)
		}
	}
	for _, x := range extra {
		b.WriteString(x + "\n")
	}
	p := filepath.Join(dir, fmt.Sprintf("list-%d-%d.txt", n, seed))
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func probeWorld(e *agenttest.Env, addr string) bool {
	return e.Probe("x/a", netip.MustParseAddr(addr), 80, "tcp", probeTimeout)
}

// wantReach checks reachability from x/a; a probe expected to pass is retried once, so a
// packet lost on a loaded machine does not read as a block (a leak is a leak at once).
func wantReach(t *testing.T, e *agenttest.Env, when string, reach map[string]bool) {
	t.Helper()
	for addr, want := range reach {
		got := probeWorld(e, addr)
		if !got && want {
			got = probeWorld(e, addr)
		}
		if got != want {
			t.Errorf("%s: %s reachable = %v, want %v", when, addr, got, want)
		}
	}
}

func TestCIDRSetEnforcedWithRealTraffic(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{})
	e.AddEndpoint("x", "a", map[string]string{"pod": "a"})
	setUpWorld(t, e)
	wantReach(t, e, "no policy", map[string]bool{listed: true, neighbour: true, added: true})

	list := writeList(t, t.TempDir(), 20000, 1, listed, "# the neighbour "+neighbour+" is not listed", "2001:db8::/32")
	out := e.MustCLI("cidrset", "load", "threats", "--file", list)
	if !strings.HasPrefix(out, "cidrset threats created: ") {
		t.Fatalf("load output %q", out)
	}
	// A set alone blocks nothing.
	wantReach(t, e, "set without policy", map[string]bool{listed: true, neighbour: true})
	e.MustCLI("apply", "-f", writeFile(t, "block.yaml", blockThreats))
	wantReach(t, e, "egressDeny toCIDRSet", map[string]bool{listed: false, neighbour: true, added: true})

	// The drop's flow names the rule and the set that decided.
	if !testenv.Eventually(5*time.Second, func() bool {
		out := e.MustCLI("observe", "--since-start", "--verdict", "dropped")
		return strings.Contains(out, listed+":80") && strings.Contains(out, "rule=CiliumNetworkPolicy/x/block-threats spec.egressDeny[0] cidrGroupRef=threats")
	}) {
		t.Errorf("no drop flow naming the set:\n%s", e.MustCLI("observe", "--since-start"))
	}
	trace := e.MustCLI("policy", "trace", "--from", "x/a", "--to", listed, "--port", "80/TCP")
	if !strings.Contains(trace, "DENIED") || !strings.Contains(trace, "spec.egressDeny[0] toCIDRSet cidrGroupRef=threats") ||
		!strings.Contains(trace, "in CIDR groups threats") {
		t.Errorf("trace:\n%s", trace)
	}

	// In place: add and remove, enforced when the command returns.
	start := time.Now()
	e.MustCLI("cidrset", "add", "threats", added)
	addTook := time.Since(start)
	wantReach(t, e, "after add", map[string]bool{added: false, neighbour: true})
	start = time.Now()
	e.MustCLI("cidrset", "remove", "threats", added)
	t.Logf("in-place add %s, remove %s (set of 20002 prefixes)", addTook, time.Since(start))
	wantReach(t, e, "after remove", map[string]bool{added: true, listed: false})
	// Removing a prefix that another prefix of the set still covers keeps the address
	// listed: .4/32 goes, .4/31 stays.
	e.MustCLI("cidrset", "add", "threats", added, "198.19.250.4/31")
	e.MustCLI("cidrset", "remove", "threats", added)
	wantReach(t, e, "/32 removed, /31 left", map[string]bool{added: false, neighbour: true})
	e.MustCLI("cidrset", "remove", "threats", "198.19.250.4/31")
	wantReach(t, e, "/31 removed", map[string]bool{added: true})

	// The agent stopped: the pinned tables still enforce. Restarted: the set comes back
	// from its file and is enforced as before.
	e.Stop()
	wantReach(t, e, "agent stopped", map[string]bool{listed: false, neighbour: true})
	e.Start()
	wantReach(t, e, "after restart", map[string]bool{listed: false, neighbour: true, added: true})
	get := e.MustCLI("cidrset", "get", "threats")
	if !strings.Contains(get, "CiliumNetworkPolicy/x/block-threats") || !strings.Contains(get, "IPv6 1)") {
		t.Errorf("get after restart:\n%s", get)
	}

	// Deleting the set while the policy names it needs --force; then nothing is blocked.
	if _, errOut, code := e.CLI("cidrset", "delete", "threats"); code == 0 || !strings.Contains(errOut, "block-threats") {
		t.Errorf("delete without --force: exit %d, %s", code, errOut)
	}
	e.MustCLI("cidrset", "delete", "threats", "--force")
	wantReach(t, e, "set deleted", map[string]bool{listed: true})
}

func TestCIDRGroupManifestWithRealTraffic(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{})
	e.AddEndpoint("x", "a", map[string]string{"pod": "a"})
	setUpWorld(t, e)
	group := `apiVersion: cilium.io/v2alpha1
kind: CiliumCIDRGroup
metadata: {name: threats}
spec:
  externalCIDRs: [` + listed + `/32, 203.0.113.0/24]
---
`
	f := writeFile(t, "group.yaml", group+blockThreats)
	out := e.MustCLI("apply", "-f", f)
	if !strings.Contains(out, "ciliumcidrgroup/threats created") {
		t.Errorf("apply output %q", out)
	}
	wantReach(t, e, "group applied", map[string]bool{listed: false, neighbour: true})
	// A group that lists the neighbour instead: one switch.
	e.MustCLI("apply", "-f", writeFile(t, "group2.yaml", strings.Replace(group, listed+"/32", neighbour+"/32", 1)))
	wantReach(t, e, "group changed", map[string]bool{listed: true, neighbour: false})
	e.MustCLI("delete", "-f", f)
	wantReach(t, e, "deleted", map[string]bool{listed: true, neighbour: true})
	if out := e.MustCLI("cidrset", "list"); strings.Contains(out, "threats") {
		t.Errorf("set left after delete -f:\n%s", out)
	}
}

// TestCIDRSetReloadUnderTraffic reloads the set again and again while x/a keeps
// connecting to a listed address (which must never answer) and to an unlisted neighbour
// (which must keep answering).
func TestCIDRSetReloadUnderTraffic(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{CIDRHostSlots: 1 << 22})
	e.AddEndpoint("x", "a", map[string]string{"pod": "a"})
	setUpWorld(t, e)
	dir := t.TempDir()
	// Two different lists, both with the listed address (and neither with the
	// neighbour): each reload changes almost the whole set, so the dataplane rebuilds and
	// switches.
	const size = 1000000
	lists := []string{
		writeList(t, dir, size, 1, listed),
		writeList(t, dir, size, 2, "198.19.250.128/25", listed+"/32"),
	}
	e.MustCLI("cidrset", "load", "threats", "--file", lists[0])
	e.MustCLI("apply", "-f", writeFile(t, "block.yaml", blockThreats))
	wantReach(t, e, "before reloads", map[string]bool{listed: false, neighbour: true})

	stop := make(chan struct{})
	var leaks, blockedNeighbour, probes atomic.Int64
	var wg sync.WaitGroup
	for _, target := range []string{listed, neighbour} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ok := e.Probe("x/a", netip.MustParseAddr(target), 80, "tcp", 300*time.Millisecond)
				probes.Add(1)
				switch {
				case ok && target == listed:
					leaks.Add(1)
				case !ok && target == neighbour:
					// A lost SYN on a loaded machine is not a block: ask again.
					if !e.Probe("x/a", netip.MustParseAddr(target), 80, "tcp", time.Second) {
						blockedNeighbour.Add(1)
					}
				}
			}
		}()
	}
	const reloads = 10
	start := time.Now()
	for i := range reloads {
		e.MustCLI("cidrset", "load", "threats", "--file", lists[(i+1)%2])
	}
	took := time.Since(start)
	close(stop)
	wg.Wait()
	t.Logf("%d probes during %d reloads of %d prefixes (%s each)", probes.Load(), reloads, size, took/reloads)
	if leaks.Load() != 0 {
		t.Errorf("%d probes to a listed address succeeded during reloads", leaks.Load())
	}
	if blockedNeighbour.Load() != 0 {
		t.Errorf("%d probes to an unlisted address were blocked during reloads", blockedNeighbour.Load())
	}
	if probes.Load() < 10 {
		t.Errorf("only %d probes ran", probes.Load())
	}
}

// TestCIDRSetLoadTimes measures `rampart cidrset load` from the command to enforcement for
// 100k and 1M prefixes (and 10M with RAMPART_CIDRSET_10M=1): the command's own time, then
// a probe to a listed address must fail at once.
func TestCIDRSetLoadTimes(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{CIDRHostSlots: cidrtable.DefaultHostSlots})
	e.AddEndpoint("x", "a", map[string]string{"pod": "a"})
	setUpWorld(t, e)
	e.MustCLI("apply", "-f", writeFile(t, "block.yaml", blockThreats))
	sizes := []int{100000, 1000000}
	if os.Getenv("RAMPART_CIDRSET_10M") == "1" {
		sizes = append(sizes, 10000000)
	}
	dir := t.TempDir()
	for i, n := range sizes {
		list := writeList(t, dir, n, int64(10+i), listed)
		start := time.Now()
		out := e.MustCLI("cidrset", "load", "threats", "--file", list)
		took := time.Since(start)
		enforced := !probeWorld(e, listed)
		t.Logf("%d prefixes: %s from the command to enforcement (%s)", n, took.Round(time.Millisecond), strings.TrimSpace(out))
		if get := e.MustCLI("cidrset", "get", "threats"); testing.Verbose() {
			t.Logf("%s", get)
		}
		if !enforced {
			t.Errorf("%d prefixes: listed address reachable after the load returned", n)
		}
		wantReach(t, e, fmt.Sprintf("%d prefixes loaded", n), map[string]bool{neighbour: true})
		// One address added and removed in place, in a set of this size.
		start = time.Now()
		e.MustCLI("cidrset", "add", "threats", added)
		addTook := time.Since(start)
		if probeWorld(e, added) {
			t.Errorf("%d prefixes: added address reachable after the add returned", n)
		}
		start = time.Now()
		e.MustCLI("cidrset", "remove", "threats", added)
		t.Logf("%d prefixes: in-place add %s, remove %s", n, addTook.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		os.Remove(list)
	}
}
