package churn

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat (100 on Linux).
const clockTicks = 100

// rssAnon returns RssAnon of process pid in bytes (/proc/PID/status).
func rssAnon(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusKB(b, "RssAnon:")
}

func parseStatusKB(status []byte, field string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, field); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("status line %q: want <n> kB", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("status line %q: %w", line, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s line in status", field)
}

// cpuTicks returns utime+stime of process pid (its threads included) in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatTicks(b)
}

func parseStatTicks(stat []byte) (int64, error) {
	// The command name (field 2) is in parentheses and may hold spaces: count from after it.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command name", stat)
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the name, want >= 13", len(f))
	}
	u, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat utime: %w", err)
	}
	s, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat stime: %w", err)
	}
	return u + s, nil
}

// mapMemory sums the memlock of every BPF map the process holds a file descriptor of
// (/proc/PID/fdinfo: a map's fdinfo has map_type and memlock lines), each map once even
// when several descriptors refer to it, and counts the maps.
func mapMemory(pid int) (bytes int64, maps int, err error) {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	seen := map[string]bool{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		id, memlock, ok := parseMapFdinfo(b)
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		bytes += memlock
		maps++
	}
	return bytes, maps, nil
}

// parseMapFdinfo reads a map's id and memlock from its fdinfo; ok is false for other
// descriptors.
func parseMapFdinfo(b []byte) (id string, memlock int64, ok bool) {
	var isMap bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, found := strings.Cut(sc.Text(), ":")
		if !found {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "map_type":
			isMap = true
		case "map_id":
			id = v
		case "memlock":
			memlock, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return id, memlock, isMap && id != ""
}
