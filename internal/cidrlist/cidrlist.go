// Package cidrlist parses CIDR list files, the input of `rampart cidrset load` (package
// cli). A list file has one entry per line: an IPv4 or IPv6 prefix ("192.0.2.0/24",
// "2001:db8::/32") or a bare address (a /32 or /128). Everything from '#' to the end of
// the line is a comment; spaces and tabs around the entry, blank lines and CRLF line ends
// are allowed. Host bits are cleared ("192.0.2.7/24" is 192.0.2.0/24), as the policy
// parser and ipset do. Anything else on a line is an error naming the file and the line,
// and then nothing is loaded.
//
// Lists of ten million lines must parse in well under a second, so the parser is
// hand-written: IPv4 entries are decoded byte by byte into api.PrefixList keys without
// allocating, the file is split into one chunk per CPU at line boundaries, and chunks are
// parsed in parallel (line numbers of an error are made absolute afterwards). IPv6 entries
// go through net/netip without copying the line.
package cidrlist

import (
	"bytes"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rampartnet/rampart/internal/api"
)

// Error is the first bad line of a list.
type Error struct {
	File   string
	Line   int // 1-based
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason) }

// Stats describes a parsed list.
type Stats struct {
	Lines   int // lines read, blank and comment lines included
	Entries int // lines with an entry
}

// Parse parses the content of a list file named file. progress, if not nil, is
// advanced by the bytes parsed so far.
func Parse(file string, data []byte, progress *atomic.Int64) (api.PrefixList, Stats, error) {
	n := runtime.GOMAXPROCS(0)
	if len(data) < 1<<20 {
		n = 1
	}
	return parseChunks(file, data, progress, n)
}

// parseChunks is Parse with the list cut into at most n chunks.
func parseChunks(file string, data []byte, progress *atomic.Int64, n int) (api.PrefixList, Stats, error) {
	chunks := splitLines(data, n)
	results := make([]chunkResult, len(chunks))
	var wg sync.WaitGroup
	for i, c := range chunks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = parseChunk(c, progress)
		}()
	}
	wg.Wait()
	var st Stats
	var n4, n6 int
	for _, r := range results {
		if r.errLine > 0 {
			return api.PrefixList{}, st, &Error{File: file, Line: st.Lines + r.errLine, Reason: r.reason}
		}
		st.Lines += r.lines
		st.Entries += len(r.list.V4) + len(r.list.V6)
		n4 += len(r.list.V4)
		n6 += len(r.list.V6)
	}
	// The agent takes no more in one request; say so before sending hundreds of MB.
	if n4 > api.MaxPrefixes {
		return api.PrefixList{}, st, fmt.Errorf("%s: %d IPv4 prefixes exceed the limit of %d in one list", file, n4, api.MaxPrefixes)
	}
	if n6 > api.MaxPrefixesV6 {
		return api.PrefixList{}, st, fmt.Errorf("%s: %d IPv6 prefixes exceed the limit of %d in one list", file, n6, api.MaxPrefixesV6)
	}
	if len(results) == 1 {
		return results[0].list, st, nil
	}
	out := api.PrefixList{V4: make([]uint64, 0, n4), V6: make([]netip.Prefix, 0, n6)}
	for _, r := range results {
		out.V4 = append(out.V4, r.list.V4...)
		out.V6 = append(out.V6, r.list.V6...)
	}
	return out, st, nil
}

// splitLines cuts data into at most n pieces that end at line ends.
func splitLines(data []byte, n int) [][]byte {
	var out [][]byte
	for n > 1 && len(data) > 0 {
		cut := len(data) / n
		if i := bytes.IndexByte(data[cut:], '\n'); i >= 0 {
			cut += i + 1
		} else {
			cut = len(data)
		}
		out = append(out, data[:cut])
		data = data[cut:]
		n--
	}
	if len(data) > 0 {
		out = append(out, data)
	}
	return out
}

type chunkResult struct {
	list    api.PrefixList
	lines   int
	errLine int // 1-based line of the first bad line in the chunk, 0 if none
	reason  string
}

func parseChunk(data []byte, progress *atomic.Int64) chunkResult {
	var r chunkResult
	// A slot for every possible line (the shortest, "1.2.3.4\n", has 8 bytes): the list is
	// never grown and copied while parsing, and untouched capacity costs no memory.
	r.list.V4 = make([]uint64, 0, len(data)/8+1)
	reported := 0
	for pos := 0; pos < len(data); {
		r.lines++
		if progress != nil && pos-reported >= 1<<20 {
			progress.Add(int64(pos - reported))
			reported = pos
		}
		// Fast path: an IPv4 entry alone on its line, decoded in place.
		if k, n := scanV4(data[pos:]); n > 0 {
			end := pos + n
			for end < len(data) && (data[end] == ' ' || data[end] == '\t' || data[end] == '\r') {
				end++
			}
			if end == len(data) || data[end] == '\n' {
				r.list.V4 = append(r.list.V4, k)
				pos = end + 1
				continue
			}
		}
		end := bytes.IndexByte(data[pos:], '\n')
		if end < 0 {
			end = len(data)
		} else {
			end += pos
		}
		line := data[pos:end]
		pos = end + 1
		if i := bytes.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		line = trimSpace(line)
		if len(line) == 0 {
			continue
		}
		if k, n := scanV4(line); n == len(line) {
			r.list.V4 = append(r.list.V4, k)
			continue
		}
		p, reason := parseOther(line)
		if reason != "" {
			r.errLine, r.reason = r.lines, reason
			return r
		}
		r.list.Add(p)
	}
	if progress != nil && len(data) > reported {
		progress.Add(int64(len(data) - reported))
	}
	return r
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 {
		c := b[len(b)-1]
		if c != ' ' && c != '\t' && c != '\r' {
			break
		}
		b = b[:len(b)-1]
	}
	return b
}

// parseV4 decodes an entry that is exactly "a.b.c.d" or "a.b.c.d/n".
func parseV4(b []byte) (uint64, bool) {
	k, n := scanV4(b)
	return k, n > 0 && n == len(b)
}

// scanV4 decodes "a.b.c.d" or "a.b.c.d/n" (decimal, no leading zeros, as net/netip
// requires) at the start of b into a masked PrefixList key, and returns how many bytes it
// took (0 if b does not start with one; the caller checks what follows).
func scanV4(b []byte) (uint64, int) {
	var addr uint32
	i := 0
	for part := 0; part < 4; part++ {
		if part > 0 {
			if i >= len(b) || b[i] != '.' {
				return 0, 0
			}
			i++
		}
		v, n := decimal(b[i:], 3)
		if n == 0 || v > 255 {
			return 0, 0
		}
		addr = addr<<8 | v
		i += n
	}
	bits := uint32(32)
	if i < len(b) && b[i] == '/' {
		v, n := decimal(b[i+1:], 2)
		if n == 0 || v > 32 {
			return 0, 0
		}
		bits = v
		i += 1 + n
	}
	if i < len(b) && (b[i] == '.' || b[i] == '/' || b[i] == ':') {
		return 0, 0 // more address follows: not a plain IPv4 entry
	}
	if bits < 32 {
		addr &^= 1<<(32-bits) - 1
	}
	return uint64(addr)<<8 | uint64(bits), i
}

// decimal reads at most max digits, refusing leading zeros ("0" itself is fine).
func decimal(b []byte, max int) (uint32, int) {
	var v uint32
	n := 0
	for n < len(b) && n < max && b[n] >= '0' && b[n] <= '9' {
		v = v*10 + uint32(b[n]-'0')
		n++
	}
	if n > 1 && b[0] == '0' {
		return 0, 0
	}
	if n < len(b) && b[n] >= '0' && b[n] <= '9' {
		return 0, 0 // too many digits
	}
	return v, n
}

// parseOther parses an entry that is not plain IPv4 (IPv6, or a mistake) with net/netip
// and says what is wrong if it is not valid.
func parseOther(b []byte) (netip.Prefix, string) {
	// net/netip keeps no reference to the string: no need to copy the line.
	s := unsafe.String(&b[0], len(b))
	if i := bytes.IndexAny(b, " \t"); i >= 0 {
		return netip.Prefix{}, fmt.Sprintf("unexpected text after %q (one CIDR per line)", b[:i])
	}
	if bytes.IndexByte(b, '/') >= 0 {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Sprintf("invalid CIDR %q", b)
		}
		return p.Masked(), ""
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Sprintf("invalid address or CIDR %q", b)
	}
	return netip.PrefixFrom(a, a.BitLen()), ""
}

// ParseArgs parses CIDRs given on the command line, with the list file syntax.
func ParseArgs(args []string) (api.PrefixList, error) {
	var l api.PrefixList
	for _, arg := range args {
		b := trimSpace([]byte(arg))
		if len(b) == 0 {
			return l, fmt.Errorf("empty CIDR argument")
		}
		if k, ok := parseV4(b); ok {
			l.V4 = append(l.V4, k)
			continue
		}
		p, reason := parseOther(b)
		if reason != "" {
			return l, fmt.Errorf("%s", reason)
		}
		l.Add(p)
	}
	return l, nil
}
