package policy

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/labels"
)

// Limits on manifest input. A manifest comes from a user or a program through the agent's
// API, so what parsing it may cost is bounded before it is parsed: reading a document into
// a tree takes up to about a hundred times its size in memory when it is made of tiny
// items, and nesting would otherwise cost stack (a few million '[' overflowed the agent's
// stack). Each limit is far above what real manifests need (the corpus in
// testdata/manifests: 3.7 KB at most, nesting depth 10).
const (
	// MaxManifestBytes bounds one manifest source (a file, stdin) and all the sources of
	// one request together.
	MaxManifestBytes = 8 << 20
	// MaxDocumentBytes bounds one YAML document, or a JSON manifest: above the 1.5 MiB
	// Kubernetes stores for one object (etcd's default request limit).
	MaxDocumentBytes = 2 << 20
	// MaxDocuments bounds the documents of one source, and the policies and CIDR groups of
	// one request.
	MaxDocuments = 10000
	// MaxDepth bounds the nesting of mappings and lists (a top-level mapping is depth 1).
	MaxDepth = 64
	// MaxSourceBytes bounds the name of a source (a path: Linux's PATH_MAX), which every
	// policy and message repeats.
	MaxSourceBytes = 4096
	// MaxSources bounds the manifests (files) of one request.
	MaxSources = MaxDocuments
)

// ErrLimit is matched (errors.Is) by every *LimitError.
var ErrLimit = errors.New("manifest over a limit")

// LimitError is a manifest refused because it crosses one of the limits above, before it
// is parsed further.
type LimitError struct {
	Source   string // file name, or "-" for stdin
	Document int    // 1-based document the limit was crossed in; 0 for the whole source
	Line     int    // 1-based line where it was crossed; 0 if not known
	// Limit names what is limited: one of the Limit constants below.
	Limit string
	Value int64 // the value seen (for depth and documents, where the reading stopped)
	Max   int64
}

// Names of the limits, as LimitError.Limit and in messages.
const (
	LimitSize         = "manifest size"
	LimitDocumentSize = "document size"
	LimitDocuments    = "number of documents"
	LimitDepth        = "nesting depth"
	// LimitPolicies is MaxDocuments applied to the policies and CIDR groups of a request.
	LimitPolicies   = "number of policies and CIDR groups in the request"
	LimitSourceName = "source name length"
	LimitSources    = "number of manifests in the request"
)

// Error renders e.g.
//
//	deep.json: document 1 (line 1): nesting depth 65 exceeds the limit of 64
//	big.yaml: manifest size 9437184 bytes exceeds the limit of 8388608 bytes
func (e *LimitError) Error() string {
	var b strings.Builder
	b.WriteString(labels.Shorten(e.Source))
	if e.Document > 0 {
		fmt.Fprintf(&b, ": document %d", e.Document)
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, " (line %d)", e.Line)
	}
	unit := ""
	if e.Limit == LimitSize || e.Limit == LimitDocumentSize || e.Limit == LimitSourceName {
		unit = " bytes"
	}
	fmt.Fprintf(&b, ": %s %d%s exceeds the limit of %d%s", e.Limit, e.Value, unit, e.Max, unit)
	return b.String()
}

// Is makes errors.Is(err, ErrLimit) true.
func (e *LimitError) Is(target error) bool { return target == ErrLimit }

// CheckLimits checks data, read from source, against every limit above the way Parse does,
// without checking what the documents say: a client calls it to refuse a manifest before
// sending it, with the message the agent would give. Syntax errors are left to Parse.
func CheckLimits(source string, data []byte) error {
	data = bytes.TrimPrefix(data, bom)
	err := readDocuments(source, data, func(int, *yaml.Node, []byte) error { return nil })
	var le *LimitError
	if errors.As(err, &le) {
		return le
	}
	return nil
}

// checkSize checks the size of a whole source, and its name.
func checkSize(source string, n int) error {
	if len(source) > MaxSourceBytes {
		return &LimitError{Source: source, Limit: LimitSourceName, Value: int64(len(source)), Max: MaxSourceBytes}
	}
	if n > MaxManifestBytes {
		return &LimitError{Source: source, Limit: LimitSize, Value: int64(n), Max: MaxManifestBytes}
	}
	return nil
}

// jsonDepth checks the nesting of a JSON text before anything decodes it recursively.
func jsonDepth(source string, data []byte) error {
	if depth, off := JSONDepth(data, MaxDepth); depth > MaxDepth {
		return &LimitError{Source: source, Document: 1, Line: lineAt(data, off), Limit: LimitDepth, Value: int64(depth), Max: MaxDepth}
	}
	return nil
}

// JSONDepth returns the deepest nesting of '[' and '{' outside strings in a JSON text,
// scanning no further than the first one past limit: then it returns limit+1 and that
// bracket's offset (otherwise the offset is -1). Its only state is the depth, so it costs
// no memory whatever the input, and it does not check the rest of the syntax.
func JSONDepth(data []byte, limit int) (depth, offset int) {
	cur, inString, escaped := 0, false, false
	for i, c := range data {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			cur++
			if cur > limit {
				return cur, i
			}
			depth = max(depth, cur)
		case c == ']' || c == '}':
			cur--
		}
	}
	return depth, -1
}

// lineAt is the 1-based line of data[off].
func lineAt(data []byte, off int) int {
	return bytes.Count(data[:off], []byte("\n")) + 1
}

// yamlDocumentSizes checks the size of every document of a YAML stream before the stream
// is decoded, since the decoder builds a whole document before it returns it. Documents
// are cut at "---" lines, which end any document and any scalar in YAML (a line starting
// with "---" or "..." and a blank, or alone, is a document marker wherever it is), so no
// document can be larger than a piece found here. The first piece counts as a document
// as soon as it holds anything, as the decoder counts it: a comment or a directive alone
// makes the numbers differ by one for the rest of the stream, which only changes the
// number in the message.
func yamlDocumentSizes(source string, data []byte) error {
	// piece counts the "---" lines seen; first is set when the piece before the first one
	// holds anything, which makes it document 1.
	piece, first := 0, false
	start, startLine, line := 0, 1, 1
	check := func(end int) error {
		if end-start <= MaxDocumentBytes {
			return nil
		}
		doc := piece
		if first || piece == 0 {
			doc++
		}
		return &LimitError{Source: source, Document: doc, Line: startLine, Limit: LimitDocumentSize, Value: int64(end - start), Max: MaxDocumentBytes}
	}
	for pos := 0; pos < len(data); line++ {
		end := bytes.IndexByte(data[pos:], '\n')
		if end < 0 {
			end = len(data)
		} else {
			end += pos
		}
		switch l := data[pos:end]; {
		case isDocumentStart(l):
			if err := check(pos); err != nil {
				return err
			}
			piece++
			start, startLine = pos, line
		case piece == 0 && !first:
			first = len(bytes.TrimSpace(l)) > 0
		}
		pos = end + 1
	}
	return check(len(data))
}

// isDocumentStart reports whether a line is a "---" document start marker.
func isDocumentStart(line []byte) bool {
	return bytes.HasPrefix(line, []byte("---")) && (len(line) == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r')
}

// nodeDepth checks the nesting of a decoded YAML document. The decoder itself stops at
// a depth of 10,000, so its trees are small enough to reach here; aliases are not
// followed (they are refused later, and following them is what makes alias bombs grow).
func nodeDepth(source string, doc int, root *yaml.Node) error {
	type item struct {
		n     *yaml.Node
		depth int
	}
	stack := []item{{root, 0}}
	for len(stack) > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		d := it.depth
		if it.n.Kind == yaml.MappingNode || it.n.Kind == yaml.SequenceNode {
			d++
			if d > MaxDepth {
				return &LimitError{Source: source, Document: doc, Line: it.n.Line, Limit: LimitDepth, Value: int64(d), Max: MaxDepth}
			}
		}
		for _, c := range it.n.Content {
			stack = append(stack, item{c, d})
		}
	}
	return nil
}
