package main

import (
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/api"
)

// The traces of a denied cross-node pair as the two nodes answer them: the source's node
// judges only its pod's egress, which no policy restricts; the destination's node its
// pod's ingress, which no rule admits.
var (
	srcTrace = nodeTrace{Node: "node-1", Result: api.TraceResult{Allowed: true, Sides: []api.TraceSide{
		{Direction: "egress", Endpoint: "org-c/c-1", Allowed: true, Reason: "not enforced"}}}}
	dstTrace = nodeTrace{Node: "node-2", Result: api.TraceResult{Allowed: false, Sides: []api.TraceSide{
		{Direction: "ingress", Endpoint: "org-a/a-2", Enforced: true, Reason: "no rule allows (default deny)"}}}}
)

// The demo announces a denied pair: the trace shown first is one that denies it, and the
// one that allows says that it judged only its own side and where the pair is denied.
func TestExplainShowsTheDenyingNodeFirst(t *testing.T) {
	got, err := denyingFirst([]nodeTrace{srcTrace, dstTrace})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Node != "node-2" || got[1].Node != "node-1" {
		t.Fatalf("order %v, want node-2 (denies) before node-1 (allows)", got)
	}
	if j := judged(dstTrace.Result); j != "the ingress at org-a/a-2" {
		t.Errorf("judged(destination's trace) = %q", j)
	}
	if c := conclusion(got[0], got); c != "=> node-2 denies the pair: the ingress at org-a/a-2 (no rule allows (default deny))" {
		t.Errorf("conclusion of the denying trace: %q", c)
	}
	c := conclusion(got[1], got)
	if !strings.Contains(c, "node-1 allows the sides it judges (the egress at org-c/c-1)") || !strings.HasSuffix(c, "the pair is denied on node-2") {
		t.Errorf("conclusion of the allowing trace: %q", c)
	}
}

// A pair the table denies but no node's trace denies has no explanation: explain fails
// instead of printing an ALLOWED under its "denied".
func TestExplainRefusesAPairNoTraceDenies(t *testing.T) {
	allowing := dstTrace
	allowing.Result.Allowed = true
	if _, err := denyingFirst([]nodeTrace{srcTrace, allowing}); err == nil || !strings.Contains(err.Error(), "no node's policy trace denies it") {
		t.Errorf("denyingFirst of two allowing traces: %v", err)
	}
}
