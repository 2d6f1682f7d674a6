package version

import (
	"runtime"
	"testing"
)

func TestString(t *testing.T) {
	for _, c := range []struct {
		in   Info
		want string
	}{
		{Info{Version: "v1.2.3", Revision: "0123abc", Modified: true, GoVersion: "go1.26.1"}, "v1.2.3 (revision 0123abc, modified) go1.26.1"},
		{Info{Version: "(devel)", Revision: "0123abc", GoVersion: "go1.26.1"}, "(devel) (revision 0123abc) go1.26.1"},
		{Info{Version: "(devel)", GoVersion: "go1.26.1"}, "(devel) go1.26.1"},
	} {
		if got := c.in.String(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.in, got, c.want)
		}
	}
}

// TestGetLinkTimeValues: values set at link time replace the build info's.
func TestGetLinkTimeValues(t *testing.T) {
	defer func(v, r string) { Version, Revision = v, r }(Version, Revision)
	Version, Revision = "v9.9.9", "feedbeef"
	i := Get()
	if i.Version != "v9.9.9" || i.Revision != "feedbeef" || i.Modified || i.GoVersion != runtime.Version() {
		t.Fatalf("Get() = %+v, want the link-time version and revision and %s", i, runtime.Version())
	}
}
