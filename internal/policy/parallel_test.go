package policy

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

func TestParseEachKeepsOrderAndFirstError(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	const n = 5 * parallelFrom
	got, err := parseEach(n, func(i int) (int, error) { return i * 2, nil })
	if err != nil || len(got) != n {
		t.Fatalf("parseEach: %d items, error %v", len(got), err)
	}
	for i, v := range got {
		if v != i*2 {
			t.Fatalf("item %d is %d, want %d", i, v, i*2)
		}
	}
	// Failures in several chunks: the lowest index wins, as in a loop.
	_, err = parseEach(n, func(i int) (int, error) {
		if i == n-3 || i == n/2+1 || i == n/2+7 {
			return 0, fmt.Errorf("item %d", i)
		}
		return i, nil
	})
	if err == nil || err.Error() != fmt.Sprintf("item %d", n/2+1) {
		t.Fatalf("error %v, want item %d's", err, n/2+1)
	}
}

// largeRules is n rules made by rule(i, bad), bad for the two rules given.
func largeRules(n, bad1, bad2 int, rule func(i int, bad bool) string) string {
	rules := make([]string, n)
	for i := range n {
		rules[i] = rule(i, i == bad1 || i == bad2)
	}
	return strings.Join(rules, ",")
}

// checkLargePolicy parses doc, which must fail at wantField, and doc with bad replaced by
// good, which must parse to n rules, spec.ingress[i] each, in order.
func checkLargePolicy(t *testing.T, doc, bad, good, wantField string, n int) {
	t.Helper()
	_, err := Parse("big.json", []byte(doc))
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v, want a *ParseError", err)
	}
	if pe.Source != "big.json" || pe.Field != wantField || pe.Reason == "" {
		t.Fatalf("error %+v, want source big.json, field %s and a reason", pe, wantField)
	}
	docs, err := Parse("big.json", []byte(strings.ReplaceAll(doc, bad, good)))
	if err != nil || len(docs.Policies) != 1 || len(docs.Policies[0].Rules) != n {
		t.Fatalf("valid policy: error %v", err)
	}
	for i, r := range docs.Policies[0].Rules {
		if want := fmt.Sprintf("spec.ingress[%d]", i); r.Description != want || r.Index != i {
			t.Fatalf("rule %d: description %q, index %d", i, r.Description, r.Index)
		}
	}
}

// TestLargePolicyErrorNamesFirstBadRule: a policy long enough to be parsed on several
// cores reports the first bad rule by file, field and reason, as a short one does.
func TestLargePolicyErrorNamesFirstBadRule(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	const n = 3 * parallelFrom
	rules := largeRules(n, n/2, n-10, func(i int, bad bool) string {
		port := fmt.Sprint(1000 + i)
		if bad {
			port = "70000" // out of range
		}
		return `{"from":[{"podSelector":{"matchLabels":{"app":"c"}}}],"ports":[{"port":` + port + `}]}`
	})
	doc := `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"big","namespace":"ns"},` +
		`"spec":{"podSelector":{},"ingress":[` + rules + `]}}`
	checkLargePolicy(t, doc, `"port":70000`, `"port":7000`, fmt.Sprintf("spec.ingress[%d].ports[0].port", n/2), n)
}

// TestLargeCiliumPolicyErrorNamesFirstBadRule: the same for a CiliumNetworkPolicy's
// ingress list.
func TestLargeCiliumPolicyErrorNamesFirstBadRule(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	const n = 3 * parallelFrom
	rules := largeRules(n, n/3, n-1, func(i int, bad bool) string {
		proto := "TCP"
		if bad {
			proto = "BOGUS"
		}
		return `{"fromEndpoints":[{"matchLabels":{"app":"c"}}],"toPorts":[{"ports":[{"port":"` + fmt.Sprint(1000+i) + `","protocol":"` + proto + `"}]}]}`
	})
	doc := `{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy","metadata":{"name":"big","namespace":"ns"},` +
		`"spec":{"endpointSelector":{},"ingress":[` + rules + `]}}`
	checkLargePolicy(t, doc, `"BOGUS"`, `"UDP"`, fmt.Sprintf("spec.ingress[%d].toPorts[0].ports[0].protocol", n/3), n)
}
