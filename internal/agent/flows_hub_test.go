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

// A follower whose queue is full loses flows without stalling the publisher, and learns
// how many it lost, once.
func TestFlowHubCountsLostPerFollower(t *testing.T) {
	h := newFlowHub(4)
	slow, fast := make(chan api.Flow, 1), make(chan api.Flow, 8)
	h.subs[slow], h.subs[fast] = struct{}{}, struct{}{}
	for i := 0; i < 5; i++ {
		h.publish(api.Flow{Verdict: "FORWARDED"})
	}
	if n := h.takeLost(slow); n != 4 {
		t.Errorf("slow follower lost %d, want 4", n)
	}
	if n := h.takeLost(slow); n != 0 {
		t.Errorf("slow follower told again: %d", n)
	}
	if n := h.takeLost(fast); n != 0 {
		t.Errorf("fast follower lost %d, want 0", n)
	}
	if _, lost := h.stats(); lost != 4 {
		t.Errorf("lost %d, want 4", lost)
	}
	if n, capacity := h.buffered(); n != 4 || capacity != 8 {
		t.Errorf("buffered %d of %d, want 4 of 8", n, capacity)
	}
}
