package policy

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"gopkg.in/yaml.v3"
)

// ParseObject parses one manifest that is already decoded: obj is a Kubernetes object as
// a map of JSON values (string, bool, nil, int64 and the other integers, float64,
// []any, map[string]any, and the string slices and maps of labels and annotations),
// as the API machinery's unstructured objects and converters hold them. source names it
// in messages.
//
// It checks obj exactly as Parse checks the same object written as JSON: the same
// fields, the same errors (mapping keys are read in sorted order, as a JSON rendering of
// the map lists them), the same limits (its nesting, and the size of its JSON rendering),
// with no text in between: no line numbers either. Policies, CIDR groups and tap
// contracts carry the object's JSON rendering as Raw, as Parse's do: written while the
// tree is built, as the JSON reader keeps its text, not rendered from the tree again.
func ParseObject(source string, obj map[string]any) (*Documents, error) {
	if err := checkSize(source, 0); err != nil {
		return nil, err
	}
	b := &objectTree{source: source}
	n, err := b.value(obj, 0)
	if err != nil {
		return nil, err
	}
	if len(b.raw) > MaxDocumentBytes {
		return nil, &LimitError{Source: source, Document: 1, Limit: LimitDocumentSize, Value: int64(len(b.raw)), Max: MaxDocumentBytes}
	}
	out := &Documents{}
	d := &docParser{source: source, doc: 1, groups: true, root: n, rootJSON: b.raw}
	if err := d.document(n, out); err != nil {
		return nil, err
	}
	return out, nil
}

// objectTree builds the yaml.Node tree of a decoded object, the tree the parser reads.
type objectTree struct {
	source string
	// raw is the object's JSON rendering so far, as writeJSON renders the tree.
	raw []byte
	// keys holds the sorted keys of the mappings being built.
	keys []string
	treeBuilder
}

func (b *objectTree) scalar(tag, value string) *yaml.Node {
	style := yaml.Style(0)
	if tag == "!!str" {
		style = yaml.DoubleQuotedStyle
		b.raw = appendJSONString(b.raw, value)
	} else {
		b.raw = append(b.raw, value...)
	}
	return b.node(yaml.ScalarNode, tag, value, style, 0, 0)
}

func (b *objectTree) value(v any, depth int) (*yaml.Node, error) {
	switch v := v.(type) {
	case nil:
		return b.scalar("!!null", "null"), nil
	case string:
		return b.scalar("!!str", v), nil
	case bool:
		return b.scalar("!!bool", strconv.FormatBool(v)), nil
	case int64:
		return b.scalar("!!int", strconv.FormatInt(v, 10)), nil
	case int:
		return b.scalar("!!int", strconv.Itoa(v)), nil
	case int32:
		return b.scalar("!!int", strconv.FormatInt(int64(v), 10)), nil
	case uint64:
		return b.scalar("!!int", strconv.FormatUint(v, 10)), nil
	case float64:
		return b.float(v)
	case map[string]any:
		return objectMapping(b, depth, v)
	case map[string]string:
		return objectMapping(b, depth, v)
	case []any:
		return objectSequence(b, depth, v)
	case []string:
		return objectSequence(b, depth, v)
	}
	return nil, &ParseError{Source: b.source, Document: 1, Reason: fmt.Sprintf("a value of Go type %T is not a JSON value", v)}
}

// float is a number as its JSON rendering reads: an integral one as an integer.
func (b *objectTree) float(v float64) (*yaml.Node, error) {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return nil, &ParseError{Source: b.source, Document: 1, Reason: fmt.Sprintf("number %v cannot be represented in JSON", v)}
	}
	if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
		return b.scalar("!!int", strconv.FormatInt(int64(v), 10)), nil
	}
	return b.scalar("!!float", strconv.FormatFloat(v, 'g', -1, 64)), nil
}

func (b *objectTree) open(depth int, bracket byte) error {
	if depth+1 > MaxDepth {
		return &LimitError{Source: b.source, Document: 1, Limit: LimitDepth, Value: int64(depth + 1), Max: MaxDepth}
	}
	b.raw = append(b.raw, bracket)
	return nil
}

// objectMapping is m's node, its keys in sorted order (as a JSON rendering lists them).
func objectMapping[V any](b *objectTree, depth int, m map[string]V) (*yaml.Node, error) {
	if err := b.open(depth, '{'); err != nil {
		return nil, err
	}
	n := b.node(yaml.MappingNode, "!!map", "", yaml.FlowStyle, 0, 0)
	from := len(b.kids)
	// The keys go on a stack that every mapping of the object shares (a nested one's
	// above this one's until it is done), instead of a slice of their own each.
	start := len(b.keys)
	for k := range m {
		b.keys = append(b.keys, k)
	}
	slices.Sort(b.keys[start:])
	defer func() { b.keys = b.keys[:start] }()
	for i := range len(m) {
		k := b.keys[start+i]
		if i > 0 {
			b.raw = append(b.raw, ',')
		}
		key := b.scalar("!!str", k)
		b.raw = append(b.raw, ':')
		val, err := b.value(m[k], depth+1)
		if err != nil {
			return nil, err
		}
		b.kids = append(b.kids, key, val)
	}
	b.raw = append(b.raw, '}')
	n.Content = b.content(from)
	return n, nil
}

// objectSequence is s's node.
func objectSequence[V any](b *objectTree, depth int, s []V) (*yaml.Node, error) {
	if err := b.open(depth, '['); err != nil {
		return nil, err
	}
	n := b.node(yaml.SequenceNode, "!!seq", "", yaml.FlowStyle, 0, 0)
	from := len(b.kids)
	for i, v := range s {
		if i > 0 {
			b.raw = append(b.raw, ',')
		}
		val, err := b.value(v, depth+1)
		if err != nil {
			return nil, err
		}
		b.kids = append(b.kids, val)
	}
	b.raw = append(b.raw, ']')
	n.Content = b.content(from)
	return n, nil
}
