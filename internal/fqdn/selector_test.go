package fqdn

import "testing"

func TestSelectorMatches(t *testing.T) {
	cases := []struct {
		name, pattern string
		in            string
		want          bool
	}{
		{"api.example.com", "", "api.example.com", true},
		{"api.example.com", "", "API.Example.com.", true},
		{"api.example.com.", "", "api.example.com", true},
		{"api.example.com", "", "x.api.example.com", false},
		{"", "*", "anything.at.all", true},
		{"", "*.example.com", "a.example.com", true},
		{"", "*.example.com", "example.com", false},
		{"", "*.example.com", "a.b.example.com", false},
		{"", "*.example.com", "aexample.com", false},
		{"", "api-*.example.com", "api-eu.example.com", true},
		{"", "api-*.example.com", "api-.example.com", true},
		{"", "api-*.example.com", "web.example.com", false},
		{"", "**.example.com", "a.example.com", true},
		{"", "**.example.com", "a.b.example.com", true},
		{"", "**.example.com", "example.com", false},
		{"", "**.example.com", "a.example.org", false},
		{"", "ex*le.com", "example.com", true},
		{"", "ex*le.com", "ex.le.com", false},
	}
	for _, c := range cases {
		s, err := NewSelector(c.name, c.pattern)
		if err != nil {
			t.Fatalf("NewSelector(%q, %q): %v", c.name, c.pattern, err)
		}
		if got := s.Matches(c.in); got != c.want {
			t.Errorf("%v matches %q = %v, want %v", s, c.in, got, c.want)
		}
	}
}

func TestSelectorRefused(t *testing.T) {
	for _, c := range []struct{ name, pattern string }{
		{"", ""},
		{"a.com", "*.a.com"},
		{"a..com", ""},
		{"a com", ""},
		{"*.a.com", ""},
		{"", "a.**.com"},
		{"", "a/b"},
		{"", ".a.com"},
	} {
		if s, err := NewSelector(c.name, c.pattern); err == nil {
			t.Errorf("NewSelector(%q, %q) = %v, want an error", c.name, c.pattern, s)
		}
	}
}
