package policy

import (
	"bytes"
	"strings"

	"gopkg.in/yaml.v3"
)

// fastYAML reads the block-style YAML that manifests are written in (nested mappings and
// "- " lists by indentation, single-line plain and quoted scalars, single-line flow lists
// and mappings of scalars, comments, "---" between documents) straight into the
// yaml.Node trees that yaml.v3 builds for the same text: the same kinds, tags, values,
// styles, lines and columns (comments are not kept; nothing reads them). yaml.v3 spends
// most of a large YAML apply in its event machinery (docs/benchmarks.md, "Apply to
// enforcement"); this reader takes a tenth of that.
//
// It does not report errors: at the first thing outside that subset (anchors, aliases,
// tags, block scalars, multi-line scalars, escapes, tabs, non-ASCII bytes, an empty value,
// anything invalid) it gives up, and the stream is read by yaml.v3 from that document
// on, so every message and every unusual construct stays as yaml.v3 has it. Its tests
// compare its trees with yaml.v3's on every manifest of the repository.
type fastYAML struct {
	data []byte
	// The current line: its content starts at offset start (column col, 0-based) and
	// ends at end (before the '\n'); line is 1-based. eof is set past the last line.
	pos, start, end, col, line int
	eof                        bool
	started                    bool
	// docStart is set when the current line is a "---" document start.
	docStart bool
	// docs counts the documents read so far.
	docs int
	// probe resolves plain scalars' tags as yaml.v3 does (yaml.Node.ShortTag of an
	// untagged scalar), without allocating a node per scalar.
	probe yaml.Node
	treeBuilder
}

// fastYAMLEnabled lets the tests compare Parse with and without the fast reader.
var fastYAMLEnabled = true

// errNotFast is how fastYAML's parts say that the input is outside the subset.
type errNotFast struct{}

// fastYAMLOK reports whether data can be given to fastYAML at all: ASCII without tabs,
// carriage returns or other control characters but newlines. Anything else goes to
// yaml.v3 (which checks encodings and knows where tabs are allowed).
func fastYAMLOK(data []byte) bool {
	for _, c := range data {
		if c >= 0x7f || c < 0x20 && c != '\n' {
			return false
		}
	}
	return true
}

func newFastYAML(data []byte) *fastYAML {
	return &fastYAML{data: data}
}

// next reads the next document. It returns its root node, done at the end of the stream, and ok false when the document (or what follows it)
// must be read by yaml.v3; y.docs then counts the documents before it.
func (y *fastYAML) next() (root *yaml.Node, done, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, is := r.(errNotFast); !is {
				panic(r)
			}
			root, done, ok = nil, false, false
		}
	}()
	if !y.started {
		y.started = true
		y.advance()
	}
	switch {
	case y.eof:
		return nil, true, true
	case y.docStart:
		y.advance()
	case y.docs > 0:
		// Only a "---" may follow a document.
		y.bail()
	}
	if y.eof || y.docStart {
		// An empty document: yaml.v3 reads some errors after it only while reading it,
		// and readDocuments skips it anyway.
		y.bail()
	}
	if y.col != 0 {
		y.bail()
	}
	n := y.block(-1, 0)
	if !y.eof && !y.docStart || isNull(n) {
		// A null document ("~") is skipped as an empty one: left to yaml.v3 as well.
		y.bail()
	}
	y.docs++
	return n, false, true
}

func (y *fastYAML) bail() { panic(errNotFast{}) }

// deep gives up on a collection inside depth others when that is over MaxDepth: yaml.v3
// and nodeDepth say how deep, as for any document.
func (y *fastYAML) deep(depth int) {
	if depth >= MaxDepth {
		y.bail()
	}
}

// advance moves to the next line that holds anything but a comment.
func (y *fastYAML) advance() {
	y.docStart = false
	for y.pos < len(y.data) {
		y.line++
		s := y.pos
		e := bytes.IndexByte(y.data[s:], '\n')
		if e < 0 {
			e = len(y.data)
			y.pos = e
		} else {
			e += s
			y.pos = e + 1
		}
		i := s
		for i < e && y.data[i] == ' ' {
			i++
		}
		if i == e || y.data[i] == '#' {
			continue
		}
		y.start, y.end, y.col = i, e, i-s
		if i == s {
			switch l := y.data[s:e]; {
			case bytes.Equal(l, []byte("---")):
				y.docStart = true
			case bytes.HasPrefix(l, []byte("---")) || bytes.HasPrefix(l, []byte("...")) || l[0] == '%':
				// A start with content after it, a document end marker, a directive.
				y.bail()
			}
		}
		return
	}
	y.eof = true
	y.start, y.end, y.col = len(y.data), len(y.data), 0
}

// block reads the block node that starts on the current line (at its content), which must
// be indented more than parent. depth counts the collections around it.
func (y *fastYAML) block(parent, depth int) *yaml.Node {
	if y.eof || y.docStart || y.col <= parent {
		y.bail()
	}
	if y.isItem() {
		return y.sequence(depth)
	}
	if _, _, ok := y.keyEnd(); ok {
		return y.mapping(depth)
	}
	// A scalar or flow collection on a line of its own, which must end there.
	n := y.inlineValue(depth)
	y.afterValue(parent)
	return n
}

// null makes the node of an empty value.
func (y *fastYAML) null(line, col int) *yaml.Node {
	return y.node(yaml.ScalarNode, "!!null", "", 0, line, col+1)
}

// isItem reports whether the current content is a list item: "-" then a space or the
// end of the line.
func (y *fastYAML) isItem() bool {
	d := y.data
	return !y.docStart && y.start < y.end && d[y.start] == '-' && (y.start+1 == y.end || d[y.start+1] == ' ')
}

// sequence reads a block list whose first "-" is at the current content.
func (y *fastYAML) sequence(depth int) *yaml.Node {
	y.deep(depth)
	col := y.col
	n := y.node(yaml.SequenceNode, "!!seq", "", 0, y.line, col+1)
	from := len(y.kids)
	// item adds a child; each is read before it is added, as reading it uses kids too.
	item := func(c *yaml.Node) { y.kids = append(y.kids, c) }
	for !y.eof && y.col == col && y.isItem() {
		// The item's content: after "-" and its spaces, on this line, or the lines below.
		i := y.start + 1
		for i < y.end && y.data[i] == ' ' {
			i++
		}
		if i == y.end || y.data[i] == '#' {
			line := y.line
			y.advance()
			if y.eof || y.docStart || y.col <= col {
				item(y.null(line, col+1))
				continue
			}
			item(y.block(col, depth+1))
			continue
		}
		// The rest of the line is read as if it were a line indented to where it starts.
		y.col += i - y.start
		y.start = i
		if y.isItem() {
			item(y.sequence(depth + 1))
			continue
		}
		if _, _, ok := y.keyEnd(); ok {
			item(y.mapping(depth + 1))
			continue
		}
		item(y.inlineValue(depth + 1))
		y.afterValue(col)
	}
	y.noDeeper(col)
	n.Content = y.content(from)
	return n
}

// keyEnd finds the mapping key at the start of the current content: it returns where the
// key's text ends and where its ':' is, or ok false when the line does not start with a
// key (or starts with one outside the subset).
func (y *fastYAML) keyEnd() (keyEnd, colon int, ok bool) {
	d := y.data[:y.end]
	i := y.start
	if i >= len(d) {
		return 0, 0, false
	}
	switch c := d[i]; c {
	case '\'', '"':
		j := y.quotedEnd(i)
		if j < 0 {
			return 0, 0, false
		}
		k := j
		for k < len(d) && d[k] == ' ' {
			k++
		}
		if k < len(d) && d[k] == ':' && (k+1 == len(d) || d[k+1] == ' ') {
			return j, k, true
		}
		return 0, 0, false
	}
	if !plainStart(d, i) {
		return 0, 0, false
	}
	for j := i; j < len(d); j++ {
		switch d[j] {
		case ':':
			if j+1 == len(d) || d[j+1] == ' ' {
				k := j
				for d[k-1] == ' ' {
					k--
				}
				return k, j, true
			}
		case '#':
			if d[j-1] == ' ' {
				return 0, 0, false
			}
		}
	}
	return 0, 0, false
}

// plainStart reports whether a plain scalar may start at d[i] in the subset: not with an
// indicator (YAML allows "-", "?" and ":" before a non-space, which is left to yaml.v3
// but for "-" before a digit: negative numbers).
func plainStart(d []byte, i int) bool {
	switch d[i] {
	case '-':
		return i+1 < len(d) && '0' <= d[i+1] && d[i+1] <= '9'
	case '?', ':', ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '\'', '"', '%', '@', '`', ' ':
		return false
	}
	return true
}

// quotedEnd returns the offset just past the quoted scalar starting at d[i] on the current
// line, or -1 if it does not end on this line or holds a backslash (escapes and folded
// lines are left to yaml.v3).
func (y *fastYAML) quotedEnd(i int) int {
	d := y.data[:y.end]
	q := d[i]
	for j := i + 1; j < len(d); j++ {
		switch d[j] {
		case '\\':
			if q == '"' {
				return -1
			}
		case q:
			if q == '\'' && j+1 < len(d) && d[j+1] == '\'' {
				j++
				continue
			}
			return j + 1
		}
	}
	return -1
}

// quoted makes the node of the quoted scalar d[i:j] (quotes included).
func (y *fastYAML) quoted(i, j int) *yaml.Node {
	d := y.data
	line, col := y.line, y.col+i-y.start
	if d[i] == '"' {
		return y.node(yaml.ScalarNode, "!!str", string(d[i+1:j-1]), yaml.DoubleQuotedStyle, line, col+1)
	}
	v := string(d[i+1 : j-1])
	if strings.Contains(v, "''") {
		v = strings.ReplaceAll(v, "''", "'")
	}
	return y.node(yaml.ScalarNode, "!!str", v, yaml.SingleQuotedStyle, line, col+1)
}

// plain makes the node of the plain scalar v that starts at offset i of the current line.
func (y *fastYAML) plain(v string, i int) *yaml.Node {
	if v == "<<" {
		// A merge key.
		y.bail()
	}
	return y.node(yaml.ScalarNode, y.plainTag(v), v, 0, y.line, y.col+i-y.start+1)
}

// plainTag is the tag yaml.v3 resolves for the plain scalar v. The common cases are
// decided here as yaml.v3's resolve decides them (its first-byte hints, its table of
// words); the rest are left to it, which costs an interface value, a deferred call and,
// for numbers, a try at parsing a timestamp: a sixth of a large manifest's reading.
func (y *fastYAML) plainTag(v string) string {
	switch c := v[0]; {
	case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		switch c {
		case 'y', 'Y', 'n', 'N', 't', 'T', 'f', 'F', 'o', 'O':
			// Looked up in yaml.v3's table of words; anything else is a string.
			switch v {
			case "true", "True", "TRUE", "false", "False", "FALSE":
				return "!!bool"
			case "null", "Null", "NULL":
				return "!!null"
			}
		}
		return "!!str"
	case '1' <= c && c <= '9':
		// A plain decimal that fits an int64: no timestamp (they start with four digits
		// and a '-'), no table word, ParseInt takes it.
		if len(v) <= 18 {
			digits := true
			for i := 1; i < len(v) && digits; i++ {
				digits = '0' <= v[i] && v[i] <= '9'
			}
			if digits {
				return "!!int"
			}
		}
	}
	y.probe = yaml.Node{Kind: yaml.ScalarNode, Value: v}
	return y.probe.ShortTag()
}

// mapping reads a block mapping whose first key starts the current content.
func (y *fastYAML) mapping(depth int) *yaml.Node {
	y.deep(depth)
	col := y.col
	n := y.node(yaml.MappingNode, "!!map", "", 0, y.line, col+1)
	from := len(y.kids)
	// pair adds a key and its value; the value is read before it is added, as reading
	// it uses kids too.
	pair := func(k, v *yaml.Node) { y.kids = append(y.kids, k, v) }
	for !y.eof && !y.docStart && y.col == col {
		kEnd, colon, ok := y.keyEnd()
		if !ok {
			y.bail()
		}
		var k *yaml.Node
		if c := y.data[y.start]; c == '\'' || c == '"' {
			k = y.quoted(y.start, kEnd)
		} else {
			k = y.plain(string(y.data[y.start:kEnd]), y.start)
		}
		i := colon + 1
		for i < y.end && y.data[i] == ' ' {
			i++
		}
		if i == y.end || y.data[i] == '#' {
			// The value is on the lines below: more indented, or a list at the key's
			// indentation; else it is empty (null, placed just after the colon, as
			// yaml.v3 places it).
			line, ccol := y.line, y.col+colon-y.start
			y.advance()
			switch {
			case y.eof || y.docStart || y.col < col:
				pair(k, y.null(line, ccol+1))
			case y.col > col:
				pair(k, y.block(col, depth+1))
			case y.isItem():
				pair(k, y.sequence(depth+1))
			default:
				pair(k, y.null(line, ccol+1))
			}
			continue
		}
		y.col += i - y.start
		y.start = i
		v := y.inlineValue(depth + 1)
		y.col = col
		pair(k, v)
		y.afterValue(col)
	}
	y.noDeeper(col)
	n.Content = y.content(from)
	return n
}

// afterValue moves past a value that ended on its line, whose collection or key is at
// column col: a next line indented more would continue it (or nest under a scalar).
func (y *fastYAML) afterValue(col int) {
	y.advance()
	y.noDeeper(col)
}

// noDeeper gives up when the current line is indented more than col where nothing may be.
func (y *fastYAML) noDeeper(col int) {
	if !y.eof && !y.docStart && y.col > col {
		y.bail()
	}
}

// inlineValue reads a value that starts at the current content and must end on its line:
// a plain or quoted scalar, or a flow collection of scalars.
func (y *fastYAML) inlineValue(depth int) *yaml.Node {
	d := y.data[:y.end]
	i := y.start
	var n *yaml.Node
	var j int
	switch c := d[i]; {
	case c == '\'' || c == '"':
		j = y.quotedEnd(i)
		if j < 0 {
			y.bail()
		}
		n = y.quoted(i, j)
	case c == '[' || c == '{':
		n, j = y.flow(i, depth)
	case plainStart(d, i):
		j = len(d)
		for k := i; k < len(d); k++ {
			if d[k] == '#' && d[k-1] == ' ' {
				j = k
				break
			}
			if d[k] == ':' && (k+1 == len(d) || d[k+1] == ' ') {
				// "a: b: c", or a key: left to yaml.v3.
				y.bail()
			}
		}
		for d[j-1] == ' ' {
			j--
		}
		n = y.plain(string(d[i:j]), i)
	default:
		y.bail()
	}
	// Only spaces and a comment may follow.
	for j < len(d) && d[j] == ' ' {
		j++
	}
	if j < len(d) && (d[j] != '#' || d[j-1] != ' ') {
		y.bail()
	}
	return n
}

// flow reads a flow list or mapping that starts at d[i] and ends on the same line; it
// returns the node and the offset past its closing bracket. Its items are scalars and
// flow collections; keys are scalars.
func (y *fastYAML) flow(i, depth int) (*yaml.Node, int) {
	y.deep(depth)
	d := y.data[:y.end]
	open := d[i]
	closer := byte(']')
	n := y.node(yaml.SequenceNode, "!!seq", "", yaml.FlowStyle, y.line, y.col+i-y.start+1)
	if open == '{' {
		closer = '}'
		n.Kind, n.Tag = yaml.MappingNode, "!!map"
	}
	j := i + 1
	skip := func() {
		for j < len(d) && d[j] == ' ' {
			j++
		}
	}
	// item reads a scalar or (unless key) a collection; key says a ':' ends a scalar.
	item := func(key bool) *yaml.Node {
		skip()
		if j >= len(d) {
			y.bail()
		}
		switch c := d[j]; c {
		case '\'', '"':
			e := y.quotedEnd(j)
			if e < 0 {
				y.bail()
			}
			s := y.quoted(j, e)
			j = e
			return s
		case '[', '{':
			if key {
				y.bail()
			}
			s, e := y.flow(j, depth+1)
			j = e
			return s
		}
		if !plainStart(d, j) {
			y.bail()
		}
		s := j
		for j < len(d) {
			c := d[j]
			if c == ',' || c == closer || key && c == ':' {
				break
			}
			switch c {
			case '[', ']', '{', '}', '#', ':', '"', '\'':
				// Comments, ambiguous colons and the like: left to yaml.v3.
				y.bail()
			}
			j++
		}
		e := j
		for e > s && d[e-1] == ' ' {
			e--
		}
		return y.plain(string(d[s:e]), s)
	}
	skip()
	if j < len(d) && d[j] == closer {
		return n, j + 1
	}
	from := len(y.kids)
	for {
		k := item(open == '{')
		if open == '{' {
			skip()
			if j+1 >= len(d) || d[j] != ':' || d[j+1] != ' ' {
				y.bail()
			}
			j++
			v := item(false)
			y.kids = append(y.kids, k, v)
		} else {
			y.kids = append(y.kids, k)
		}
		skip()
		if j >= len(d) {
			y.bail()
		}
		switch d[j] {
		case closer:
			n.Content = y.content(from)
			return n, j + 1
		case ',':
			j++
		default:
			y.bail()
		}
	}
}
