package agent

import (
	"fmt"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
)

// A flood of allowed flows does not push drops out of the history, and the history stays
// in publish order.
func TestFlowHistoryKeepsDrops(t *testing.T) {
	h := newFlowHub(4)
	flow := func(i int, verdict string) api.Flow {
		return api.Flow{Verdict: verdict, Endpoint: fmt.Sprint(i)}
	}
	var want []string
	h.publish(flow(0, "FORWARDED"))
	h.publish(flow(1, "DROPPED"))
	h.publish(flow(2, "FORWARDED"))
	h.publish(flow(3, "DROPPED"))
	for i := 4; i < 40; i++ {
		h.publish(flow(i, "FORWARDED"))
	}
	h.publish(flow(40, "DROPPED"))
	h.publish(flow(41, "REDIRECTED"))
	// The three drops (all fit), and the four newest of the rest.
	want = []string{"1", "3", "37", "38", "39", "40", "41"}
	var got []string
	for _, f := range h.history() {
		got = append(got, f.Endpoint)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("history %v, want %v", got, want)
	}
	// Drops beyond their own history's size go, oldest first.
	for i := 42; i < 46; i++ {
		h.publish(flow(i, "DROPPED"))
	}
	got = nil
	for _, f := range h.history() {
		got = append(got, f.Endpoint)
	}
	if want := []string{"37", "38", "39", "41", "42", "43", "44", "45"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("history %v, want %v", got, want)
	}
	if seen, _ := h.stats(); seen != 46 {
		t.Errorf("seen %d, want 46", seen)
	}
}
