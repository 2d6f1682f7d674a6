package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// decodeObject decodes a JSON object as the API machinery's unstructured objects hold
// it: integers as int64, other numbers as float64.
func decodeObject(t testing.TB, data []byte) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	var conv func(any) any
	conv = func(v any) any {
		switch v := v.(type) {
		case json.Number:
			if i, err := v.Int64(); err == nil {
				return i
			}
			f, _ := v.Float64()
			return f
		case map[string]any:
			for k, x := range v {
				v[k] = conv(x)
			}
		case []any:
			for i, x := range v {
				v[i] = conv(x)
			}
		}
		return v
	}
	m, _ := conv(v).(map[string]any)
	return m
}

// objectCases are the manifests of the corpus and of the error cases, each document as
// a decoded object.
func objectCases(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(corpusDir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for i := 0; ; i++ {
			var n yaml.Node
			if err := dec.Decode(&n); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return err
			}
			if len(n.Content) == 0 || n.Content[0].Kind != yaml.MappingNode {
				continue
			}
			d := &docParser{}
			raw, err := d.toJSON(n.Content[0])
			if err != nil {
				continue
			}
			out[p+"#"+string(rune('0'+i))] = raw
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestParseObjectAsJSON holds ParseObject to what Parse makes of the object's JSON
// rendering (the way Kubernetes objects took before): the same policies, CIDR groups and
// taps, the same Raw, the same errors but for line numbers.
func TestParseObjectAsJSON(t *testing.T) {
	cases := objectCases(t)
	extra := []string{
		`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"p","namespace":"x"},"spec":{"podSelector":{},"ingress":[{"fromm":[]}]}}`,
		`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"p","namespace":"x","annotations":{"policy.rampart.io/audit":"true"}},"spec":{"podSelector":{},"ingress":[{"ports":[{"port":80.5}]}]}}`,
		`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"p","namespace":"x","annotations":{"policy.rampart.io/audit":"true"}},"spec":{"podSelector":{},"ingress":[{"ports":[{"port":8080,"protocol":"TCP"}]}]}}`,
		`{"apiVersion":"cilium.io/v2","kind":"CiliumCIDRGroup","metadata":{"name":"g"},"spec":{"externalCIDRs":["10.0.0.0/8"]}}`,
		`{"apiVersion":"cilium.io/v2","kind":"CiliumCIDRGroup","metadata":{"name":"g"},"spec":{"externalCIDRs":null}}`,
		`{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy","metadata":{"name":"p","namespace":"x"},"spec":{"endpointSelector":{},"ingress":[{"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}],"rules":{"http":[{"method":"GET","path":"/é<>"}]}}]}]}}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`,
	}
	for i, s := range extra {
		cases["extra#"+string(rune('0'+i))] = []byte(s)
	}
	t.Logf("%d objects", len(cases))
	for name, raw := range cases {
		obj := decodeObject(t, raw)
		data, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		want, werr := Parse("obj", data)
		got, gerr := ParseObject("obj", obj)
		if werr != nil || gerr != nil {
			var wpe, gpe *ParseError
			if !errors.As(werr, &wpe) || !errors.As(gerr, &gpe) {
				t.Errorf("%s: Parse: %v\nParseObject: %v", name, werr, gerr)
				continue
			}
			wpe.Line = 0
			if *wpe != *gpe {
				t.Errorf("%s: Parse: %v\nParseObject: %v", name, wpe, gpe)
			}
			continue
		}
		if !reflect.DeepEqual(want, got) {
			t.Errorf("%s: Parse and ParseObject differ:\n%+v\n%+v", name, want, got)
		}
	}
}

// TestParseObjectLimits checks that a decoded object is held to the nesting and size
// limits, and that a value no JSON holds is refused.
func TestParseObjectLimits(t *testing.T) {
	deep := map[string]any{"kind": "NetworkPolicy"}
	at := deep
	for range MaxDepth {
		next := map[string]any{}
		at["x"] = next
		at = next
	}
	var le *LimitError
	if _, err := ParseObject("deep", deep); !errors.As(err, &le) || le.Limit != LimitDepth {
		t.Errorf("deep object: %v", err)
	}
	big := map[string]any{"kind": "NetworkPolicy", "x": strings.Repeat("a", MaxDocumentBytes)}
	if _, err := ParseObject("big", big); !errors.As(err, &le) || le.Limit != LimitDocumentSize {
		t.Errorf("big object: %v", err)
	}
	if _, err := ParseObject("odd", map[string]any{"kind": struct{}{}}); err == nil {
		t.Error("a struct value was taken")
	}
}
