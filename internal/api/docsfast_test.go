package api

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// checkDocumentsFast holds decodeDocumentsFast to encoding/json as decode uses it: when it
// takes a body, it decodes what encoding/json decodes.
func checkDocumentsFast(t *testing.T, body []byte) bool {
	t.Helper()
	var fast ApplyRequest
	if !decodeDocumentsFast(body, &fast) {
		return false
	}
	var want ApplyRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&want); err != nil {
		t.Fatalf("fast decoder took %q, encoding/json says %v", body, err)
	}
	if !reflect.DeepEqual(fast, want) {
		t.Fatalf("fast decoder read %#v from %q, encoding/json %#v", fast, body, want)
	}
	return true
}

func TestDocumentsFastMatchesEncodingJSON(t *testing.T) {
	var data []string
	for _, dir := range []string{"../policy/testdata/manifests/*/*", "../../examples/*/*"} {
		files, err := filepath.Glob(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if fi, err := os.Stat(f); err != nil || fi.IsDir() {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			data = append(data, string(b))
		}
	}
	if len(data) < 20 {
		t.Fatalf("only %d manifests found", len(data))
	}
	data = append(data, "", "a\tb\r\n\"q\" \\ / \b \f", "<&>", "caf\u00e9", "\x00", "\x7f", "\xff")
	taken := 0
	for _, d := range data {
		req := ApplyRequest{Documents: []Document{{Source: "f.yaml", Data: d}, {Source: "-", Data: d}}}
		body, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if checkDocumentsFast(t, body) {
			taken++
		}
	}
	if taken < len(data)*3/4 {
		t.Fatalf("the fast decoder took %d of %d bodies as the client writes them", taken, len(data))
	}

	for _, body := range []string{
		`{"documents":[]}`,
		` { "documents" : [ { "source" : "a" , "data" : "b" } ] } `,
		`{"documents":[{"data":"b"}]}`,
		`{"documents":[{}]}`,
		`{"documents":null}`,
		`{"Documents":[]}`,
		`{"documents":[{"Source":"a"}]}`,
		`{"documents":[{"source":"a","source":"b"}]}`,
		`{"documents":[],"documents":[]}`,
		`{"documents":[{"source":"a","extra":1}]}`,
		`{"documents":[{"source":"a\u0041"}]}`,
		`{"documents":[{"source":"a\x"}]}`,
		`{"documents":[{"source":"a
b"}]}`,
		`{"documents":[{"source":"a"}]} x`,
		`{"documents":[{"source":"a"},]}`,
		`{"documents":[{"source":"a\"}]}`,
		`{"documents":[{"source":"a\\"}]}`,
		`{"documents":[{"source":1}]}`,
		`{"documents":[`,
		``,
	} {
		checkDocumentsFast(t, []byte(body))
	}
	// The client's form of a large manifest is taken.
	big := strings.Repeat(`{"from":[{"podSelector":{"matchLabels":{"app":"x"}}}]},`, 1000)
	body, _ := json.Marshal(ApplyRequest{Documents: []Document{{Source: "big.json", Data: big}}})
	if !checkDocumentsFast(t, body) {
		t.Fatal("the fast decoder did not take a large JSON manifest")
	}
}

func FuzzDocumentsFast(f *testing.F) {
	f.Add([]byte(`{"documents":[{"source":"a","data":"b\n\"c\""}]}`))
	f.Add([]byte(`{"documents":[]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkDocumentsFast(t, body)
	})
}
