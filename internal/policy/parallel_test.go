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

// TestLargePolicyErrorNamesFirstBadRule: a policy long enough to be parsed on several
// cores reports the first bad rule by file, field and reason, as a short one does.
func TestLargePolicyErrorNamesFirstBadRule(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	const n = 3 * parallelFrom
	var rules []string
	for i := range n {
		port := fmt.Sprint(1000 + i)
		if i == n-10 || i == n/2 {
			port = "70000" // out of range
		}
		rules = append(rules, `{"from":[{"podSelector":{"matchLabels":{"app":"c"}}}],"ports":[{"port":`+port+`}]}`)
	}
	doc := `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"big","namespace":"ns"},` +
		`"spec":{"podSelector":{},"ingress":[` + strings.Join(rules, ",") + `]}}`
	_, err := Parse("big.json", []byte(doc))
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v, want a *ParseError", err)
	}
	if want := fmt.Sprintf("spec.ingress[%d].ports[0].port", n/2); pe.Source != "big.json" || pe.Field != want || pe.Reason == "" {
		t.Fatalf("error %+v, want source big.json, field %s and a reason", pe, want)
	}
	// Valid, it parses to one rule per entry in order.
	ok := strings.ReplaceAll(doc, `"port":70000`, `"port":7000`)
	docs, err := Parse("big.json", []byte(ok))
	if err != nil || len(docs.Policies) != 1 || len(docs.Policies[0].Rules) != n {
		t.Fatalf("valid policy: error %v", err)
	}
	for i, r := range docs.Policies[0].Rules {
		if want := fmt.Sprintf("spec.ingress[%d]", i); r.Description != want || r.Index != i {
			t.Fatalf("rule %d: description %q, index %d", i, r.Description, r.Index)
		}
	}
}

// TestLargeCiliumPolicyErrorNamesFirstBadRule: the same for a CiliumNetworkPolicy's
// ingress list.
func TestLargeCiliumPolicyErrorNamesFirstBadRule(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	const n = 3 * parallelFrom
	var rules []string
	for i := range n {
		proto := "TCP"
		if i == n-1 || i == n/3 {
			proto = "BOGUS"
		}
		rules = append(rules, `{"fromEndpoints":[{"matchLabels":{"app":"c"}}],"toPorts":[{"ports":[{"port":"`+fmt.Sprint(1000+i)+`","protocol":"`+proto+`"}]}]}`)
	}
	doc := `{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy","metadata":{"name":"big","namespace":"ns"},` +
		`"spec":{"endpointSelector":{},"ingress":[` + strings.Join(rules, ",") + `]}}`
	_, err := Parse("big.json", []byte(doc))
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v, want a *ParseError", err)
	}
	if want := fmt.Sprintf("spec.ingress[%d].toPorts[0].ports[0].protocol", n/3); pe.Source != "big.json" || pe.Field != want || pe.Reason == "" {
		t.Fatalf("error %+v, want source big.json, field %s and a reason", pe, want)
	}
	docs, err := Parse("big.json", []byte(strings.ReplaceAll(doc, `"BOGUS"`, `"UDP"`)))
	if err != nil || len(docs.Policies) != 1 || len(docs.Policies[0].Rules) != n {
		t.Fatalf("valid policy: error %v", err)
	}
	for i, r := range docs.Policies[0].Rules {
		if want := fmt.Sprintf("spec.ingress[%d]", i); r.Description != want || r.Index != i {
			t.Fatalf("rule %d: description %q, index %d", i, r.Description, r.Index)
		}
	}
}
