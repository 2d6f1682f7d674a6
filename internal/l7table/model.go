package l7table

import "strings"

// Allows is a model of the kernel's decision for one request in its subset (a method of
// Methods; path and host of visible ASCII, as the kernel's parser admits them; each header
// name at most once, lower case in header). It works from the encoded table only, as the
// kernel does: Methods index, a longest-prefix lookup of the path padded with NULs to
// PathMax bytes, an exact lookup of the host padded to HostMax bytes, each truncated as
// the kernel truncates, and for each header the entries of its name and of its name and
// value. It returns, per side, the rules the request matched (Pass sides: bit 0).
func (t *Table) Allows(method, path, host string, header ...map[string]string) (bool, Masks) {
	mi := -1
	for i, m := range Methods {
		if m == method {
			mi = i
		}
	}
	if mi < 0 {
		return false, Masks{}
	}
	paths := t.Header.AnyPath
	if e := t.longestPath(path); e != nil {
		paths.or(e.Masks)
	}
	hosts := t.Header.AnyHost
	if e := t.host(host); e != nil {
		hosts.or(e.Masks)
	}
	var seen, broken Masks // header requirements met by some line, and broken by one
	for _, h := range header {
		for name, value := range h {
			var met, values Masks
			for _, e := range t.Headers {
				if e.Name != name {
					continue
				}
				if e.Presence {
					met.or(e.Reqs)
					values = e.ValueReqs
				} else if len(value) < HeaderValueMax && e.Value == value {
					met.or(e.Reqs)
				}
			}
			seen.or(met)
			broken.or(Masks{values[0] &^ met[0], values[1] &^ met[1]})
		}
	}
	seen = Masks{seen[0] &^ broken[0], seen[1] &^ broken[1]}
	var got Masks
	for side := range got {
		got[side] = t.Header.Method[mi][side] & paths[side] & hosts[side]
		for bit := range 64 {
			if t.Header.HeaderRules[side]&(1<<bit) != 0 && t.RuleReqs[side][bit]&^seen[side] != 0 {
				got[side] &^= 1 << bit
			}
		}
		if t.Header.Pass[side] != 0 {
			got[side] = t.Header.Pass[side]
		}
		if got[side] == 0 {
			return false, got
		}
	}
	return true, got
}

// pad is s cut or padded with NULs to n bytes, as the kernel copies it into a key.
func pad(s string, n int) string {
	if len(s) >= n {
		return s[:n]
	}
	return s + strings.Repeat("\x00", n-len(s))
}

func (t *Table) longestPath(path string) *PathEntry {
	key := pad(path, PathMax)
	var best *PathEntry
	for i := range t.Paths {
		e := &t.Paths[i]
		if strings.HasPrefix(key, e.Key) && (best == nil || len(e.Key) > len(best.Key)) {
			best = e
		}
	}
	return best
}

func (t *Table) host(host string) *HostEntry {
	key := pad(host, HostMax)
	for i := range t.Hosts {
		if pad(t.Hosts[i].Host, HostMax) == key {
			return &t.Hosts[i]
		}
	}
	return nil
}
