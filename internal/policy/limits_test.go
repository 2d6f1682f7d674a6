package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/testenv/alloc"
)

// wantLimit checks that err is a *LimitError of limit with the given document and value,
// and that its message names the source, the limit, the value and the maximum.
func wantLimit(t *testing.T, err error, source, limit string, doc int, value, max int64) {
	t.Helper()
	var le *LimitError
	if !errors.As(err, &le) || !errors.Is(err, ErrLimit) {
		t.Fatalf("got %v (%T), want a *LimitError (%s)", err, err, limit)
	}
	if le.Source != source || le.Limit != limit || le.Document != doc || le.Value != value || le.Max != max {
		t.Fatalf("got %+v, want source %s, limit %s, document %d, value %d, max %d", *le, source, limit, doc, value, max)
	}
	msg := err.Error()
	for _, s := range []string{labels.Shorten(source), limit, fmt.Sprint(value), fmt.Sprintf("exceeds the limit of %d", max)} {
		if !strings.Contains(msg, s) {
			t.Errorf("message %q does not name %q", msg, s)
		}
	}
}

const smallPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: p%d
spec:
  endpointSelector: {}
`

// TestLimitDepthJSON is the crasher of issue 15: a few million '[' overflowed the agent's
// stack in the recursive JSON reader. It is refused by the scan before any decoding, in
// little time and memory, whether the source says JSON or the content does.
func TestLimitDepthJSON(t *testing.T) {
	open3M := strings.Repeat("[", 3_000_000)
	balanced1M := strings.Repeat("[", 1_000_000) + strings.Repeat("]", 1_000_000)
	for _, tc := range []struct {
		name, source, data string
		doc                int
		limit              string
		value              int64
		max                int64
	}{
		{"3M open, .json", "deep.json", open3M, 1, LimitDocumentSize, 3_000_000, MaxDocumentBytes},
		{"2M open, .json", "deep.json", open3M[:2_000_000], 1, LimitDepth, MaxDepth + 1, MaxDepth},
		{"1M balanced, .json", "deep.json", balanced1M, 1, LimitDepth, MaxDepth + 1, MaxDepth},
		// Not valid JSON, so read as YAML, whose documents are bounded first.
		{"3M open, stdin", "-", open3M, 1, LimitDocumentSize, 3_000_000, MaxDocumentBytes},
		// Deeper than the YAML decoder goes (it stops at 10,000).
		{"1M open, stdin", "-", open3M[:1_000_000], 1, LimitDepth, yamlMaxDepth + 1, MaxDepth},
		{"1M balanced, stdin", "-", balanced1M, 1, LimitDepth, yamlMaxDepth + 1, MaxDepth},
		{"65 levels, .json", "deep.json", strings.Repeat(`{"a":`, MaxDepth) + "[]" + strings.Repeat("}", MaxDepth), 1, LimitDepth, MaxDepth + 1, MaxDepth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			data := []byte(tc.data)
			n := alloc.Bytes(func() { _, err = Parse(tc.source, data) })
			wantLimit(t, err, tc.source, tc.limit, tc.doc, tc.value, tc.max)
			if n > alloc.Bound(64<<20) {
				t.Errorf("refusing it allocated %d MiB, want < 64", n>>20)
			}
			if cerr := CheckLimits(tc.source, data); cerr == nil || cerr.Error() != err.Error() {
				t.Errorf("CheckLimits: %v, want the same error as Parse", cerr)
			}
		})
	}
}

// TestLimitDepthYAML: block and flow nesting one past MaxDepth are refused at the line of
// the deepest node; MaxDepth itself passes the limit (and fails on its content).
func TestLimitDepthYAML(t *testing.T) {
	nested := func(levels int, flow bool) string {
		if flow {
			return "x: " + strings.Repeat("[", levels-1) + strings.Repeat("]", levels-1) + "\n"
		}
		var b strings.Builder
		for i := range levels {
			fmt.Fprintf(&b, "%sk%d:\n", strings.Repeat("  ", i), i)
		}
		return b.String()
	}
	for _, flow := range []bool{false, true} {
		_, err := Parse("ok.yaml", []byte(nested(MaxDepth, flow)))
		if err == nil || errors.Is(err, ErrLimit) {
			t.Errorf("flow %v: depth %d: got %v, want a schema error", flow, MaxDepth, err)
		}
		_, err = Parse("deep.yaml", []byte(nested(MaxDepth+1, flow)))
		wantLimit(t, err, "deep.yaml", LimitDepth, 1, MaxDepth+1, MaxDepth)
	}
	// Compact nested lists ("- - - x") nest one level per two bytes.
	_, err := Parse("dash.yaml", []byte(strings.Repeat("- ", 1_000_000)+"x\n"))
	wantLimit(t, err, "dash.yaml", LimitDepth, 1, yamlMaxDepth+1, MaxDepth)
}

// TestLimitSizes: the whole source and each document are bounded; a document's number and
// first line are named.
func TestLimitSizes(t *testing.T) {
	big := strings.Repeat("# padding\n", MaxManifestBytes/10+1)
	_, err := Parse("big.yaml", []byte(big))
	wantLimit(t, err, "big.yaml", LimitSize, 0, int64(len(big)), MaxManifestBytes)

	long := strings.Repeat("s", MaxSourceBytes+1)
	_, err = Parse(long, []byte(fmt.Sprintf(smallPolicy, 1)))
	wantLimit(t, err, long, LimitSourceName, 0, MaxSourceBytes+1, MaxSourceBytes)
	if len(err.Error()) > 200 {
		t.Errorf("the message repeats the source name: %d bytes", len(err.Error()))
	}

	// Document 2 (after a first one) is over the limit: a long description.
	doc1 := fmt.Sprintf(smallPolicy, 1)
	doc2 := fmt.Sprintf(smallPolicy, 2) + "  description: " + strings.Repeat("x", MaxDocumentBytes) + "\n"
	stream := doc1 + "---\n" + doc2
	_, err = Parse("docs.yaml", []byte(stream))
	wantLimit(t, err, "docs.yaml", LimitDocumentSize, 2, int64(len(doc2)+4), MaxDocumentBytes)
	var le *LimitError
	errors.As(err, &le)
	if le.Line != strings.Count(doc1, "\n")+1 {
		t.Errorf("document 2 named at line %d, want %d", le.Line, strings.Count(doc1, "\n")+1)
	}

	// Two documents of 1.5 MiB each are each under the limit.
	half := "  description: " + strings.Repeat("x", MaxDocumentBytes*3/4) + "\n"
	docs, err := Parse("two.yaml", []byte(fmt.Sprintf(smallPolicy, 1)+half+"---\n"+fmt.Sprintf(smallPolicy, 2)+half))
	if err != nil || len(docs.Policies) != 2 {
		t.Fatalf("two documents under the limit: %v", err)
	}

	// A JSON manifest is one document.
	js := `{"x": "` + strings.Repeat("y", MaxDocumentBytes) + `"}`
	_, err = Parse("big.json", []byte(js))
	wantLimit(t, err, "big.json", LimitDocumentSize, 1, int64(len(js)), MaxDocumentBytes)
}

// TestLimitDocuments: a stream of many tiny or empty documents is refused at document
// MaxDocuments+1, having allocated little; MaxDocuments policies are accepted.
func TestLimitDocuments(t *testing.T) {
	var b strings.Builder
	for i := range MaxDocuments {
		if i > 0 {
			b.WriteString("---\n")
		}
		fmt.Fprintf(&b, smallPolicy, i)
	}
	docs, err := Parse("many.yaml", []byte(b.String()))
	if err != nil || len(docs.Policies) != MaxDocuments {
		t.Fatalf("%d policies: %v", MaxDocuments, err)
	}
	b.WriteString("---\na: 1\n")
	_, err = Parse("many.yaml", []byte(b.String()))
	wantLimit(t, err, "many.yaml", LimitDocuments, MaxDocuments+1, MaxDocuments+1, MaxDocuments)

	empty := []byte(strings.Repeat("---\n", MaxManifestBytes/4))
	n := alloc.Bytes(func() { _, err = Parse("empty.yaml", empty) })
	wantLimit(t, err, "empty.yaml", LimitDocuments, MaxDocuments+1, MaxDocuments+1, MaxDocuments)
	if n > alloc.Bound(64<<20) {
		t.Errorf("refusing 2M empty documents allocated %d MiB, want < 64", n>>20)
	}
}

// TestAliasBomb: "billion laughs" (each alias names a list of ten of the previous one) is
// read without expanding any alias, and refused as aliases are.
func TestAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: lol
  labels:
    a0: &a0 "lol"
`)
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&b, "    a%d: &a%d [", i, i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]\n")
	}
	b.WriteString("spec:\n  endpointSelector:\n    matchLabels: *a9\n")
	var err error
	n := alloc.Bytes(func() { _, err = Parse("lol.yaml", []byte(b.String())) })
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Field != "metadata.labels.a1" {
		t.Fatalf("got %v, want a *ParseError at the first label that is not a string", err)
	}
	if n > alloc.Bound(16<<20) {
		t.Errorf("refusing it allocated %d MiB, want < 16", n>>20)
	}
	if err := CheckLimits("lol.yaml", []byte(b.String())); err != nil {
		t.Errorf("CheckLimits: %v, want nil (aliases are the parser's to refuse)", err)
	}
}

// TestCorpusWithinLimits: every real manifest is well inside the limits (the comments of
// limits.go quote the corpus' largest size and deepest nesting).
func TestCorpusWithinLimits(t *testing.T) {
	maxDepth := 0
	err := filepath.WalkDir(corpusDir, func(p string, de os.DirEntry, err error) error {
		if err != nil || de.IsDir() || de.Name() == "README.md" {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := CheckLimits(p, data); err != nil {
			t.Errorf("%v", err)
		}
		if len(data) > 4<<10 {
			t.Errorf("%s: %d bytes, limits.go says 3.7 KB at most", p, len(data))
		}
		return readDocuments(p, data, func(doc int, n *yaml.Node, _ []byte) error {
			maxDepth = max(maxDepth, depthOf(n))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if maxDepth != 10 {
		t.Errorf("deepest corpus manifest nests %d levels; limits.go says 10", maxDepth)
	}
}

func depthOf(n *yaml.Node) int {
	d := 0
	for _, c := range n.Content {
		d = max(d, depthOf(c))
	}
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		d++
	}
	return d
}

// TestParsePathLimit: a file over the size limit is refused before it is read, with its
// size.
func TestParsePathLimit(t *testing.T) {
	p := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(p, make([]byte, MaxManifestBytes+100), 0o644); err != nil {
		t.Fatal(err)
	}
	var err error
	n := alloc.Bytes(func() { _, err = ParsePath(p) })
	wantLimit(t, err, p, LimitSize, 0, MaxManifestBytes+100, MaxManifestBytes)
	if n > alloc.Bound(1<<20) {
		t.Errorf("refusing it allocated %d KiB", n>>10)
	}
}
