package policy

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// FuzzParse feeds the manifest parser YAML and JSON (its seeds, in
// testdata/fuzz/FuzzParse, are the corpus manifests, the limit cases of limits_test.go and
// ClusterNetworkPolicy examples in YAML and JSON)
// and checks what it promises, not only that it returns:
//   - an error is a *ParseError (naming the source and a document) or a *LimitError, and
//     comes with no result;
//   - CheckLimits agrees: nil for an accepted manifest, the same error for one over a limit;
//   - every accepted policy's Raw (the JSON the agent stores and shows) parses back to the
//     same key and rules, rendered by Format: parse, render and parse again agree;
//   - every accepted CIDR group holds valid, masked prefixes, and its Raw parses back to
//     the same group.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, jsonName bool, data []byte) {
		source := "fuzz.yaml"
		if jsonName {
			source = "fuzz.json"
		}
		docs, err := Parse(source, data)
		lerr := CheckLimits(source, data)
		if err != nil {
			if docs != nil {
				t.Fatalf("a result along with the error %v", err)
			}
			if !strings.HasPrefix(err.Error(), source+":") {
				t.Fatalf("error does not start with the source: %v", err)
			}
			var pe *ParseError
			var le *LimitError
			switch {
			case errors.As(err, &pe):
				if pe.Document < 1 || pe.Reason == "" {
					t.Fatalf("parse error without a document or a reason: %#v", pe)
				}
			case errors.As(err, &le):
				if le.Value <= le.Max || lerr == nil || lerr.Error() != err.Error() {
					t.Fatalf("limit error %v; CheckLimits says %v", err, lerr)
				}
			default:
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		if lerr != nil {
			t.Fatalf("accepted, but CheckLimits says %v", lerr)
		}
		for _, p := range docs.Policies {
			if p.Raw == nil || Format(p) == "" {
				t.Fatalf("%s: no Raw or no rendering", p.Source)
			}
			checkRawRoundTrip(t, p)
		}
		for _, g := range docs.CIDRGroups {
			for _, c := range g.CIDRs {
				if !c.IsValid() || c != c.Masked() {
					t.Fatalf("CIDR group %s: prefix %v is not valid and masked", g.Name, c)
				}
			}
			back, err := Parse("raw.json", g.Raw)
			if err != nil || len(back.CIDRGroups) != 1 || back.CIDRGroups[0].Name != g.Name || !slices.Equal(back.CIDRGroups[0].CIDRs, g.CIDRs) {
				t.Fatalf("CIDR group %s: Raw does not parse back to the same group: %v\n%s", g.Name, err, g.Raw)
			}
		}
	})
}
