package policy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMultiDocument(t *testing.T) {
	src := `# leading comment
---
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a, namespace: x}
spec: {podSelector: {}}
---
# an empty document
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b}
spec: {endpointSelector: {}, ingress: [{}]}
...
`
	ps := parse(t, "multi.yaml", src)
	if len(ps) != 2 {
		t.Fatalf("got %d policies, want 2", len(ps))
	}
	if ps[0].Key() != "NetworkPolicy/x/a" || ps[1].Key() != "CiliumNetworkPolicy/default/b" {
		t.Errorf("keys = %s, %s", ps[0].Key(), ps[1].Key())
	}
	// Documents are numbered as written, empty ones included.
	if ps[0].Source != "multi.yaml: document 2" || ps[1].Source != "multi.yaml: document 4" {
		t.Errorf("sources = %q, %q", ps[0].Source, ps[1].Source)
	}
	if ps, err := ParseDocuments("empty.yaml", []byte("# nothing\n---\n")); err != nil || len(ps) != 0 {
		t.Errorf("empty stream: %v, %v", ps, err)
	}
}

func TestDocumentErrors(t *testing.T) {
	good := "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: a}\nspec: {podSelector: {}}\n---\n"
	cases := []struct {
		name, src    string
		doc          int
		kind         Kind
		field        string
		line         int
		reason       string
		errorMessage string
	}{
		{name: "malformed YAML in document 2", src: good + "apiVersion: v1\nkind: [\n", doc: 2, line: 7, reason: "invalid YAML",
			errorMessage: "f.yaml: document 2 (line 7): invalid YAML: did not find expected node content"},
		{name: "tab indentation", src: "kind: NetworkPolicy\n\tspec: {}\n", doc: 1, line: 2, reason: "invalid YAML"},
		{name: "unknown kind", src: "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n", doc: 1, kind: "Pod", field: "kind", line: 2, reason: `unknown kind "Pod"`},
		{name: "missing kind", src: "apiVersion: v1\nmetadata: {name: a}\n", doc: 1, field: "kind", line: 1, reason: ReasonRequired},
		{name: "kind not a string", src: "apiVersion: v1\nkind: 3\n", doc: 1, kind: "3", field: "kind", line: 2, reason: "must be a string"},
		{name: "old apiVersion", src: "apiVersion: extensions/v1beta1\nkind: NetworkPolicy\nmetadata: {name: a}\nspec: {podSelector: {}}\n",
			doc: 1, kind: KindNetworkPolicy, field: "apiVersion", line: 1, reason: `apiVersion "extensions/v1beta1" does not serve kind NetworkPolicy`},
		{name: "missing apiVersion", src: "kind: CiliumNetworkPolicy\nmetadata: {name: a}\n", doc: 1, kind: KindCiliumNetworkPolicy, field: "apiVersion", line: 1, reason: ReasonRequired},
		{name: "missing metadata", src: "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\n", doc: 1, kind: KindCiliumNetworkPolicy, field: "metadata", line: 1, reason: ReasonRequired},
		{name: "missing name", src: "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {namespace: x}\n", doc: 1, kind: KindCiliumNetworkPolicy, field: "metadata.name", line: 3, reason: ReasonRequired},
		{name: "invalid name", src: "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: Bad_Name}\n", doc: 1, kind: KindCiliumNetworkPolicy, field: "metadata.name", line: 3, reason: "invalid name"},
		{name: "invalid namespace", src: "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: a, namespace: a.b}\n", doc: 1, kind: KindCiliumNetworkPolicy, field: "metadata.namespace", line: 3, reason: "invalid namespace"},
		{name: "unknown metadata field", src: "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: a\n  finalizers: [x]\n", doc: 1, kind: KindCiliumNetworkPolicy, field: "metadata.finalizers", line: 5, reason: ReasonUnknownField},
		{name: "annotation not a string", src: "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata:\n  name: a\n  annotations: {a: 1}\n", doc: 1, kind: KindCiliumNetworkPolicy, field: "metadata.annotations.a", line: 5, reason: "must be a string"},
		{name: "scalar document", src: "just a string\n", doc: 1, line: 1, reason: "a document must be a policy manifest"},
		{name: "alias", src: "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: a}\nspec:\n  endpointSelector: &s {}\n  ingress: [{fromEndpoints: [*s]}]\n",
			doc: 1, kind: KindCiliumNetworkPolicy, field: "spec.ingress[0].fromEndpoints[0]", line: 6, reason: "YAML aliases are not supported"},
		{name: "custom tag", src: "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: a, uid: !custom x}\nspec: {endpointSelector: {}}\n",
			doc: 1, kind: KindCiliumNetworkPolicy, field: "metadata.uid", line: 3, reason: "YAML tag !custom is not supported"},
		{name: "top-level duplicate", src: "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nkind: CiliumNetworkPolicy\n", doc: 1, kind: KindCiliumNetworkPolicy, field: "kind", line: 3, reason: "duplicate field"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pe := parseErr(t, "f.yaml", c.src)
			if pe.Document != c.doc || pe.Kind != c.kind || pe.Source != "f.yaml" {
				t.Errorf("error context = %+v (%v)", pe, pe)
			}
			wantErr(t, pe, c.field, c.line, c.reason)
			if c.errorMessage != "" && pe.Error() != c.errorMessage {
				t.Errorf("Error() = %q, want %q", pe.Error(), c.errorMessage)
			}
		})
	}
}

func TestInformationalFieldsAccepted(t *testing.T) {
	p := parseOne(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
description: top
metadata:
  name: a
  namespace: x
  description: meta
  labels: {app: x}
  annotations: {note: "anything at all: even spaces"}
  uid: 0b6c5c1e-1f7e-4c69-9d1c-6d5e8f0a1b2c
  resourceVersion: "12345"
  creationTimestamp: 2024-01-02T03:04:05Z
  generation: 3
spec:
  description: in spec
  labels: [{key: k, value: v, source: k8s}]
  endpointSelector: {}
  ingress: [{}]
`)
	if len(p.Rules) != 1 {
		t.Fatalf("rules: %s", rules(p))
	}
	var raw map[string]any
	if err := json.Unmarshal(p.Raw, &raw); err != nil {
		t.Fatalf("Raw is not JSON: %v\n%s", err, p.Raw)
	}
	meta := raw["metadata"].(map[string]any)
	if meta["creationTimestamp"] != "2024-01-02T03:04:05Z" || meta["generation"] != float64(3) || meta["resourceVersion"] != "12345" {
		t.Errorf("Raw metadata = %v", meta)
	}
}

func TestRawIsTheDocumentAsJSON(t *testing.T) {
	src := `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: a
spec:
  podSelector:
    matchLabels: {access: "true", n: "1"}
  ingress:
  - ports:
    - port: 0x50
      endPort: 81
    from:
    - ipBlock: {cidr: 10.0.0.0/8}
`
	p := parseOne(t, src)
	want := `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"a"},"spec":{"podSelector":{"matchLabels":{"access":"true","n":"1"}},"ingress":[{"ports":[{"port":80,"endPort":81}],"from":[{"ipBlock":{"cidr":"10.0.0.0/8"}}]}]}}`
	if string(p.Raw) != want {
		t.Errorf("Raw =\n%s\nwant\n%s", p.Raw, want)
	}
	// Raw parses back to the same rules.
	back := parse(t, "raw.json", string(p.Raw))
	if got := rules(back...); got != rules(p) {
		t.Errorf("Raw parsed back to\n%s\nwant\n%s", got, rules(p))
	}
}

func TestJSONManifest(t *testing.T) {
	src := `{
  "apiVersion": "cilium.io/v2",
  "kind": "CiliumNetworkPolicy",
  "metadata": {"name": "j", "namespace": "x"},
  "spec": {
    "endpointSelector": {"matchLabels": {"app": "a\/b"}},
    "ingress": [{"toPorts": [{"ports": [{"port": 80, "protocol": "TCP"}]}]}]
  }
}`
	// "\/" is valid JSON that YAML parsers refuse: JSON must not go through YAML.
	pe := parseErr(t, "j.json", src)
	wantErr(t, pe, "spec.endpointSelector.matchLabels.app", 6, "invalid label value")
	src = strings.Replace(src, `a\/b`, `a`, 1)
	for _, name := range []string{"j.json", "-"} { // stdin JSON is recognised by content
		p := parse(t, name, src)[0]
		wantRules(t, rules(p), block(
			"  rule 0 spec.ingress[0]: ingress allow default-deny",
			"    subject: app=a,io.kubernetes.pod.namespace=x",
			"    peers: all",
			"    ports: TCP/80",
		))
	}
	bad := []struct {
		name, src string
		line      int
		reason    string
	}{
		{"syntax", "{\n  \"kind\": \"CiliumNetworkPolicy\",\n  \"metadata\": {\"name\": \"a\",}\n}", 3, "invalid JSON"},
		{"truncated", "{\n  \"kind\": \"CiliumNetworkPolicy\",\n", 2, "invalid JSON"},
		{"two values", "{}\n{}\n", 2, "unexpected data after the top-level value"},
		{"YAML in a .json file", "kind: CiliumNetworkPolicy\n", 1, "invalid JSON"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			pe := parseErr(t, "bad.json", c.src)
			wantErr(t, pe, "", c.line, c.reason)
		})
	}
	pe = parseErr(t, "dup.json", `{"kind": "CiliumNetworkPolicy",
"kind": "CiliumNetworkPolicy"}`)
	wantErr(t, pe, "kind", 2, "duplicate field")
}

func TestRuleArray(t *testing.T) {
	src := `[{
  "labels": [{"key": "name", "value": "from-label", "source": "unspec"}],
  "endpointSelector": {"matchLabels": {"app": "a"}},
  "ingress": [{"fromEndpoints": [{"matchLabels": {"app": "b"}}]}]
}, {
  "endpointSelector": {"matchLabels": {"app": "c"}},
  "egress": [{"toCIDR": ["198.18.0.0/15"]}]
}]`
	p := parse(t, "dir/rules.json", src)[0]
	if p.Kind != KindCiliumNetworkPolicy || p.Namespace != "default" || p.Name != "from-label" {
		t.Errorf("policy = %s %s/%s", p.Kind, p.Namespace, p.Name)
	}
	wantRules(t, rules(p), block(
		"  rule 0 [0].ingress[0]: ingress allow default-deny",
		"    subject: app=a,io.kubernetes.pod.namespace=default",
		"    peers:",
		"      endpoints app=b,io.kubernetes.pod.namespace=default",
		"    ports: all",
		"  rule 1 [1].egress[0]: egress allow default-deny",
		"    subject: app=c,io.kubernetes.pod.namespace=default",
		"    peers:",
		"      cidr 198.18.0.0/15",
		"    ports: all",
	))
	// Raw is an equivalent CiliumNetworkPolicy, so it keeps its name under any source.
	back := parse(t, "-", string(p.Raw))[0]
	if back.Key() != p.Key() || len(back.Rules) != len(p.Rules) {
		t.Errorf("Raw parsed back to %s with %d rules:\n%s", back.Key(), len(back.Rules), back.Raw)
	}
	for i := range back.Rules {
		if FormatPeer(back.Rules[i].Peers[0]) != FormatPeer(p.Rules[i].Peers[0]) || back.Rules[i].Subject.String() != p.Rules[i].Subject.String() {
			t.Errorf("rule %d changed through Raw", i)
		}
	}

	// Without a name label the file name names the policy.
	unnamed := `[{"endpointSelector": {}, "ingress": [{}]}]`
	if p := parse(t, "/some/dir/allow-web.json", unnamed)[0]; p.Name != "allow-web" {
		t.Errorf("name from file = %q", p.Name)
	}
	pe := parseErr(t, "Bad_Name.json", unnamed)
	wantErr(t, pe, "", 1, "needs a \"name\" label")
	pe = parseErr(t, "-", unnamed)
	wantErr(t, pe, "", 1, "needs a \"name\" label")

	pe = parseErr(t, "two.json", `[
 {"labels": [{"key": "name", "value": "a"}], "endpointSelector": {}},
 {"labels": [{"key": "k8s:io.cilium.k8s.policy.name", "value": "b"}], "endpointSelector": {}}
]`)
	wantErr(t, pe, "[1].labels[0]", 3, "name different policies")
	pe = parseErr(t, "x.json", `[{"endpointSelector": {}, "ingress": [{"toPorts": [{"ports": [{"port": "80"}], "rules": {"kafka": []}}]}]}]`)
	wantErr(t, pe, "[0].ingress[0].toPorts[0].rules.kafka", 1, ReasonNotSupported)
	if pe.Name != "x" || pe.Kind != KindCiliumNetworkPolicy {
		t.Errorf("error context = %+v", pe)
	}
	pe = parseErr(t, "e.json", `[]`)
	wantErr(t, pe, "", 1, "empty list")
}

func TestParsePath(t *testing.T) {
	dir := t.TempDir()
	np := func(name string) string {
		return "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: " + name + "}\nspec: {podSelector: {}}\n"
	}
	files := map[string]string{
		"b.yaml":        np("b"),
		"a.yml":         np("a") + "---\n" + np("a2"),
		"sub/c.json":    `{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "c"}, "spec": {"podSelector": {}}}`,
		"sub/z/d.YAML":  np("d"),
		"README.md":     "not a manifest",
		"sub/notes.txt": "kind: nonsense",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := ParsePath(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range ps {
		names = append(names, p.Name+"@"+strings.TrimPrefix(p.Source, dir+"/"))
	}
	want := "a@a.yml: document 1,a2@a.yml: document 2,b@b.yaml: document 1,c@sub/c.json: document 1,d@sub/z/d.YAML: document 1"
	if strings.Join(names, ",") != want {
		t.Errorf("ParsePath(dir) = %s\nwant %s", strings.Join(names, ","), want)
	}

	// A single file is read whatever its extension.
	if ps, err := ParsePath(filepath.Join(dir, "sub/notes.txt")); err == nil {
		t.Errorf("ParsePath(notes.txt) = %v, want the error from parsing it", ps)
	}
	ps, err = ParsePath(filepath.Join(dir, "b.yaml"))
	if err != nil || len(ps) != 1 || ps[0].Name != "b" {
		t.Errorf("ParsePath(file) = %v, %v", ps, err)
	}

	// One bad file fails the whole directory, naming the file.
	if err := os.WriteFile(filepath.Join(dir, "sub/z/e.yaml"), []byte("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: e}\nspec:\n  ingres: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = ParsePath(dir)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "sub/z/e.yaml")+": document 1 (NetworkPolicy default/e): spec.ingres (line 5): unknown field") {
		t.Errorf("ParsePath(dir with a bad file) = %v", err)
	}

	if _, err := ParsePath(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "reading policy") {
		t.Errorf("ParsePath(missing) = %v", err)
	}
}

func TestParsePathStdin(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdin
	os.Stdin = r
	t.Cleanup(func() { os.Stdin = old; r.Close() })
	go func() {
		w.Write([]byte("apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: s}\nspec:\n  endpointSelector: {}\n  egres: []\n"))
		w.Close()
	}()
	_, err = ParsePath("-")
	want := "-: document 1 (CiliumNetworkPolicy default/s): spec.egres (line 6): unknown field"
	if err == nil || err.Error() != want {
		t.Errorf("ParsePath(-) = %v, want %s", err, want)
	}
}

func TestParsePathSymlinks(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	np := "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: l}\nspec: {podSelector: {}}\n"
	if err := os.WriteFile(filepath.Join(other, "target.txt"), []byte(np), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(other, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A link to a file is read; a link to a directory is not followed.
	if err := os.Symlink(filepath.Join(other, "target.txt"), filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(other, "sub.yaml"), filepath.Join(dir, "dir.yaml")); err != nil {
		t.Fatal(err)
	}
	ps, err := ParsePath(dir)
	if err != nil || len(ps) != 1 || ps[0].Name != "l" {
		t.Fatalf("ParsePath = %v, %v", ps, err)
	}
	if err := os.Symlink(filepath.Join(other, "missing"), filepath.Join(dir, "dangling.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, err := ParsePath(dir); err == nil || !strings.Contains(err.Error(), "dangling.yaml") {
		t.Errorf("ParsePath with a dangling link = %v", err)
	}
}

func TestNullAndEmptyValues(t *testing.T) {
	// Kubernetes: null or empty from/ports mean every peer / every port.
	p := parseOne(t, npHeader+`spec:
  podSelector:
  ingress:
  - from:
    ports:
  - from: []
    ports: []
`)
	for _, r := range p.Rules {
		if !r.AllPeers || len(r.Ports) != 0 {
			t.Errorf("rule %s: AllPeers=%v ports=%v, want every peer and port", r.Description, r.AllPeers, r.Ports)
		}
	}
	// Cilium: a null entry of ingress is an empty rule; a null entry of specs is an error.
	p = parseOne(t, cnpHeader+"spec:\n  endpointSelector: {}\n  ingress:\n  -\n")
	if len(p.Rules) != 1 || p.Rules[0].AllPeers || len(p.Rules[0].Peers) != 0 || !p.Rules[0].EnableDefaultDeny {
		t.Errorf("null ingress entry: %s", rules(p))
	}
	pe := parseErr(t, "c.yaml", cnpHeader+"specs:\n-\n")
	wantErr(t, pe, "specs[0]", 7, "must be a rule")
	pe = parseErr(t, "a.json", `[{"endpointSelector": {}}, 3]`)
	wantErr(t, pe, "[1]", 1, "must be a mapping")
}

func TestRawValues(t *testing.T) {
	p := parseOne(t, `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a, generation: 1.5, uid: null, resourceVersion: true}
spec: {endpointSelector: {}}
`)
	want := `{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy","metadata":{"name":"a","generation":1.5,"uid":null,"resourceVersion":true},"spec":{"endpointSelector":{}}}`
	if string(p.Raw) != want {
		t.Errorf("Raw = %s\nwant  %s", p.Raw, want)
	}
	pe := parseErr(t, "n.yaml", "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: a, generation: .nan}\nspec: {endpointSelector: {}}\n")
	wantErr(t, pe, "metadata.generation", 3, "cannot be represented in JSON")
}
