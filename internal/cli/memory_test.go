package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/pin"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/cidrtable"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// idleMapLimit is what an agent with no CIDR sets may hold in BPF maps.
const idleMapLimit = 64 << 20

// pinnedMemlock sums the kernel's memlock (/proc/self/fdinfo) of every map pinned in dir
// and of the maps inside its map-in-maps: the agent's map memory, read without the agent.
func pinnedMemlock(t *testing.T, dir string) (sum uint64, names []string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	memlock := func(m *ebpf.Map) uint64 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", m.FD()))
		if err != nil {
			t.Fatal(err)
		}
		v := regexp.MustCompile(`(?m)^memlock:\s+(\d+)$`).FindSubmatch(b)
		if v == nil {
			t.Fatalf("no memlock in the fdinfo of %v", m)
		}
		n, _ := strconv.ParseUint(string(v[1]), 10, 64)
		return n
	}
	for _, e := range ents {
		obj, err := pin.Load(filepath.Join(dir, e.Name()), nil)
		if err != nil {
			t.Fatal(err)
		}
		m, ok := obj.(*ebpf.Map)
		if !ok {
			obj.Close()
			continue
		}
		sum += memlock(m)
		names = append(names, e.Name())
		if m.Type() == ebpf.ArrayOfMaps {
			var k, id uint32
			it := m.Iterate()
			for it.Next(&k, &id) {
				inner, err := ebpf.NewMapFromID(ebpf.MapID(id))
				if err != nil {
					t.Fatal(err)
				}
				sum += memlock(inner)
				names = append(names, fmt.Sprintf("%s[%d]", e.Name(), k))
				inner.Close()
			}
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
		}
		m.Close()
	}
	return sum, names
}

func statusJSON(t *testing.T, e *agenttest.Env) api.Status {
	t.Helper()
	var st api.Status
	if err := json.Unmarshal([]byte(e.MustCLI("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Memory == nil || st.Memory.Error != "" {
		t.Fatalf("status memory: %+v", st.Memory)
	}
	return st
}

// TestStatusMemoryFollowsSets: an agent with the default CIDR table bound and no sets holds
// less than 64 MiB of BPF maps (summed from the kernel's fdinfo of its pins, and as
// `rampart status` reports them); a set of /32s and a /24 adds a host table and the 64 MiB
// top table, which status lists by map; deleting the set gives the memory back.
func TestStatusMemoryFollowsSets(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{NoServers: true, CIDRHostSlots: cidrtable.DefaultHostSlots})

	idle, pins := pinnedMemlock(t, e.Config.BPFDir)
	if idle >= idleMapLimit {
		t.Errorf("idle agent: its pinned maps hold %.1f MiB (%v), want < 64 MiB", float64(idle)/(1<<20), pins)
	}
	st := statusJSON(t, e)
	m := st.Memory
	// Status also counts the maps the programs use unpinned (tens of KiB).
	if m.MapBytes < idle || m.MapBytes > idle+1<<20 || m.MapBytes >= idleMapLimit {
		t.Errorf("status says %d bytes of maps, the pins hold %d", m.MapBytes, idle)
	}
	var sum uint64
	byName := map[string]api.MapMemory{}
	for _, mm := range m.Maps {
		sum += mm.Bytes
		byName[mm.Name] = mm
	}
	if sum != m.MapBytes {
		t.Errorf("maps sum to %d, total says %d", sum, m.MapBytes)
	}
	for _, name := range []string{"conntrack4_peer", "cidr4_config", "cidr4_top", "cidr4_host", "policy", "ipcache"} {
		if _, ok := byName[name]; !ok {
			t.Errorf("status lacks map %s: %+v", name, m.Maps)
		}
	}
	if ct := byName["conntrack4_peer"]; ct.Type != "LRUHash" || ct.MaxEntries == 0 || ct.Bytes == 0 {
		t.Errorf("conntrack map: %+v", ct)
	}
	if m.RSSBytes == 0 || m.RSSAnonBytes == 0 || m.RSSAnonBytes > m.RSSBytes {
		t.Errorf("agent RSS %d, anonymous %d", m.RSSBytes, m.RSSAnonBytes)
	}
	// Plain status: the sync state and errors first, the total only, no table.
	if out := e.MustCLI("status"); strings.Contains(out, "MAP") || !strings.Contains(out, "in "+fmt.Sprint(len(m.Maps))+" maps (--maps lists them)") ||
		!regexp.MustCompile(`^Agent:.*\nInstance:.*\n(Version:.*\n)?(DEGRADED:.*\n)?Node namespace:`).MatchString(out) {
		t.Errorf("status without --maps:\n%s", out)
	}
	out := e.MustCLI("status", "--maps")
	for _, re := range []string{`Memory:\s+agent RSS [0-9.]+ MiB \(anonymous [0-9.]+ MiB\); BPF maps [0-9.]+ MiB in \d+ maps`,
		`(?m)^\s+MAP\s+TYPE\s+ENTRIES\s+BYTES$`, `(?m)^\s+conntrack4_peer\s+LRUHash\s+\d+\s+[0-9.]+ MiB$`, `(?m)^\s+total\s+[0-9.]+ MiB$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status output does not match %q:\n%s", re, out)
		}
	}

	// A set: 1000 addresses and a /24. Its tables appear, sized to it.
	list := filepath.Join(t.TempDir(), "set.txt")
	var b strings.Builder
	b.WriteString("203.0.113.0/24\n")
	for i := range 1000 {
		fmt.Fprintf(&b, "10.1.%d.%d\n", i/250, i%250+1)
	}
	os.WriteFile(list, []byte(b.String()), 0o644)
	e.MustCLI("cidrset", "load", "threats", "--file", list)
	loaded, _ := pinnedMemlock(t, e.Config.BPFDir)
	if grew := loaded - idle; grew < 64<<20 || grew > 64<<20+1<<20 {
		t.Errorf("loading 1000 /32s and a /24 added %d bytes of maps, want the 64 MiB top table and a small host table", grew)
	}
	var top, host *api.MapMemory
	for _, mm := range statusJSON(t, e).Memory.Maps {
		switch {
		case strings.HasPrefix(mm.Name, "cidr4_top["):
			top = &mm
		case strings.HasPrefix(mm.Name, "cidr4_host["):
			host = &mm
		}
	}
	// The host table's elements are buckets of 64 slots.
	if top == nil || top.Bytes < 64<<20 || host == nil || host.MaxEntries*64 < 2000 || host.MaxEntries*64 > 4096 {
		t.Errorf("tables after the load: top %+v, host %+v", top, host)
	}
	if out := e.MustCLI("status", "--maps"); !regexp.MustCompile(`(?m)^\s+cidr4_top\[[01]\]\s+Array\s+8388608\s+64\.0 MiB$`).MatchString(out) {
		t.Errorf("status does not list the top table:\n%s", out)
	}

	e.MustCLI("cidrset", "delete", "threats")
	if after, names := pinnedMemlock(t, e.Config.BPFDir); after != idle {
		t.Errorf("after deleting the set the maps hold %d bytes (%v), before it %d", after, names, idle)
	}
}
