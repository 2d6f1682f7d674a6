package agent

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/policy"
)

func TestMetricsCountFlowsAppliesAndEndpoints(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a := h.add("x", "a", map[string]string{"pod": "a"})
	b := h.add("y", "b", map[string]string{"pod": "b"})
	before, err := h.a.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply("allow.yaml", allowFromX); err != nil {
		t.Fatal(err)
	}
	m, err := h.a.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// One transaction, one apply; its time is in exactly one bucket.
	if m.Apply.Count != before.Apply.Count+1 || m.ApplyFailures != 0 || m.Apply.Sum <= before.Apply.Sum {
		t.Fatalf("apply: before %+v, after %+v (failures %d)", before.Apply, m.Apply, m.ApplyFailures)
	}
	var inBuckets uint64
	for _, n := range m.Apply.Counts {
		inBuckets += n
	}
	if inBuckets != m.Apply.Count || len(m.Apply.Counts) != len(m.Apply.Bounds)+1 {
		t.Fatalf("apply buckets %v hold %d of %d", m.Apply.Counts, inBuckets, m.Apply.Count)
	}

	if len(m.Endpoints) != 2 || m.Endpoints[0].Endpoint != "x/a" || m.Endpoints[1].Endpoint != "y/b" {
		t.Fatalf("endpoints: %+v", m.Endpoints)
	}
	h.a.mu.Lock()
	want := len(h.a.cur.state.Endpoints[b.EpID].Entries)
	h.a.mu.Unlock()
	if got := m.Endpoints[1].PolicyEntries; got != want || got == 0 {
		t.Fatalf("y/b policy entries %d, the applied state has %d", got, want)
	}
	// The fake dataplane counts an endpoint's id as its ingress packets.
	if c := m.Endpoints[0].Counters; c == nil || c.IngressPackets != uint64(a.EpID) {
		t.Fatalf("x/a counters: %+v", c)
	}

	ipA, ipB := netip.MustParseAddr(a.IP), netip.MustParseAddr(b.IP)
	drop := flow.Event{Time: time.Now(), Source: ipA, Destination: ipB, SourcePort: 40000, DestinationPort: 81, EpID: b.EpID,
		Type: flow.EventDrop, Verdict: flow.VerdictDropped, Reason: flow.ReasonPolicyDefaultDeny, Direction: policy.Ingress, Protocol: policy.ProtoTCP}
	h.dp.events <- drop
	h.dp.events <- drop
	h.dp.events <- flow.Event{Time: time.Now(), Source: ipA, Destination: ipB, SourcePort: 40001, DestinationPort: 80, EpID: b.EpID,
		Type: flow.EventNew, Verdict: flow.VerdictForwarded, Direction: policy.Ingress, Protocol: policy.ProtoUDP}
	h.a.onAccessLog(flow.AccessLog{Time: time.Now(), Denied: true, Latency: 300 * time.Microsecond})
	h.a.onAccessLog(flow.AccessLog{Time: time.Now(), Upstream: true, Latency: 3 * time.Millisecond})
	h.a.onAccessLog(flow.AccessLog{Time: time.Now(), Upstream: true, Chain: flow.FlagSendSide.String(), Latency: 40 * time.Microsecond})

	wantFlows := map[api.FlowCount]bool{
		{Type: "drop", Verdict: "DROPPED", Reason: "policy-default-deny", Direction: "ingress", Protocol: "TCP", Count: 2}: true,
		{Type: "new", Verdict: "FORWARDED", Direction: "ingress", Protocol: "UDP", Count: 1}:                               true,
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if m, err = h.a.Metrics(ctx); err != nil {
			t.Fatal(err)
		}
		got := map[api.FlowCount]bool{}
		for _, f := range m.Flows {
			got[f] = true
		}
		if len(got) == len(wantFlows) && len(m.Flows) == len(wantFlows) && func() bool {
			for f := range wantFlows {
				if !got[f] {
					return false
				}
			}
			return true
		}() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("flows counted: %+v, want %v", m.Flows, wantFlows)
		}
		time.Sleep(10 * time.Millisecond)
	}

	wantL7 := map[api.L7Count]bool{
		{Verdict: "DROPPED", Reason: ReasonL7Denied, Checker: "proxy", Count: 1}: true,
		{Verdict: "FORWARDED", Checker: "proxy", Count: 1}:                       true,
		{Verdict: "FORWARDED", Checker: "send-side", Count: 1}:                   true,
	}
	if len(m.L7) != len(wantL7) {
		t.Fatalf("L7 counts: %+v", m.L7)
	}
	for _, c := range m.L7 {
		if !wantL7[c] {
			t.Fatalf("L7 count %+v not expected (all: %+v)", c, m.L7)
		}
	}
	// 40 us and 300 us and 3 ms: the buckets up to 100 us, 500 us and 5 ms.
	lat := m.L7Latency
	if lat.Count != 3 || lat.Counts[0] != 1 || lat.Counts[2] != 1 || lat.Counts[5] != 1 || lat.Bounds[5] != 0.005 {
		t.Fatalf("L7 latency: %+v", lat)
	}
	if d := lat.Sum - 0.00334; d > 1e-9 || d < -1e-9 {
		t.Fatalf("L7 latency sum %v, want 0.00334", lat.Sum)
	}
}
