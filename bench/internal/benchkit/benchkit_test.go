package benchkit

import (
	"encoding/json"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

func TestStats(t *testing.T) {
	if got := Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median of 3 values: %v", got)
	}
	if got := Median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median of 4 values: %v", got)
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("median of nothing is not NaN")
	}
	xs := []float64{3, 1, 2}
	Median(xs)
	if !slices.Equal(xs, []float64{3, 1, 2}) {
		t.Errorf("median sorted its input: %v", xs)
	}
	d := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {1, 1}} {
		if got := Percentile(d, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if lo, hi := MinMax([]float64{2, -1, 5}); lo != -1 || hi != 5 {
		t.Errorf("minmax %v %v", lo, hi)
	}
	if Ratio(1, 2) != 0.5 || !math.IsNaN(Ratio(1, 0)) || !math.IsNaN(Ratio(1, math.NaN())) {
		t.Error("ratio")
	}
}

func TestFloatJSON(t *testing.T) {
	in := struct {
		A, B Float
		C    []Float
	}{1.5, NaN(), []Float{Float(math.Inf(1)), 2}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"A":1.5,"B":null,"C":[null,2]}` {
		t.Errorf("encoded %s", b)
	}
	var out struct {
		A, B Float
		C    []Float
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.A != 1.5 || out.B.Valid() || out.C[0].Valid() || out.C[1] != 2 {
		t.Errorf("decoded %+v", out)
	}
	if err := json.Unmarshal([]byte(`{"A":"x"}`), &out); err == nil {
		t.Error("a string decoded as a Float")
	}
}

func TestAddresses(t *testing.T) {
	p := netip.MustParsePrefix("198.18.7.0/24")
	if got := HostAddr(p, 11); got != netip.MustParseAddr("198.18.7.11") {
		t.Errorf("host address %v", got)
	}
	if got := AddAddr(netip.MustParseAddr("198.18.7.255"), 1); got != netip.MustParseAddr("198.18.8.0") {
		t.Errorf("carry: %v", got)
	}
	cidrs := PodCIDRs(20)
	seen := map[netip.Prefix]bool{}
	for _, c := range cidrs {
		if seen[c] || c.Bits() != 24 || !netip.MustParsePrefix("198.18.0.0/16").Contains(c.Addr()) || c.Addr().As4()[2] == 0 {
			t.Errorf("bad or repeated pod CIDR %v", c)
		}
		seen[c] = true
	}
	if len(Suffix()) != 8 || Suffix() == Suffix() {
		t.Error("suffix not 8 random hex digits")
	}
}

func TestTaskset(t *testing.T) {
	if got := Taskset("", "a", "b"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("unpinned: %v", got)
	}
	if got := Taskset("1", "a"); !slices.Equal(got, []string{"taskset", "-c", "1", "a"}) {
		t.Errorf("pinned: %v", got)
	}
}

func TestCPUTimes(t *testing.T) {
	before := CPUTimes{0: {Busy: 100, Total: 1000}, 1: {Busy: 500, Total: 1000}}
	after := CPUTimes{0: {Busy: 150, Total: 1100}, 1: {Busy: 600, Total: 1100}}
	if got := BusyPercent(before, after); !slices.Equal(got, []float64{50, 100}) {
		t.Errorf("busy %v, want [50 100]", got)
	}
	if got := BusyPercent(after, after); !slices.Equal(got, []float64{0, 0}) {
		t.Errorf("no elapsed ticks: %v", got)
	}
	now, err := ReadCPUTimes()
	if err != nil {
		t.Fatal(err)
	}
	if len(now) == 0 {
		t.Fatal("no CPUs in /proc/stat")
	}
	for c, v := range now {
		if v.Busy > v.Total || v.Total == 0 {
			t.Errorf("cpu%d: busy %d of %d", c, v.Busy, v.Total)
		}
	}
}

// TestDescendantsAndPin starts a shell that starts a sleep, and finds and pins the sleep as
// the shell's descendant by name.
func TestDescendantsAndPin(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if pids, _ := Descendants(cmd.Process.Pid, ""); len(pids) > 0 {
			for _, p := range pids {
				if proc, err := os.FindProcess(p); err == nil {
					proc.Kill()
				}
			}
		}
		cmd.Process.Kill()
		cmd.Wait()
	})
	var pids []int
	deadline := time.Now().Add(10 * time.Second)
	for len(pids) == 0 && time.Now().Before(deadline) {
		var err error
		if pids, err = Descendants(cmd.Process.Pid, "sleep"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(pids) != 1 {
		t.Fatalf("sleep not found under the shell: %v", pids)
	}
	if other, _ := Descendants(cmd.Process.Pid, "no-such-command"); len(other) != 0 {
		t.Errorf("found %v by a name nothing has", other)
	}
	if err := PinProcess(pids[0], []int{0}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/" + itoa(pids[0]) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	if !containsLine(string(b), "Cpus_allowed_list:\t0") {
		t.Errorf("sleep not pinned to CPU 0:\n%s", b)
	}
}
