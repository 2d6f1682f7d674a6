package npa

import (
	"fmt"
	"regexp"
	"strings"
)

// NoSCTPFiles is the upstream test files (conformance/tests of v0.3.0) that probe SCTP
// without being about it; nosctp holds them without those probes.
var NoSCTPFiles = []string{
	"admin-network-policy-standard-egress-inline-cidr-rules.go",
	"admin-network-policy-standard-gress-rules.go",
	"admin-network-policy-standard-port-range-rules.go",
	"baseline-admin-network-policy-standard-egress-inline-cidr-rules.go",
	"baseline-admin-network-policy-standard-gress-rules.go",
	"baseline-admin-network-policy-standard-port-range-rules.go",
}

// sctpProbe is one PokeServer statement with the protocol "sctp": upstream writes each on
// two lines, the second ending the call.
var sctpProbe = regexp.MustCompile(`(?m)^\s*kubernetes\.PokeServer\([^\n]*"sctp",\n[^\n]*\)\n`)

// NoSCTP returns an upstream test file as nosctp's: a generated-code line, the package
// nosctp, and no SCTP probe. It fails if the file has no SCTP probe or keeps a mention.
func NoSCTP(name, src string) (string, error) {
	out := sctpProbe.ReplaceAllString(src, "")
	if out == src {
		return "", fmt.Errorf("%s: no SCTP probe", name)
	}
	if strings.Contains(out, `"sctp"`) {
		return "", fmt.Errorf("%s: an SCTP probe of another form is left", name)
	}
	if !strings.Contains(out, "\npackage tests\n") {
		return "", fmt.Errorf("%s: no package clause", name)
	}
	out = strings.Replace(out, "\npackage tests\n", "\npackage nosctp\n", 1)
	return "// Code generated from sigs.k8s.io/network-policy-api@v0.3.0/conformance/tests/" + name +
		" without its SCTP probes (test/conformance/npa, NoSCTP). DO NOT EDIT.\n\n" + out, nil
}
