package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/labels"
)

// This file holds the layer under the manifest schemas: reading YAML or JSON into
// yaml.Node trees (which carry line numbers), strict typed access to nodes with errors that
// name the field, and turning a document back into JSON for Policy.Raw.

// docParser parses one document. It carries what is known of the document so far, so that
// every error can name the file, the document and the policy.
type docParser struct {
	source    string
	doc       int
	kind      Kind
	namespace string
	name      string
	// host: the rule being parsed has a nodeSelector (a host policy): its L7 rules and
	// toFQDNs are refused, as the host's traffic passes no proxy.
	host   bool
	audit  bool // the policy's AuditAnnotation says "true"
	groups bool // CiliumCIDRGroup, TapContract and TrafficControl documents are accepted (Parse, not ParseDocuments)
	// root and rootJSON: the document's node and, when the reader had it, its JSON
	// rendering, which toJSON returns instead of rendering root again.
	root     *yaml.Node
	rootJSON []byte
}

func (d *docParser) fail(n *yaml.Node, path, format string, args ...any) *ParseError {
	for i, a := range args {
		if s, ok := a.(string); ok {
			args[i] = labels.Shorten(s)
		}
	}
	e := &ParseError{
		Source:    d.source,
		Document:  d.doc,
		Kind:      d.kind,
		Namespace: d.namespace,
		Name:      d.name,
		Field:     path,
		Reason:    fmt.Sprintf(format, args...),
	}
	if n != nil {
		e.Line = n.Line
	}
	return e
}

func (d *docParser) unknown(e entry) *ParseError {
	return d.fail(e.key, e.path, ReasonUnknownField)
}

func (d *docParser) unsupported(e entry) *ParseError {
	return d.fail(e.key, e.path, ReasonNotSupported)
}

// isIdent reports whether key matches ^[A-Za-z0-9_-]+$: a path element written plain.
// (A loop, not a regexp: it runs for every node of a manifest.)
func isIdent(key string) bool {
	if key == "" {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// fieldPath appends a mapping key to a path. Keys that are not plain identifiers (label
// keys such as app.kubernetes.io/name) are written as ["key"] so the path stays readable.
func fieldPath(parent, key string) string {
	if !isIdent(key) {
		return parent + "[" + strconv.Quote(key) + "]"
	}
	if parent == "" {
		return key
	}
	return parent + "." + key
}

func indexPath(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}

// entry is one key/value pair of a mapping.
type entry struct {
	name string
	key  *yaml.Node
	val  *yaml.Node
	path string
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// describe names a node's type for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "null"
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		case "!!int", "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		}
		return fmt.Sprintf("%s %q", n.Tag, n.Value)
	}
	return "an empty node"
}

// noAlias refuses YAML aliases: they are rare in manifests, and expanding them blindly
// would let a small document grow without bound.
func (d *docParser) noAlias(n *yaml.Node, path string) error {
	if n.Kind == yaml.AliasNode {
		return d.fail(n, path, "YAML aliases are not supported")
	}
	return nil
}

// mapping returns the entries of a mapping node in document order, refusing duplicate keys.
// A null node is an empty mapping.
func (d *docParser) mapping(n *yaml.Node, path string) ([]entry, error) {
	if err := d.noAlias(n, path); err != nil {
		return nil, err
	}
	if isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, d.fail(n, path, "must be a mapping, not %s", describe(n))
	}
	// Duplicates are found by scanning the entries so far while there are few (a
	// manifest's mappings mostly have one to four keys), with a set beyond that.
	const scanUpTo = 16
	var seen map[string]bool
	if len(n.Content)/2 > scanUpTo {
		seen = make(map[string]bool, len(n.Content)/2)
	}
	out := make([]entry, 0, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if err := d.noAlias(k, path); err != nil {
			return nil, err
		}
		if k.Kind != yaml.ScalarNode {
			return nil, d.fail(k, path, "mapping keys must be strings, not %s", describe(k))
		}
		p := fieldPath(path, k.Value)
		dup := seen[k.Value]
		if seen == nil {
			for _, e := range out {
				dup = dup || e.name == k.Value
			}
		} else {
			seen[k.Value] = true
		}
		if dup {
			return nil, d.fail(k, p, "duplicate field")
		}
		if v.Kind == yaml.AliasNode {
			return nil, d.noAlias(v, p)
		}
		out = append(out, entry{name: k.Value, key: k, val: v, path: p})
	}
	return out, nil
}

// sequence returns the items of a list node. A null node is an empty list.
func (d *docParser) sequence(n *yaml.Node, path string) ([]*yaml.Node, error) {
	if err := d.noAlias(n, path); err != nil {
		return nil, err
	}
	if isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, d.fail(n, path, "must be a list, not %s", describe(n))
	}
	for i, c := range n.Content {
		if c.Kind == yaml.AliasNode {
			// The item's path only for the error: built for every item, it cost more
			// than the check.
			return nil, d.noAlias(c, indexPath(path, i))
		}
	}
	return n.Content, nil
}

// str returns a string scalar. Numbers and booleans are refused: Kubernetes would refuse
// them too, and quoting them is the user's intent made explicit.
func (d *docParser) str(n *yaml.Node, path string) (string, error) {
	if err := d.noAlias(n, path); err != nil {
		return "", err
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return "", d.fail(n, path, "must be a string, not %s", describe(n))
	}
	return n.Value, nil
}

// integer returns an integer scalar.
func (d *docParser) integer(n *yaml.Node, path string) (int64, error) {
	if err := d.noAlias(n, path); err != nil {
		return 0, err
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		return 0, d.fail(n, path, "must be an integer, not %s", describe(n))
	}
	v, err := decodeInt(n)
	if err != nil {
		return 0, d.fail(n, path, "integer %s out of range", n.Value)
	}
	return v, nil
}

// decodeInt is the value of an !!int scalar. A plain decimal (an optional minus, no
// leading zero) is read directly; anything else (0x1F, 0o17, 017, +5, 1_000) as YAML
// decodes it, which costs a decoder per node.
func decodeInt(n *yaml.Node) (int64, error) {
	s := n.Value
	digits := strings.TrimPrefix(s, "-")
	plain := len(digits) > 0 && len(digits) <= 18 && (digits[0] != '0' || digits == "0")
	for i := 0; plain && i < len(digits); i++ {
		plain = '0' <= digits[i] && digits[i] <= '9'
	}
	if plain {
		return strconv.ParseInt(s, 10, 64)
	}
	var v int64
	err := n.Decode(&v)
	return v, err
}

// boolean returns a boolean scalar.
func (d *docParser) boolean(n *yaml.Node, path string) (bool, error) {
	if err := d.noAlias(n, path); err != nil {
		return false, err
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		return false, d.fail(n, path, "must be true or false, not %s", describe(n))
	}
	var v bool
	if err := n.Decode(&v); err != nil {
		return false, d.fail(n, path, "invalid boolean %q", n.Value)
	}
	return v, nil
}

// scalar checks that n is a single value (any type), for informational fields.
func (d *docParser) scalar(n *yaml.Node, path string) error {
	if err := d.noAlias(n, path); err != nil {
		return err
	}
	if n.Kind != yaml.ScalarNode {
		return d.fail(n, path, "must be a single value, not %s", describe(n))
	}
	return nil
}

// stringMap checks a mapping of strings to strings (metadata labels and annotations).
func (d *docParser) stringMap(n *yaml.Node, path string) error {
	entries, err := d.mapping(n, path)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if _, err := d.str(e.val, e.path); err != nil {
			return err
		}
	}
	return nil
}

// readDocuments reads data, from source, document by document and calls fn with each
// non-empty one (doc is its 1-based index in the stream). JSON (a .json source, or data
// that is a valid JSON value) is read with encoding/json, because YAML parsers reject some
// valid JSON (escapes such as \/); everything else is read as a YAML stream. The limits of
// limits.go are checked before anything is decoded that they bound, and a document's tree
// is dropped once fn returns, so memory follows the largest document, not the stream.
//
// raw, when not nil, is the document's JSON rendering as toJSON would write it (see
// readValidJSON).
func readDocuments(source string, data []byte, fn func(doc int, n *yaml.Node, raw []byte) error) error {
	if err := checkSize(source, len(data)); err != nil {
		return err
	}
	if (jsonName(source) || jsonStart(data)) && len(data) <= MaxDocumentBytes {
		// The fast reader checks the syntax and the depth as it reads (a text that
		// json.Valid accepts is JSON whatever its name). A text it does not take, invalid
		// or too deep, goes the way below, whose checks say what is wrong in the order
		// the limits promise.
		n, raw, err := readValidJSON(data)
		if err == nil {
			return fn(1, n, raw)
		}
		if !errors.Is(err, errNotValidJSON) {
			return err
		}
	}
	if isJSON, valid := jsonInput(source, data); isJSON {
		if len(data) > MaxDocumentBytes {
			return &LimitError{Source: source, Document: 1, Line: 1, Limit: LimitDocumentSize, Value: int64(len(data)), Max: MaxDocumentBytes}
		}
		if err := jsonDepth(source, data); err != nil {
			return err
		}
		var n *yaml.Node
		var raw []byte
		var err error
		if valid {
			n, raw, err = readValidJSON(data)
		} else {
			n, err = readJSON(data) // for its errors
		}
		if err != nil {
			return err
		}
		return fn(1, n, raw)
	}
	if err := yamlDocumentSizes(source, data); err != nil {
		return err
	}
	first := 1
	if fastYAMLEnabled && fastYAMLOK(data) {
		// A document goes to fn once the reader has read the next one too: yaml.v3 finds
		// some errors of a document only while reading into the next one, so when the
		// fast reader gives up, yaml.v3 reads again from the document before.
		y := newFastYAML(data)
		var pending *yaml.Node
		for {
			n, done, ok := y.next()
			stop := y.docs + 1 // the document the fast reader did not take
			if ok && !done && y.docs > MaxDocuments {
				// Over the limit: yaml.v3's error names its line.
				ok, stop = false, y.docs
			}
			if !ok {
				first = max(1, stop-1)
				break
			}
			if pending != nil {
				doc := y.docs - 1
				if done {
					doc = y.docs
				}
				// No nodeDepth: the fast reader leaves a document deeper than MaxDepth
				// to yaml.v3.
				if err := fn(doc, pending, nil); err != nil {
					return err
				}
			}
			if done {
				return nil
			}
			pending = n
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for doc := 1; ; doc++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return yamlSyntaxError(source, doc, err)
		}
		if doc < first {
			// Read by the fast reader already.
			continue
		}
		if doc > MaxDocuments {
			return &LimitError{Source: source, Document: doc, Line: n.Line, Limit: LimitDocuments, Value: int64(doc), Max: MaxDocuments}
		}
		if n.Kind != yaml.DocumentNode || len(n.Content) == 0 || isNull(n.Content[0]) {
			continue
		}
		if err := nodeDepth(source, doc, n.Content[0]); err != nil {
			return err
		}
		if err := fn(doc, n.Content[0], nil); err != nil {
			return err
		}
	}
}

// jsonInput reports whether data is to be read as JSON (a .json source, or a text that
// is valid JSON and starts like an object or array), and whether it is valid JSON.
func jsonInput(source string, data []byte) (isJSON, valid bool) {
	if jsonName(source) {
		return true, json.Valid(data)
	}
	if jsonStart(data) && json.Valid(data) {
		return true, true
	}
	return false, false
}

// jsonName reports whether source names a JSON file.
func jsonName(source string) bool { return strings.HasSuffix(strings.ToLower(source), ".json") }

// jsonStart reports whether data starts like a JSON object or array.
func jsonStart(data []byte) bool {
	t := bytes.TrimLeft(data, " \t\r\n")
	return len(t) > 0 && (t[0] == '{' || t[0] == '[')
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxError is a document-level error before the document could be read; ParseDocuments
// fills in the source.
type syntaxError struct {
	doc    int
	line   int
	reason string
}

func (e *syntaxError) Error() string { return e.reason }

// yamlMaxDepth is the nesting at which the YAML decoder stops on its own.
const yamlMaxDepth = 10000

func yamlSyntaxError(source string, doc int, err error) error {
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		if strings.HasPrefix(m[2], "exceeded max depth") {
			// Deeper than the decoder goes: well past MaxDepth, and the same error as a
			// document that is less deep.
			return &LimitError{Source: source, Document: doc, Line: line, Limit: LimitDepth, Value: yamlMaxDepth + 1, Max: MaxDepth}
		}
		return &syntaxError{doc: doc, line: line, reason: "invalid YAML: " + m[2]}
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	if strings.HasPrefix(msg, "exceeded max depth") {
		return &LimitError{Source: source, Document: doc, Limit: LimitDepth, Value: yamlMaxDepth + 1, Max: MaxDepth}
	}
	return &syntaxError{doc: doc, reason: "invalid YAML: " + msg}
}

// jsonReader builds yaml.Node trees from JSON tokens, with line numbers.
type jsonReader struct {
	dec      *json.Decoder
	newlines []int64 // offsets of '\n' in the input
}

func readJSON(data []byte) (*yaml.Node, error) {
	r := &jsonReader{dec: json.NewDecoder(bytes.NewReader(data))}
	r.dec.UseNumber()
	for i, c := range data {
		if c == '\n' {
			r.newlines = append(r.newlines, int64(i))
		}
	}
	n, err := r.value()
	if err != nil {
		return nil, err
	}
	if _, err := r.dec.Token(); !errors.Is(err, io.EOF) {
		return nil, &syntaxError{doc: 1, line: r.line(r.dec.InputOffset()), reason: "invalid JSON: unexpected data after the top-level value"}
	}
	return n, nil
}

// line returns the 1-based line of the byte at offset off.
func (r *jsonReader) line(off int64) int {
	return sort.Search(len(r.newlines), func(i int) bool { return r.newlines[i] >= off }) + 1
}

func (r *jsonReader) token() (json.Token, int, error) {
	tok, err := r.dec.Token()
	if err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, 0, &syntaxError{doc: 1, line: r.line(se.Offset - 1), reason: "invalid JSON: " + se.Error()}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, 0, &syntaxError{doc: 1, line: r.line(r.dec.InputOffset()), reason: "invalid JSON: unexpected end of input"}
		}
		return nil, 0, &syntaxError{doc: 1, reason: "invalid JSON: " + err.Error()}
	}
	// InputOffset is just past the token; no JSON token spans a line break.
	return tok, r.line(r.dec.InputOffset() - 1), nil
}

func (r *jsonReader) value() (*yaml.Node, error) {
	tok, line, err := r.token()
	if err != nil {
		return nil, err
	}
	return r.valueFrom(tok, line)
}

func (r *jsonReader) valueFrom(tok json.Token, line int) (*yaml.Node, error) {
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Style: yaml.FlowStyle, Line: line}
			for r.dec.More() {
				ktok, kline, err := r.token()
				if err != nil {
					return nil, err
				}
				k, _ := ktok.(string) // the decoder guarantees object keys are strings
				v, err := r.value()
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k, Style: yaml.DoubleQuotedStyle, Line: kline}, v)
			}
			if _, _, err := r.token(); err != nil { // '}'
				return nil, err
			}
			return n, nil
		case '[':
			n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Style: yaml.FlowStyle, Line: line}
			for r.dec.More() {
				v, err := r.value()
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, v)
			}
			if _, _, err := r.token(); err != nil { // ']'
				return nil, err
			}
			return n, nil
		}
		return nil, &syntaxError{doc: 1, line: line, reason: fmt.Sprintf("invalid JSON: unexpected %q", t)}
	case string:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: t, Style: yaml.DoubleQuotedStyle, Line: line}, nil
	case json.Number:
		tag := "!!int"
		if strings.ContainsAny(string(t), ".eE") {
			tag = "!!float"
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: string(t), Line: line}, nil
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(t), Line: line}, nil
	case nil:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null", Line: line}, nil
	}
	return nil, &syntaxError{doc: 1, line: line, reason: fmt.Sprintf("invalid JSON: unexpected token %v", tok)}
}

// toJSON renders a document node as JSON, keeping the order of mapping keys.
func (d *docParser) toJSON(n *yaml.Node) ([]byte, error) {
	if n == d.root && d.rootJSON != nil {
		return d.rootJSON, nil
	}
	var b bytes.Buffer
	// Field paths only name the field of an error: render without them, and only on an
	// error render again with them (building a path for every node of a large document
	// cost more than rendering it).
	if d.writeJSON(&b, n, "", false) == nil {
		return b.Bytes(), nil
	}
	b.Reset()
	if err := d.writeJSON(&b, n, "", true); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// writeJSON renders n into b; path is n's field path if paths is set.
func (d *docParser) writeJSON(b *bytes.Buffer, n *yaml.Node, path string, paths bool) error {
	switch n.Kind {
	case yaml.AliasNode:
		return d.noAlias(n, path)
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode {
				return d.fail(k, path, "mapping keys must be strings, not %s", describe(k))
			}
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSONString(b, k.Value)
			b.WriteByte(':')
			child := ""
			if paths {
				child = fieldPath(path, k.Value)
			}
			if err := d.writeJSON(b, n.Content[i+1], child, paths); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			child := ""
			if paths {
				child = indexPath(path, i)
			}
			if err := d.writeJSON(b, c, child, paths); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			b.WriteString("null")
		case "!!bool":
			var v bool
			if err := n.Decode(&v); err != nil {
				return d.fail(n, path, "invalid boolean %q", n.Value)
			}
			b.WriteString(strconv.FormatBool(v))
		case "!!int":
			v, err := decodeInt(n)
			if err != nil {
				return d.fail(n, path, "integer %s out of range", n.Value)
			}
			b.WriteString(strconv.FormatInt(v, 10))
		case "!!float":
			var v float64
			if err := n.Decode(&v); err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
				return d.fail(n, path, "number %s cannot be represented in JSON", n.Value)
			}
			b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
		case "!!str", "!!timestamp", "!!binary":
			// Timestamps (creationTimestamp) and binary stay in their written form.
			writeJSONString(b, n.Value)
		default:
			return d.fail(n, path, "YAML tag %s is not supported", n.Tag)
		}
	default:
		return d.fail(n, path, "empty YAML node")
	}
	return nil
}

func writeJSONString(b *bytes.Buffer, s string) {
	b.Write(appendJSONString(b.AvailableBuffer(), s))
}

// appendJSONString appends s to b as a JSON string, as json.Marshal writes it.
func appendJSONString(b []byte, s string) []byte {
	// Most strings of a manifest need no escaping: write those as they are, byte for byte
	// what json.Marshal writes for them (it also escapes <, > and &).
	plain := true
	for i := 0; plain && i < len(s); i++ {
		c := s[i]
		plain = c >= 0x20 && c < 0x7f && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	if plain {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	enc, _ := json.Marshal(s) // marshalling a string cannot fail
	return append(b, enc...)
}
