package policy

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// jsonSeeds are JSON texts that probe the fast reader's corners: escapes, non-ASCII and
// invalid UTF-8, numbers, empty containers, whitespace and line breaks everywhere.
var jsonSeeds = []string{
	`{}`, `[]`, `{"a":1}`, ` [ 1 , -2 , 3.5 , 1e5 , -0 , 1.5E-3 , 12345678901234567890 ] `,
	`{"s":"plain","e":"quo\"te","u":"\u00e9\u2028","b":"back\\slash","n":null,"t":true,"f":false}`,
	"{\n  \"a\": [\n    {\"b\": \"c\"},\n    {}\n  ],\n  \"d\":\n  [ ]\n}\n",
	"{\"k\u00e9y\":\"v\xff\xfe\",\"x\":\"caf\xc3\xa9\"}",
	`{"dup":1,"dup":2}`, `[[[[[]]]]]`, `"top"`, `17`, `null`,
	"\r\n\t{ \"a\" :\r\n\"b\" }\r\n",
	`{"h":"<a&b>"}`, ` { "z" : 0 , "m" : -5 , "i" : 123456789012345678 , "j" : 1234567890123456789 } `,
	`{"neg":[-0,-1,0]}`,
	// Invalid: the fast reader must refuse each as json.Valid does.
	``, ` `, `{`, `}`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{a:1}`, `[01]`, `[-]`, `[1.]`, `[.5]`, `[1e]`, `[1e+]`,
	`[+1]`, `[tru]`, `[nul]`, `"\x"`, `"\u12G4"`, `"\u12"`, "\"a\tb\"", `"abc`, `[1] 2`, `{"a":1}}`,
	`[1 2]`, `{"a":1 "b":2}`, `[NaN]`, `[Infinity]`, "\u00a0[]", `[,1]`, `{,}`,
}

func compareReaders(t *testing.T, data []byte) {
	t.Helper()
	// The fast reader checks the syntax itself: it takes what json.Valid accepts, and
	// nothing else, but for what nests deeper than MaxDepth.
	valid := json.Valid(data)
	if depth, _ := JSONDepth(data, MaxDepth); depth > MaxDepth {
		valid = false
	}
	if _, _, err := readValidJSON(data); (err == nil) != valid || err != nil && !errors.Is(err, errNotValidJSON) {
		t.Fatalf("%q: readValidJSON error %v, json.Valid %v", data, err, json.Valid(data))
	}
	if !valid {
		return
	}
	want, werr := readJSON(data)
	got, raw, gerr := readValidJSON(data)
	if (werr != nil) != (gerr != nil) {
		t.Fatalf("%q: readJSON error %v, readValidJSON error %v", data, werr, gerr)
	}
	if werr == nil && !sameTree(want, got) {
		t.Fatalf("%q: the readers build different trees", data)
	}
	if raw != nil {
		// The compact text stands in for toJSON's rendering: it must be that rendering.
		d := &docParser{source: "x", doc: 1}
		rendered, err := d.toJSON(want)
		if err != nil || string(rendered) != string(raw) {
			t.Fatalf("%q: compact text %q, rendering %q (error %v)", data, raw, rendered, err)
		}
	}
}

// TestValidJSONReaderCompactText: the reader keeps the compact text of the documents whose
// rendering it is, and of no other.
func TestValidJSONReaderCompactText(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // "" for none
	}{
		{" {\n \"a\" : [ 1 , \"b c\" , null , true , false , { } ] }\n", `{"a":[1,"b c",null,true,false,{}]}`},
		{`{"a":"\u0041"}`, ""},
		{`{"a":"<"}`, ""},
		{`{"a":1.5}`, ""},
		{`{"a":-0}`, ""},
		{`{"a":1234567890123456789}`, ""},
		{"{\"a\":\"\u00e9\"}", ""},
	} {
		_, raw, err := readValidJSON([]byte(c.in))
		if err != nil || string(raw) != c.want || (raw == nil) != (c.want == "") {
			t.Errorf("%q: compact text %q (error %v), want %q", c.in, raw, err, c.want)
		}
		compareReaders(t, []byte(c.in))
	}
}

// sameTree compares what the parser reads of a node.
func sameTree(a, b *yaml.Node) bool { return treeDiff("", a, b) == "" }

// TestValidJSONReaderMatchesDecoder holds the fast reader to the token decoder's trees on
// the seeds and on every corpus manifest written as JSON, compact and indented.
func TestValidJSONReaderMatchesDecoder(t *testing.T) {
	for _, s := range jsonSeeds {
		compareReaders(t, []byte(s))
	}
	var files []string
	err := filepath.WalkDir("testdata/manifests", func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(path, ".json") || strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			files = append(files, path)
		}
		return err
	})
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus manifests: %v", err)
	}
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".json") {
			compareReaders(t, data)
			n++
			continue
		}
		dec := yaml.NewDecoder(strings.NewReader(string(data)))
		for {
			var v any
			if dec.Decode(&v) != nil {
				break
			}
			b, err := json.Marshal(v)
			if err != nil {
				continue // not representable in JSON (say a map with non-string keys)
			}
			compareReaders(t, b)
			ind, _ := json.MarshalIndent(v, "", "  ")
			compareReaders(t, ind)
			n++
		}
	}
	if n < 10 {
		t.Fatalf("only %d corpus documents compared", n)
	}
}

// FuzzValidJSONReader: on any valid JSON the fast reader builds the decoder's tree.
func FuzzValidJSONReader(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		compareReaders(t, data)
	})
}
