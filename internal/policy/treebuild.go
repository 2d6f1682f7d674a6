package policy

import "gopkg.in/yaml.v3"

// treeBuilder hands out the nodes and Content slices of the trees the fast readers
// (jsonScanner, fastYAML, objectTree) build. A large policy's tree has hundreds of thousands of nodes:
// taken one by one from slabs, in reading order, they cost a few allocations instead of
// one or more each, and the nodes that the checker reads together share cache lines.
type treeBuilder struct {
	nodes []yaml.Node
	// kids holds the children of the collections being read; a collection's move to a
	// Content slice of their exact length, cut from ptrs, when it closes.
	kids []*yaml.Node
	ptrs []*yaml.Node
}

func (b *treeBuilder) node(kind yaml.Kind, tag, value string, style yaml.Style, line, col int) *yaml.Node {
	if len(b.nodes) == 0 {
		b.nodes = make([]yaml.Node, 256)
	}
	n := &b.nodes[0]
	b.nodes = b.nodes[1:]
	n.Kind, n.Tag, n.Value, n.Style, n.Line, n.Column = kind, tag, value, style, line, col
	return n
}

// content moves the children from kids[from:] into a Content slice (nil for none, as
// yaml.v3 and readJSON leave an empty collection's).
func (b *treeBuilder) content(from int) []*yaml.Node {
	n := len(b.kids) - from
	if n == 0 {
		return nil
	}
	if len(b.ptrs) < n {
		b.ptrs = make([]*yaml.Node, max(n, 1024))
	}
	c := b.ptrs[:n:n]
	b.ptrs = b.ptrs[n:]
	copy(c, b.kids[from:])
	b.kids = b.kids[:from]
	return c
}
