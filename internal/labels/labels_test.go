package labels

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	l, err := Parse(" app=web , k8s:tier=front,any:x=,empty= ")
	if err != nil {
		t.Fatal(err)
	}
	want := Labels{"app": "web", "tier": "front", "x": "", "empty": ""}
	if !l.Equal(want) {
		t.Fatalf("Parse = %v, want %v", l, want)
	}
	if got := l.String(); got != "app=web,empty=,tier=front,x=" {
		t.Errorf("String = %q", got)
	}
	if l, err := Parse("  "); err != nil || len(l) != 0 {
		t.Errorf("Parse(blank) = %v, %v; want empty, nil", l, err)
	}
	for _, bad := range []string{"app", "=web", "a=b,", "a b=c", "k8s:=x"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded, want error", bad)
		}
	}
}

func TestEqual(t *testing.T) {
	a := Labels{"a": "1", "b": ""}
	if !a.Equal(Labels{"b": "", "a": "1"}) {
		t.Error("equal sets reported different")
	}
	for _, o := range []Labels{{"a": "1"}, {"a": "1", "c": ""}, {"a": "2", "b": ""}, nil} {
		if a.Equal(o) {
			t.Errorf("%v reported equal to %v", a, o)
		}
	}
}

func TestNormalizeKey(t *testing.T) {
	for in, want := range map[string]string{
		"k8s:app":                         "app",
		"any:app":                         "app",
		"app":                             "app",
		"reserved:host":                   "reserved:host",
		"k8s.io.kubernetes.pod.namespace": "k8s.io.kubernetes.pod.namespace",
	} {
		if got := NormalizeKey(in); got != want {
			t.Errorf("NormalizeKey(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestValidateKeyAllowsNamespaceLabelKeys(t *testing.T) {
	// The longest key Kubernetes allows, carried as a namespace label, must still be a
	// valid key of a full label set.
	label := strings.Repeat("a", 63)
	prefix := label + "." + label + "." + label + "." + strings.Repeat("a", 61) // 253 characters
	long := prefix + "/" + strings.Repeat("b", 63)
	if err := ValidateQualifiedKey(long); err != nil {
		t.Fatalf("ValidateQualifiedKey(longest) = %v", err)
	}
	if err := ValidateKey(KeyNamespaceLabelPrefix + long); err != nil {
		t.Errorf("ValidateKey(prefixed longest) = %v", err)
	}
	if err := ValidateKey(KeyNamespaceLabelPrefix + long + "x"); err == nil {
		t.Error("ValidateKey accepted a key longer than any Kubernetes key")
	}
	for _, bad := range []string{"", "a b", "a,b", "a=b", "a\nb"} {
		if err := ValidateKey(bad); err == nil {
			t.Errorf("ValidateKey(%q) succeeded", bad)
		}
	}
}

func TestValidateQualifiedKey(t *testing.T) {
	for _, ok := range []string{"app", "app.kubernetes.io/name", "kubernetes.io/metadata.name",
		"io.cilium.k8s.policy.serviceaccount", "A_b-c.D", "k8s.io.kubernetes.pod.namespace", "x"} {
		if err := ValidateQualifiedKey(ok); err != nil {
			t.Errorf("ValidateQualifiedKey(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "/name", "prefix/", "Upper.case/name", "-a", "a-", "a b",
		"k8s:app", "a/b/c", strings.Repeat("a", 64), strings.Repeat("a", 254) + "/b", "a..b/c"} {
		if err := ValidateQualifiedKey(bad); err == nil {
			t.Errorf("ValidateQualifiedKey(%q) succeeded", bad)
		}
	}
}

func TestValidateValue(t *testing.T) {
	for _, ok := range []string{"", "web", "true", "kube-system", "a.b_c-D9", strings.Repeat("v", 63)} {
		if err := ValidateValue(ok); err != nil {
			t.Errorf("ValidateValue(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"-a", "a-", "a b", "a/b", "é", strings.Repeat("v", 64)} {
		if err := ValidateValue(bad); err == nil {
			t.Errorf("ValidateValue(%q) succeeded", bad)
		}
	}
}

func TestNewRequirement(t *testing.T) {
	r, err := NewRequirement("k8s:tier", "in", []string{"b", "a"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Key != "tier" || r.Operator != OpIn || strings.Join(r.Values, ",") != "a,b" {
		t.Errorf("NewRequirement = %+v, want tier In [a b]", r)
	}
	for _, op := range []string{"In", "IN", "notin", "NotIn", "exists", "DoesNotExist", "doesnotexist"} {
		vals := []string{"x"}
		if strings.Contains(strings.ToLower(op), "exist") {
			vals = nil
		}
		if _, err := NewRequirement("k", op, vals); err != nil {
			t.Errorf("operator %q: %v", op, err)
		}
	}
	bad := []struct {
		key, op string
		values  []string
		want    string
	}{
		{"k", "Equals", []string{"x"}, "unknown operator"},
		{"k", "In", nil, "needs at least one value"},
		{"k", "NotIn", []string{}, "needs at least one value"},
		{"k", "Exists", []string{"x"}, "takes no values"},
		{"k", "DoesNotExist", []string{"x"}, "takes no values"},
		{"", "Exists", nil, "empty label key"},
		{"a b", "Exists", nil, "invalid label key"},
	}
	for _, c := range bad {
		_, err := NewRequirement(c.key, c.op, c.values)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRequirement(%q, %q, %v) = %v, want error containing %q", c.key, c.op, c.values, err, c.want)
		}
	}
}

func mustReq(t *testing.T, key, op string, values ...string) Requirement {
	t.Helper()
	r, err := NewRequirement(key, op, values)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRequirementMatches(t *testing.T) {
	l := Labels{"app": "web", "tier": ""}
	cases := []struct {
		r    Requirement
		want bool
	}{
		{mustReq(t, "app", "In", "web", "db"), true},
		{mustReq(t, "app", "In", "db"), false},
		{mustReq(t, "missing", "In", "web"), false},
		{mustReq(t, "tier", "In", ""), true},
		{mustReq(t, "app", "NotIn", "db"), true},
		{mustReq(t, "app", "NotIn", "web"), false},
		{mustReq(t, "missing", "NotIn", "web"), true}, // as in Kubernetes: absent key satisfies NotIn
		{mustReq(t, "tier", "Exists"), true},
		{mustReq(t, "missing", "Exists"), false},
		{mustReq(t, "missing", "DoesNotExist"), true},
		{mustReq(t, "app", "DoesNotExist"), false},
		{Requirement{Key: "app", Operator: "Bogus"}, false},
	}
	for _, c := range cases {
		if got := c.r.Matches(l); got != c.want {
			t.Errorf("%+v.Matches(%v) = %v, want %v", c.r, l, got, c.want)
		}
	}
}

func TestSelector(t *testing.T) {
	l := Labels{"app": "web", "io.kubernetes.pod.namespace": "x"}
	all := Selector{}
	if !all.Matches(l) || !all.Matches(nil) {
		t.Error("empty selector must match everything")
	}
	if None().Matches(l) || None().Matches(nil) || !None().IsNone() || all.IsNone() {
		t.Error("None must match nothing and report IsNone")
	}
	web := all.With(mustReq(t, "app", "In", "web"))
	inX := Selector{}.With(mustReq(t, KeyNamespace, "In", "x"))
	inY := Selector{}.With(mustReq(t, KeyNamespace, "In", "y"))
	if !web.And(inX).Matches(l) {
		t.Error("app=web AND ns=x should match")
	}
	if web.And(inY).Matches(l) {
		t.Error("app=web AND ns=y should not match")
	}
	if web.And(None()).Matches(l) || None().And(web).Matches(l) || None().With(mustReq(t, "a", "Exists")).Matches(Labels{"a": ""}) {
		t.Error("And/With with None must stay None")
	}
	// And and With must not alias the operands' slices.
	base := Selector{Requirements: make([]Requirement, 1, 4)}
	base.Requirements[0] = mustReq(t, "app", "Exists")
	a := base.With(mustReq(t, "a", "Exists"))
	b := base.With(mustReq(t, "b", "Exists"))
	if a.Requirements[1].Key != "a" || b.Requirements[1].Key != "b" {
		t.Errorf("With aliased its operand: %v / %v", a, b)
	}
}

func TestSelectorString(t *testing.T) {
	s := Selector{}.
		With(mustReq(t, "app", "In", "web")).
		With(mustReq(t, "tier", "In", "b", "a")).
		With(mustReq(t, "env", "NotIn", "dev")).
		With(mustReq(t, "ns", "Exists")).
		With(mustReq(t, "gone", "DoesNotExist"))
	if got, want := s.String(), "app=web,tier in (a,b),env notin (dev),ns,!gone"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	if (Selector{}).String() != "<all>" || None().String() != "<none>" {
		t.Error("String of all/none selectors")
	}
}

func TestSelectorJSONRoundTrip(t *testing.T) {
	sels := []Selector{
		{},
		None(),
		Selector{}.With(mustReq(t, "app", "In", "web", "api")).With(mustReq(t, "x", "DoesNotExist")),
	}
	probe := []Labels{nil, {"app": "web"}, {"app": "api", "x": "1"}, {"app": "db"}}
	for _, s := range sels {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var back Selector
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("unmarshal %s: %v", b, err)
		}
		if back.String() != s.String() || back.IsNone() != s.IsNone() {
			t.Errorf("round trip of %s gave %q, want %q", b, back.String(), s.String())
		}
		for _, l := range probe {
			if back.Matches(l) != s.Matches(l) {
				t.Errorf("round trip of %s changed Matches(%v)", b, l)
			}
		}
	}
	var s Selector
	if err := json.Unmarshal([]byte(`{"requirements":[{"key":"a","operator":"In"}]}`), &s); err == nil {
		t.Error("unmarshal accepted In without values")
	}
}
