package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
)

// procStatus reads the fields names (kB values, such as VmRSS) of process pid's
// /proc/PID/status, in bytes.
func procStatus(t *testing.T, pid int, names ...string) []uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]uint64, len(names))
	for i, name := range names {
		m := regexp.MustCompile(`(?m)^` + name + `:\s+(\d+) kB$`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("no %s in /proc/%d/status", name, pid)
		}
		n, _ := strconv.ParseUint(string(m[1]), 10, 64)
		vals[i] = n << 10
	}
	return vals
}

// procMemory reads VmRSS and RssAnon of process pid, in bytes.
func procMemory(t *testing.T, pid int) (rss, anon uint64) {
	t.Helper()
	v := procStatus(t, pid, "VmRSS", "RssAnon")
	return v[0], v[1]
}

// TestDaemonMemory runs the real rampartd with its default CIDR table bound: at start,
// with no CIDR sets, its BPF maps hold less than 64 MiB and its RSS is small (the CIDR
// tables are not created, so not mapped); after a list of 3M prefixes is loaded and
// deleted, its anonymous RSS returns near where it started within seconds (the heap the
// load used is given back to the kernel).
func TestDaemonMemory(t *testing.T) {
	testenv.RequireRoot(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "github.com/rampartnet/rampart/cmd/rampartd",
		"github.com/rampartnet/rampart/cmd/rampart")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building binaries: %v\n%s", err, out)
	}
	sockDir, flags := instanceFlags(t, "m", "198.18.0.0/24")
	daemon, log := startDaemon(t, bin, flags)
	if !testenv.Eventually(10*time.Second, func() bool {
		_, _, code := run(bin, sockDir, "status")
		return code == 0
	}) {
		t.Fatalf("rampartd did not come up:\n%s", log.String())
	}
	status := func() api.Status {
		t.Helper()
		out, errs, code := run(bin, sockDir, "status", "-o", "json")
		var st api.Status
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Memory == nil || st.Memory.Error != "" {
			t.Fatalf("status: exit %d, %q %q", code, out, errs)
		}
		return st
	}
	must := func(args ...string) {
		t.Helper()
		if out, errs, code := run(bin, sockDir, args...); code != 0 {
			t.Fatalf("rampart %v: exit %d: %s %s\nagent log:\n%s", args, code, out, errs, log.String())
		}
	}

	pid := daemon.Process.Pid
	rss, idleAnon := procMemory(t, pid)
	st := status()
	if st.Memory.MapBytes >= 64<<20 {
		t.Errorf("idle agent holds %.1f MiB of BPF maps, want < 64 MiB", float64(st.Memory.MapBytes)/(1<<20))
	}
	if rss >= 128<<20 {
		t.Errorf("idle agent's RSS is %.1f MiB, want < 128 MiB", float64(rss)/(1<<20))
	}
	if got := st.Memory.RSSBytes; got < rss/2 || got > 2*rss {
		t.Errorf("status says RSS %d, /proc says %d", got, rss)
	}

	list := filepath.Join(t.TempDir(), "big.txt")
	var b strings.Builder
	for i := range 3_000_000 {
		fmt.Fprintf(&b, "%d.%d.%d.%d\n", 10+i>>24, i>>16&0xff, i>>8&0xff, i&0xff)
	}
	if err := os.WriteFile(list, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	must("cidrset", "load", "big", "--file", list)
	_, loadedAnon := procMemory(t, pid)
	must("cidrset", "delete", "big")
	var anon uint64
	if !testenv.Eventually(5*time.Second, func() bool {
		_, anon = procMemory(t, pid)
		return anon < idleAnon+16<<20
	}) {
		t.Errorf("anonymous RSS %d MiB at start, %d MiB with 3M prefixes, still %d MiB after deleting them",
			idleAnon>>20, loadedAnon>>20, anon>>20)
	}
	if st := status(); st.Memory.MapBytes >= 64<<20 {
		t.Errorf("after the delete the agent holds %.1f MiB of BPF maps", float64(st.Memory.MapBytes)/(1<<20))
	}
	t.Logf("idle: RSS %d MiB, anonymous %d MiB, maps %.1f MiB; anonymous RSS %d MiB with 3M prefixes, %d MiB after the delete",
		rss>>20, idleAnon>>20, float64(st.Memory.MapBytes)/(1<<20), loadedAnon>>20, anon>>20)
}
