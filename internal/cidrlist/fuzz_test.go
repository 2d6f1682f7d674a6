package cidrlist

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
)

// FuzzParseCIDRList checks the hand-written CIDR list parser against what the list syntax
// says, written plainly with net/netip (refParseCIDRList): the same prefixes in the same
// order, or an error at the same line, which the error names; every prefix it accepts is
// valid and masked; the line and entry counts are right; and cutting the list into chunks,
// as large lists are, changes nothing. Seeds: testdata/fuzz/FuzzParseCIDRList.
func FuzzParseCIDRList(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		l, st, err := Parse("list.txt", data, nil)
		want, lines, errLine := refParseCIDRList(data)
		if errLine > 0 {
			var le *Error
			if !errors.As(err, &le) || le.Line != errLine || err.Error() != fmt.Sprintf("list.txt:%d: %s", errLine, le.Reason) || le.Reason == "" {
				t.Fatalf("got %v, want an error at line %d", err, errLine)
			}
		} else {
			if err != nil {
				t.Fatalf("got %v, want %d prefixes", err, want.Len())
			}
			if !slices.Equal(l.V4, want.V4) || !slices.Equal(l.V6, want.V6) {
				t.Fatalf("got %v\nwant %v", l.Prefixes(), want.Prefixes())
			}
			if st.Lines != lines || st.Entries != l.Len() {
				t.Fatalf("stats %+v, want %d lines and %d entries", st, lines, l.Len())
			}
			for _, k := range l.V4 {
				if p := api.V4Prefix(k); !p.IsValid() || p != p.Masked() || api.V4Key(p) != k {
					t.Fatalf("IPv4 key %#x is not a valid masked prefix", k)
				}
			}
			for _, p := range l.V6 {
				if !p.IsValid() || !p.Addr().Is6() || p != p.Masked() || p.Addr().Zone() != "" || p.Addr().Is4In6() && p.Bits() >= 96 {
					t.Fatalf("IPv6 prefix %v is not valid, masked and unmapped", p)
				}
			}
		}
		// The same list in three chunks, as a list of megabytes is parsed.
		l3, st3, err3 := parseChunks("list.txt", data, nil, 3)
		if fmt.Sprint(err3) != fmt.Sprint(err) || !slices.Equal(l3.V4, l.V4) || !slices.Equal(l3.V6, l.V6) || (err == nil && st3 != st) {
			t.Fatalf("in three chunks: %v %+v, in one: %v %+v", err3, st3, err, st)
		}
	})
}

// refParseCIDRList is the list syntax of cidrlist.go written plainly: lines end at '\n';
// '#' starts a comment; spaces and tabs around an entry and a '\r' at the end of a line
// are ignored; an entry is a prefix or an address (no zone), parsed by net/netip. It
// returns the prefixes, the number of lines, and the first bad line (0 if none).
func refParseCIDRList(data []byte) (api.PrefixList, int, int) {
	var l api.PrefixList
	lines := 0
	for len(data) > 0 {
		lines++
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if i := bytes.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		line = bytes.TrimRight(line, " \t\r")
		line = bytes.TrimLeft(line, " \t")
		if len(line) == 0 {
			continue
		}
		if bytes.IndexByte(line, '/') >= 0 {
			p, err := netip.ParsePrefix(string(line))
			if err != nil {
				return l, lines, lines
			}
			l.Add(p)
			continue
		}
		a, err := netip.ParseAddr(string(line))
		if err != nil || a.Zone() != "" {
			return l, lines, lines
		}
		l.Add(netip.PrefixFrom(a, a.BitLen()))
	}
	return l, lines, 0
}
