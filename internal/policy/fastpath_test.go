package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The parser's fast paths (decodeInt, writeJSONString, isIdent) must give exactly what the
// general code they stand in for gives.

func TestDecodeIntMatchesYAML(t *testing.T) {
	for _, s := range []string{"0", "-0", "7", "80", "-80", "65535", "010", "0x1F", "0o17", "+5", "1_000",
		"999999999999999999", "9223372036854775807", "-9223372036854775808", "9223372036854775808", "00"} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte("v: "+s), &doc); err != nil {
			t.Fatal(err)
		}
		n := doc.Content[0].Content[1]
		if n.Tag != "!!int" {
			continue // not an integer to YAML: never reaches decodeInt
		}
		var want int64
		wantErr := n.Decode(&want)
		got, err := decodeInt(n)
		if (err != nil) != (wantErr != nil) || (err == nil && got != want) {
			t.Errorf("decodeInt(%q) = %d, %v; YAML decodes %d, %v", s, got, err, want, wantErr)
		}
	}
}

func TestWriteJSONStringMatchesMarshal(t *testing.T) {
	var all []byte
	for c := range 256 {
		all = append(all, byte(c))
	}
	cases := []string{"", "app", "bench-client", "a b", `q"uote`, `back\slash`, "<>&", "tab\t", "é", "\u2028", "\x7f", string(all)}
	for c := range 256 {
		cases = append(cases, fmt.Sprintf("x%cy", c))
	}
	for _, s := range cases {
		var b bytes.Buffer
		writeJSONString(&b, s)
		want, _ := json.Marshal(s)
		if !bytes.Equal(b.Bytes(), want) {
			t.Errorf("writeJSONString(%q) = %s, json.Marshal gives %s", s, b.Bytes(), want)
		}
	}
}

func TestIsIdentMatchesRegexp(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	for _, s := range []string{"", "a", "matchLabels", "app.kubernetes.io/name", "a b", "x-y_z9", "é", "[0]", "A"} {
		if got, want := isIdent(s), re.MatchString(s); got != want {
			t.Errorf("isIdent(%q) = %v, want %v", s, got, want)
		}
	}
	for c := range 256 {
		s := string([]byte{'k', byte(c)})
		if got, want := isIdent(s), re.MatchString(s); got != want {
			t.Errorf("isIdent(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestRawIsCompact: the agent compares and stores Raw byte for byte, relying on it being
// compact JSON whatever the input's layout.
func TestRawIsCompact(t *testing.T) {
	inputs := map[string]string{
		"p.yaml": `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a, namespace: ns}
spec:
  podSelector:
    matchLabels: {app: x}
  # a comment <&>
  ingress:
  - ports: [ {protocol: TCP, port: 0x50} ]
`,
		"p.json": `{ "apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
  "metadata": { "name": "b" },
  "spec": { "endpointSelector": {}, "ingress": [ { "fromEntities": [ "world" ] } ] } }`,
		"rules.json": `[ { "endpointSelector": { }, "ingress": [ { "fromEntities": [ "host" ] } ],
  "labels": [ { "key": "name", "value": "c" } ] } ]`,
	}
	for src, data := range inputs {
		ps, err := ParseDocuments(src, []byte(data))
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		for _, p := range ps {
			var b bytes.Buffer
			if err := json.Compact(&b, p.Raw); err != nil {
				t.Fatalf("%s: Raw is not JSON: %v", src, err)
			}
			if !bytes.Equal(b.Bytes(), p.Raw) {
				t.Errorf("%s: Raw is not compact:\n%s", src, p.Raw)
			}
		}
	}
}

// TestDuplicateKeysFound: duplicates are found both by the scan of small mappings and by
// the set of large ones (JSON reaches the check; YAML's decoder refuses them itself).
func TestDuplicateKeysFound(t *testing.T) {
	var labels bytes.Buffer
	for i := range 20 {
		fmt.Fprintf(&labels, `"k%d":"v",`, i)
	}
	for name, doc := range map[string]string{
		"small": `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"a","name":"b"},"spec":{"podSelector":{}}}`,
		"large": `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"a"},"spec":{"podSelector":{"matchLabels":{` +
			labels.String() + `"k7":"v"}}}}`,
	} {
		_, err := ParseDocuments("d.json", []byte(doc))
		if err == nil || !strings.Contains(err.Error(), "duplicate field") {
			t.Errorf("%s: %v, want a duplicate field error", name, err)
		}
	}
	var ok bytes.Buffer
	for i := range 20 {
		fmt.Fprintf(&ok, `,"k%d":"v"`, i)
	}
	doc := `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"a"},"spec":{"podSelector":{"matchLabels":{"x":"y"` + ok.String() + `}}}}`
	if _, err := ParseDocuments("d.json", []byte(doc)); err != nil {
		t.Errorf("20 distinct labels: %v", err)
	}
}
