package churn

import "testing"

// TestAttachBaseline: the agent's share of a change is read against the baseline that
// attaches as the agent does, whatever the spelling of its --attach flag.
func TestAttachBaseline(t *testing.T) {
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{nil, MethodBaselineClsBPF},
		{[]string{"--attach=tc"}, MethodBaselineClsBPF},
		{[]string{"--attach=tcx"}, MethodBaselineTCX},
		{[]string{"-attach", "tcx", "--debug"}, MethodBaselineTCX},
		{[]string{"--attach=tcx", "--attach=tc"}, MethodBaselineClsBPF},
	} {
		if got := attachBaseline(c.flags); got != c.want {
			t.Errorf("attachBaseline(%q) = %s, want %s", c.flags, got, c.want)
		}
	}
}
