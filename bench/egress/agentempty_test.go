package egress

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/testenv"
)

// TestAgentEmptyFilter: the agent-empty filter swaps the programs of the agent's two links
// on the client's veth for the empty program, traffic to the server still flows, and
// Remove puts Rampart's programs back.
func TestAgentEmptyFilter(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	benchkit.BuildForTest(t, ctx, "../..", dir, "./cmd/rampartd", "./cmd/rampart")

	cidrs := benchkit.PodCIDRs(1)
	third := cidrs[0].Addr().As4()[2]
	world := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, third, 0}), 24)
	server := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, third + 1, 0}), 24)
	cfg := &Config{Rampartd: filepath.Join(dir, "rampartd"), Rampart: filepath.Join(dir, "rampart"), Budget: time.Minute}
	daemons := &benchkit.Daemons{}
	rf, stop, err := startRampart(ctx, cfg, daemons, "ae"+benchkit.Suffix(), dir, cidrs[0], server, world, agentEmptyFlags)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
		if err := daemons.StopAll(); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	f := &agentEmptyFilter{topo: rf.topo, agent: rf.agent}

	// The names of the programs on the agent's two pinned links.
	pins, err := clientLinkPins(rf.agent, rf.topo)
	if err != nil {
		t.Fatal(err)
	}
	programs := func() []string {
		t.Helper()
		var names []string
		for _, pin := range pins {
			l, err := link.LoadPinnedLink(pin, nil)
			if err != nil {
				t.Fatal(err)
			}
			info, err := l.Info()
			l.Close()
			if err != nil {
				t.Fatal(err)
			}
			p, err := ebpf.NewProgramFromID(info.Program)
			if err != nil {
				t.Fatal(err)
			}
			pi, err := p.Info()
			p.Close()
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, pi.Name)
		}
		return names
	}
	pingServer := func(what string) {
		t.Helper()
		out, err := rf.topo.Client.Command(ctx, "ping", "-c", "1", "-W", "2", rf.topo.Server.IP.String()).CombinedOutput()
		if err != nil {
			t.Errorf("%s: ping to the server: %v\n%s", what, err, out)
		}
	}

	if got := programs(); got[0] != "rampart_from_ep" || got[1] != "rampart_to_ep" {
		t.Fatalf("the agent's links run %v", got)
	}
	if _, err := f.Install(ctx); err != nil {
		t.Fatal(err)
	}
	if got := programs(); got[0] != "empty_tcx" || got[1] != "empty_tcx" {
		t.Errorf("after Install the links run %v, want the empty program", got)
	}
	pingServer("programs swapped")
	if err := f.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if got := programs(); got[0] != "rampart_from_ep" || got[1] != "rampart_to_ep" {
		t.Errorf("after Remove the links run %v, want Rampart's programs", got)
	}
	pingServer("programs back")
}
