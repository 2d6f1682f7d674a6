package policy

import (
	"errors"
	"strings"
	"testing"
)

// parse parses src (YAML unless name ends in .json) and fails the test on error.
func parse(t *testing.T, name, src string) []*Policy {
	t.Helper()
	ps, err := ParseDocuments(name, []byte(src))
	if err != nil {
		t.Fatalf("ParseDocuments(%s): %v", name, err)
	}
	return ps
}

// parseOne parses a single-policy document.
func parseOne(t *testing.T, src string) *Policy {
	t.Helper()
	ps := parse(t, "test.yaml", src)
	if len(ps) != 1 {
		t.Fatalf("got %d policies, want 1", len(ps))
	}
	return ps[0]
}

// parseErr parses src expecting a *ParseError.
func parseErr(t *testing.T, name, src string) *ParseError {
	t.Helper()
	ps, err := ParseDocuments(name, []byte(src))
	if err == nil {
		t.Fatalf("ParseDocuments(%s) succeeded with %d policies, want an error", name, len(ps))
	}
	if ps != nil {
		t.Errorf("ParseDocuments returned policies along with an error")
	}
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *ParseError", err, err)
	}
	return pe
}

// wantErr checks the field, line and reason (substring) of a parse error.
func wantErr(t *testing.T, pe *ParseError, field string, line int, reason string) {
	t.Helper()
	if pe.Field != field || pe.Line != line || !strings.Contains(pe.Reason, reason) {
		t.Errorf("got error field=%q line=%d reason=%q\n  (%v)\nwant field=%q line=%d reason containing %q",
			pe.Field, pe.Line, pe.Reason, pe, field, line, reason)
	}
}

// rules renders all rules of the policies, without the policy header lines, for compact
// comparisons.
func rules(ps ...*Policy) string {
	var b strings.Builder
	for _, p := range ps {
		for _, r := range p.Rules {
			b.WriteString(FormatRule(r))
		}
	}
	return b.String()
}

// block joins rule lines written in tests with a leading "|" per line, so expected
// renderings can be indented with the test code.
func block(lines ...string) string {
	return strings.Join(lines, "\n") + "\n"
}

func wantRules(t *testing.T, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("rules differ\n--- got\n%s--- want\n%s", got, want)
	}
}
