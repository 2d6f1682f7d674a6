package cli_test

import (
	"strings"
	"testing"
	"time"
)

// TestBadInputLeavesPolicyUnchanged applies a policy, then feeds broken manifests: each
// must fail with a message naming the file, the document and the field, and afterwards the
// stored policies and the real traffic must be exactly as before.
func TestBadInputLeavesPolicyUnchanged(t *testing.T) {
	e := setupXY(t)
	bIP := e.IP("y/b")
	e.MustCLI("apply", "-f", writeFile(t, "allow.yaml", allowXAtoB))
	before := e.MustCLI("get", "policies", "-o", "json")

	// A valid document first in each file: the request must be refused as a whole.
	valid := strings.Replace(allowXAtoB, "allow-x-a", "extra-valid", 1) + "---\n"
	cases := []struct {
		name  string
		doc   string
		wants []string // substrings of the error, besides the file name
	}{
		{"malformed-yaml", "kind: NetworkPolicy\nmetadata: {name: x\n  spec: [\n", []string{"document 2"}},
		{"unknown-kind", "apiVersion: v1\nkind: NetworkPolocy\nmetadata: {name: p, namespace: y}\nspec: {}\n", []string{"document 2", "kind"}},
		{"unknown-field", strings.Replace(allowXAtoB, "policyTypes:", "policyTypez:", 1), []string{"document 2", "spec.policyTypez", "unknown field"}},
		{"invalid-selector", strings.Replace(allowXAtoB, "      pod: b", "      pod: b\n    matchExpressions:\n    - key: tier\n      operator: Near\n      values: [x]", 1), []string{"document 2", "spec.podSelector.matchExpressions[0].operator"}},
		{"invalid-cidr", strings.Replace(allowXAtoB, "    - namespaceSelector:", "    - ipBlock:\n        cidr: 198.18.0.300/24\n    - namespaceSelector:", 1), []string{"document 2", "spec.ingress[0].from[0].ipBlock.cidr"}},
		{"invalid-port", strings.Replace(allowXAtoB, "port: 80", "port: 70000", 1), []string{"document 2", "spec.ingress[0].ports[0].port"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			file := writeFile(t, c.name+".yaml", valid+c.doc)
			out, stderr, code := e.CLI("apply", "-f", file)
			if code == 0 {
				t.Fatalf("apply succeeded: %s", out)
			}
			for _, want := range append([]string{file}, c.wants...) {
				if !strings.Contains(stderr, want) {
					t.Errorf("error lacks %q: %s", want, stderr)
				}
			}
			// Same through stdin: the source is "-".
			_, stderr, code = e.CLIStdin(valid+c.doc, "apply", "-f", "-")
			if code == 0 || !strings.HasPrefix(stderr, "Error: -: document 2") {
				t.Errorf("apply -f - : exit %d, %q", code, stderr)
			}
			if got := e.MustCLI("get", "policies", "-o", "json"); got != before {
				t.Errorf("policies changed after a refused apply:\n%s\nwant\n%s", got, before)
			}
		})
	}
	// The running policy is unchanged: real traffic as before.
	if !e.Probe("x/a", bIP, 80, "tcp", 2*time.Second) {
		t.Error("allowed x/a -> y/b:80 blocked after bad input")
	}
	if e.Probe("x/c", bIP, 80, "tcp", probeTimeout) {
		t.Error("denied x/c -> y/b:80 passes after bad input")
	}
	if e.Probe("x/a", bIP, 81, "tcp", probeTimeout) {
		t.Error("denied x/a -> y/b:81 passes after bad input")
	}
}
