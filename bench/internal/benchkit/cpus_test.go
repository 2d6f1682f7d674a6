package benchkit

import "testing"

func TestParseCPUList(t *testing.T) {
	if got, err := ParseCPUList("0"); err != nil || len(got) != 1 || got[0] != 0 {
		t.Errorf("0: %v %v", got, err)
	}
	if got, err := ParseCPUList(""); err != nil || got != nil {
		t.Errorf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"x", "-1", "1-0", "100000", "0-100000"} {
		if _, err := ParseCPUList(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCPUFlagRoundTrip(t *testing.T) {
	for _, cpus := range []string{"", "0", "0,1"} {
		if got := CPUArg(CPUFlag(cpus)); got != cpus {
			t.Errorf("CPUArg(CPUFlag(%q)) = %q", cpus, got)
		}
	}
	if CPUFlag("") != "none" || CPUArg("none") != "" {
		t.Error(`no pinning is not shown as "none"`)
	}
}
