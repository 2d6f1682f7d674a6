package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// v3Documents is what yaml.v3 reads from data, as readDocuments sees it: each document's
// root, nil for an empty one.
func v3Documents(data []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if n.Kind != yaml.DocumentNode || len(n.Content) == 0 || isNull(n.Content[0]) {
			out = append(out, nil)
			continue
		}
		out = append(out, n.Content[0])
	}
}

// fastDocuments is what fastYAML reads from data: the documents before it gave up, and
// whether it read the whole stream.
func fastDocuments(data []byte) (docs []*yaml.Node, whole bool) {
	if !fastYAMLOK(data) {
		return nil, false
	}
	y := newFastYAML(data)
	for {
		n, done, ok := y.next()
		if done {
			return docs, true
		}
		if !ok {
			// The last document read goes to yaml.v3 again (see readDocuments).
			return docs[:max(0, len(docs)-1)], false
		}
		docs = append(docs, n)
	}
}

// isPolicyDocument says whether a document's kind is one Parse reads as policy.
func isPolicyDocument(doc *yaml.Node) bool {
	if doc == nil || doc.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		if doc.Content[i].Value == "kind" {
			switch Kind(doc.Content[i+1].Value) {
			case KindNetworkPolicy, KindCiliumNetworkPolicy, KindCiliumClusterwidePolicy, KindCiliumCIDRGroup:
				return true
			}
		}
	}
	return false
}

// treeDiff says where two trees differ, or "" (comments aside: nothing reads them).
func treeDiff(path string, a, b *yaml.Node) string {
	switch {
	case a == nil && b == nil:
		return ""
	case a == nil || b == nil:
		return fmt.Sprintf("%s: one document is empty (fast %v, yaml.v3 %v)", path, a == nil, b == nil)
	}
	if a.Kind != b.Kind || a.Tag != b.Tag || a.Value != b.Value || a.Style != b.Style || a.Line != b.Line || a.Column != b.Column || len(a.Content) != len(b.Content) {
		return fmt.Sprintf("%s: fast {kind %v tag %q value %q style %v at %d:%d, %d children}, yaml.v3 {kind %v tag %q value %q style %v at %d:%d, %d children}",
			path, a.Kind, a.Tag, a.Value, a.Style, a.Line, a.Column, len(a.Content), b.Kind, b.Tag, b.Value, b.Style, b.Line, b.Column, len(b.Content))
	}
	for i := range a.Content {
		if d := treeDiff(fmt.Sprintf("%s/%d", path, i), a.Content[i], b.Content[i]); d != "" {
			return d
		}
	}
	return ""
}

// checkFastYAML compares the fast reader with yaml.v3 on data: every document the fast
// reader takes is yaml.v3's tree, node for node; if it takes the whole stream, yaml.v3
// reads the same documents and no error. Then Parse, with and without the fast reader,
// gives the same result or the same error. It returns how many documents were read fast.
func checkFastYAML(t *testing.T, name string, data []byte) int {
	t.Helper()
	fast, whole := fastDocuments(data)
	slow, err := v3Documents(data)
	if whole && err != nil {
		t.Fatalf("%s: the fast reader took the whole stream, yaml.v3 says %v\n%s", name, err, data)
	}
	if len(fast) > len(slow) || whole && len(fast) != len(slow) {
		t.Fatalf("%s: fast reader read %d documents (whole stream %v), yaml.v3 %d\n%s", name, len(fast), whole, len(slow), data)
	}
	for i := range fast {
		if d := treeDiff(fmt.Sprintf("document %d", i+1), fast[i], slow[i]); d != "" {
			t.Fatalf("%s: %s\n%s", name, d, data)
		}
	}

	got, gotErr := Parse(name, data)
	fastYAMLEnabled = false
	want, wantErr := Parse(name, data)
	fastYAMLEnabled = true
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || reflect.TypeOf(gotErr) != reflect.TypeOf(wantErr) {
		t.Fatalf("%s: Parse with the fast reader: %v; without: %v\n%s", name, gotErr, wantErr, data)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: Parse with the fast reader and without differ\n%s", name, data)
	}
	return len(fast)
}

// yamlFiles lists the YAML files the equivalence tests read: the manifest corpus, the
// repository's examples and CRDs, and the fuzz seeds (many of them invalid).
func yamlFiles(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, dir := range []string{corpusDir, "../../examples", "../../deploy/crds"} {
		err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
			if err != nil || de.IsDir() {
				return err
			}
			if ext := filepath.Ext(p); ext != ".yaml" && ext != ".yml" {
				return nil
			}
			data, err := os.ReadFile(p)
			out[p] = data
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	seeds, err := filepath.Glob("testdata/fuzz/FuzzParse/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range seeds {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		// The seed's second value: a Go-quoted []byte.
		lines := strings.SplitN(string(data), "\n", 3)
		if len(lines) < 3 || lines[1] != "bool(false)" {
			continue // JSON seeds, read as JSON
		}
		var s string
		if _, err := fmt.Sscanf(strings.TrimSpace(lines[2]), "[]byte(%q)", &s); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		out[p] = []byte(s)
	}
	out["large"] = benchPolicy(3000, false)
	return out
}

func TestFastYAMLMatchesYAMLv3(t *testing.T) {
	files := yamlFiles(t)
	total, fast := 0, 0
	for name, data := range files {
		n := checkFastYAML(t, name, data)
		if strings.Contains(name, "testdata/fuzz/") {
			continue // seeds for the edges, many invalid
		}
		// The measure is over policy documents: the examples also hold the Pods and
		// Services of demo clusters, written in flow style, which only yaml.v3 reads.
		slow, _ := v3Documents(data)
		for i, doc := range slow {
			if !isPolicyDocument(doc) {
				continue
			}
			total++
			if i < n {
				fast++
			}
		}
	}
	t.Logf("%d files; of the policy documents among the manifests and examples, %d of %d read by the fast reader", len(files), fast, total)
	// The subset is the one policies are written in: nearly all of them are in it (the
	// rest are JSON-like flow documents over several lines, and `{}` selectors).
	if total == 0 || fast < total*9/10 {
		t.Fatalf("only %d of %d policy documents read by the fast reader", fast, total)
	}
	if n, whole := fastDocuments(files["large"]); len(n) != 1 || !whole {
		t.Fatalf("the benchmark's policy is not read by the fast reader")
	}
}

// TestFastYAMLMutations checks the fast reader against yaml.v3 on every manifest of the
// corpus changed in small ways (a byte deleted, one of YAML's indicators inserted), which
// reaches the edges of its subset and many invalid documents.
func TestFastYAMLMutations(t *testing.T) {
	inserts := []string{" ", "\n", ":", "-", "- ", "#", " #", "'", "\"", "[", "]", "{", "}", ",", "&a ", "*a", "!", "|", ">", "? ", "\n---\n", "\n...\n", "''", "\\", "~", "0x1", "\t"}
	n := 0
	for name, data := range yamlFiles(t) {
		if len(data) > 4000 {
			data = data[:4000]
		}
		step := max(1, len(data)/40)
		for pos := 0; pos < len(data); pos += step {
			del := append(append([]byte{}, data[:pos]...), data[pos+1:]...)
			checkFastYAML(t, fmt.Sprintf("%s, byte %d deleted", name, pos), del)
			ins := inserts[(pos/step)%len(inserts)]
			mut := append(append(append([]byte{}, data[:pos]...), ins...), data[pos:]...)
			checkFastYAML(t, fmt.Sprintf("%s, %q inserted at %d", name, ins, pos), mut)
			n += 2
		}
	}
	t.Logf("%d variants", n)
}

func TestFastYAMLCases(t *testing.T) {
	cases := []string{
		"",
		"# only a comment\n",
		"---\n",
		"---\n---\n",
		"a: 1\n---\n",
		"a: 1\n---\n---\nb: 2\n",
		"---\na: 1\n",
		"a: 1\n...\n",
		"a:\n  - 1\n  - -2\n  - x\nb: [x, 'y', \"z\"]\nc: {}\nd: []\ne: {k: v, 'q': \"w\"}\n",
		"a:\n- b: 1\n  c: 2\n- - x\n  - y\n-\n  d: 3\n",
		"a: b # comment\nc: 'it''s' # c\n\"d\": e\n",
		"a: yes\nb: on\nc: ~\nd: null\ne: 1.5\nf: .inf\ng: 0x1F\nh: 2001-12-14\ni: true\nj: False\nk: 010\nl: 1_000\n",
		"a: b: c\n",
		"a: b\n  c\n",
		"a:\n  b: 1\n c: 2\n",
		"a:\nb: 1\n",
		"a: &x 1\nb: *x\n",
		"a: |\n  text\n",
		"a: \"x\\ty\"\n",
		"a: 1\na: 2\n",
		"- a\n- b\n",
		"x\n",
		"a: [b, [c]]\n",
		"a: [b,\n  c]\n",
		"a:    spaced   \n",
		"'a b': 1\n\"c:d\": 2\ne:f: 3\n",
		"app.kubernetes.io/name: x\nk8s:io.kubernetes.pod.namespace: y\n",
		"a: -\n",
		"<<: {a: 1}\n",
		"a: b#c\n",
		"a: [b#c]\n",
		"a:  # comment\n  b: 1\n",
		"a:\n\n  # comment\n\n  b: 1\n",
		"%YAML 1.2\n---\na: 1\n",
		"--- a: 1\n",
		"a: 1\n---\nb: 2\n---\n",
	}
	for _, c := range cases {
		checkFastYAML(t, fmt.Sprintf("%q", c), []byte(c))
	}
}

// TestPlainTagMatchesYAMLv3: the tags decided without yaml.v3 are its tags.
func TestPlainTagMatchesYAMLv3(t *testing.T) {
	vals := []string{"0", "00", "01", "017", "09", "1", "9", "10", "1_000", "-1", "+1", "1.5", ".5", ".inf", "-.inf",
		"2001-12-14", "2001", "20011214", "123456789012345678", "1234567890123456789", "99999999999999999999",
		"0x1F", "0o17", "0b101", "1e3", "1:20", "1.2.3", "12a", "yes", "Yes", "no", "No", "on", "off", "y", "n", "o",
		"TCP", "UDP", "true", "True", "TRUE", "tRue", "false", "False", "FALSE", "null", "Null", "NULL", "nUll",
		"~", "~x", "Ingress", "Egress", "app", "k8s:app", "a b", "_x", "/path", "x.y", "Z", "zebra", "<<", "=",
		"198.19.0.1/32", "10.0.0.0/8", "fe80::1", "5201", "65535", "65536"}
	var y fastYAML
	for _, v := range vals {
		want := (&yaml.Node{Kind: yaml.ScalarNode, Value: v}).ShortTag()
		if got := y.plainTag(v); got != want {
			t.Errorf("%q: tag %s, yaml.v3 %s", v, got, want)
		}
	}
	// Every one- and two-byte printable scalar, and each starting byte before digits.
	for a := byte(0x21); a < 0x7f; a++ {
		for _, v := range []string{string(a), string(a) + "1", string(a) + "0", string(a) + "a", string(a) + "12345", string(a) + "rue"} {
			want := (&yaml.Node{Kind: yaml.ScalarNode, Value: v}).ShortTag()
			if got := y.plainTag(v); got != want {
				t.Errorf("%q: tag %s, yaml.v3 %s", v, got, want)
			}
		}
	}
}

func FuzzFastYAML(f *testing.F) {
	for _, c := range []string{"a: 1\n", "a:\n- b: [x, y]\n  c: 'd'\n", "---\na: {k: v}\n---\n- 1\n"} {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		checkFastYAML(t, "fuzz.yaml", data)
	})
}
