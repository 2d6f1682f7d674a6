package cli

import (
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/suggest"
)

// Package suggest names verdicts without importing the flow vocabulary: the names must
// stay the agent's.
func TestSuggestVerdictNames(t *testing.T) {
	for _, c := range []struct {
		v    flow.Verdict
		name string
	}{
		{flow.VerdictForwarded, suggest.VerdictForwarded},
		{flow.VerdictRedirected, suggest.VerdictRedirected},
		{flow.VerdictAudit, suggest.VerdictAudit},
		{flow.VerdictDropped, suggest.VerdictDropped},
	} {
		if c.v.String() != c.name {
			t.Errorf("suggest names verdict %s %q", c.v, c.name)
		}
	}
}

func TestSuggestFlow(t *testing.T) {
	now := time.Now()
	typ := uint8(8)
	for _, c := range []struct {
		f    api.Flow
		ok   bool
		port uint16
		http bool
	}{
		{api.Flow{Time: now, Type: "new", Verdict: "FORWARDED", Protocol: "TCP", Dest: api.FlowPeer{Port: 80}}, true, 80, false},
		{api.Flow{Time: now, Type: "drop", Verdict: "DROPPED", Protocol: "ICMP", ICMPType: &typ}, true, 8, false},
		{api.Flow{Time: now, Type: "l7", Verdict: "FORWARDED", Protocol: "TCP", Dest: api.FlowPeer{Port: 80}, L7: &api.L7Flow{Method: "GET", Path: "/"}}, true, 80, true},
		{api.Flow{Time: now, Type: "drop", Verdict: "DROPPED", Protocol: "ARP"}, false, 0, false},
	} {
		sf, ok := suggestFlow(c.f)
		if ok != c.ok || ok && (sf.Port != c.port || (sf.HTTP != nil) != c.http) {
			t.Errorf("%+v: got %+v %v", c.f, sf, ok)
		}
	}
}
