package flow

import (
	"strings"
	"testing"
)

// TestNamesRoundTrip checks that every code declared in rampart.h has a name that parses
// back to it, in any case, and that no two codes share a name.
func TestNamesRoundTrip(t *testing.T) {
	roundTrip(t, "event type", eventTypeOrder, EventType.String, ParseEventType)
	roundTrip(t, "verdict", verdictOrder, Verdict.String, ParseVerdict)
	roundTrip(t, "reason", reasonOrder, Reason.String, ParseReason)
	roundTrip(t, "flag", flagsOrder, Flags.String, func(s string) (Flags, error) { return ParseFlags([]string{s}) })
}

func roundTrip[T ~uint8](t *testing.T, what string, order []T, name func(T) string, parse func(string) (T, error)) {
	t.Helper()
	if len(order) == 0 {
		t.Fatalf("no %s codes generated", what)
	}
	seen := map[string]T{}
	for _, c := range order {
		n := name(c)
		if n == "" || strings.HasPrefix(n, what) {
			t.Errorf("%s %d has no name (%q)", what, c, n)
		}
		if prev, ok := seen[n]; ok {
			t.Errorf("%s %d and %d are both %q", what, prev, c, n)
		}
		seen[n] = c
		for _, s := range []string{n, strings.ToUpper(n), strings.ToLower(n)} {
			got, err := parse(s)
			if err != nil || got != c {
				t.Errorf("parse %s %q = %d, %v; want %d", what, s, got, err, c)
			}
		}
	}
	if _, err := parse("no-such-name"); err == nil || !strings.Contains(err.Error(), name(order[len(order)-1])) {
		t.Errorf("parse %s of an unknown name: %v, want an error listing the names", what, err)
	}
}

// TestNames pins the names users see in observe and the API, which the C enumerators
// make: renaming one in rampart.h changes them, and this says so.
func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{EventNew.String(), "new"},
		{EventDrop.String(), "drop"},
		{VerdictForwarded.String(), "FORWARDED"},
		{VerdictDropped.String(), "DROPPED"},
		{VerdictRedirected.String(), "REDIRECTED"},
		{ReasonNone.String(), "none"},
		{ReasonPolicyDefaultDeny.String(), "policy-default-deny"},
		{ReasonFragmentUnknown.String(), "fragment-unknown"},
		{ReasonSpoofedSource.String(), "spoofed-source"},
		{ReasonL7Unchecked.String(), "l7-unchecked"},
		{FlagNone.String(), "none"},
		{FlagSendSide.String(), "send-side"},
		{(FlagL7Egress | FlagSendSide).String(), "l7-egress|send-side"},
		{Reason(200).String(), "reason-200"},
		{Verdict(0).String(), "verdict-0"},
		{(FlagARP | FlagDnsObserve).String(), "arp|dns-observe"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestFlags(t *testing.T) {
	f := FlagL7Ingress | FlagSendSide
	if !f.Has(FlagSendSide) || !f.Has(FlagL7Ingress|FlagSendSide) || f.Has(FlagFromProxy) || f.Has(FlagSendSide|FlagARP) {
		t.Errorf("Has on %v is wrong", f)
	}
	back, err := ParseFlags(f.Names())
	if err != nil || back != f {
		t.Errorf("ParseFlags(%q) = %v, %v; want %v", f.Names(), back, err, f)
	}
	if n := FlagNone.Names(); len(n) != 0 {
		t.Errorf("no flags named %q", n)
	}
	if _, err := ParseFlags([]string{"send-side", "bogus"}); err == nil {
		t.Error("unknown flag name accepted")
	}
}
