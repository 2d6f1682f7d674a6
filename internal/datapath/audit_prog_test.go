package datapath

import (
	"testing"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/mapstate"
)

// applyAudit installs the fixture's endpoint with an enforced policy and an audit policy.
func (f *fixture) applyAudit(enforceIn bool, es []entry, auditEnforceIn bool, audit ...entry) {
	f.t.Helper()
	err := f.d.Endpoints.ApplyEndpoint(epIfindex, EndpointInfo{EpID: epID, Identity: epIdent, Addr: epIP, Addr6: epIP6, LinkLocal6: epLL6},
		mapstate.EndpointPolicy{EnforceIngress: enforceIn, Entries: entries(es...),
			Audit: &mapstate.EndpointPolicy{EnforceIngress: auditEnforceIn, Entries: entries(audit...)}})
	if err != nil {
		f.t.Fatalf("ApplyEndpoint: %v", err)
	}
}

// expectAudit checks that a new flow passed with an AUDIT event of the reason and rule.
func (f *fixture) expectAudit(name string, ret uint32, reason flow.Reason, rule uint32) {
	f.t.Helper()
	if ret != actOK {
		f.t.Errorf("%s: verdict %d, want pass", name, ret)
		f.drain()
		return
	}
	ev := nextEvent(f.t, f.ev)
	if ev.Type != flow.EventNew || ev.Verdict != flow.VerdictAudit || ev.Reason != reason || ev.RuleID != rule {
		f.t.Errorf("%s: event %v/%v/%v rule %d, want new/AUDIT/%v rule %d", name, ev.Type, ev.Verdict, ev.Reason, ev.RuleID, reason, rule)
	}
	f.drain()
}

// expectForwarded checks that a new flow passed with a FORWARDED event.
func (f *fixture) expectForwarded(name string, ret uint32) {
	f.t.Helper()
	if ret != actOK {
		f.t.Errorf("%s: verdict %d, want pass", name, ret)
		f.drain()
		return
	}
	if ev := nextEvent(f.t, f.ev); ev.Verdict != flow.VerdictForwarded {
		f.t.Errorf("%s: event %v/%v, want FORWARDED", name, ev.Type, ev.Verdict)
	}
	f.drain()
}

// The audit entries never change a verdict: what they would deny passes with an AUDIT
// event naming their rule (or default deny), what the enforced entries deny drops as
// before, and established packets carry no audit. IPv4 and IPv6 alike; removing the audit
// policy removes its entries.
func TestAuditEntries(t *testing.T) {
	f := newFixture(t, Config{})
	if err := f.d.IPCache.ApplyIPCache(fixtureIPCache6()); err != nil {
		t.Fatal(err)
	}
	f.applyAudit(true, []entry{e(allow(idA, in, tcp, 80, 16, 11)), e(allow(idB, in, tcp, 80, 16, 12))},
		true, e(allow(idA, in, tcp, 80, 16, 11)), e(deny(idB, in, tcp, 80, 16, 31)))

	fromA := f.synIn(ipA, 80)
	f.expectForwarded("allowed by both", f.toEp(fromA))
	fromB := f.synIn(ipB, 80)
	f.expectAudit("audit deny", f.toEp(fromB), flow.ReasonPolicyDeny, 31)
	ack := fromB
	ack.tcpFlags = 0x10
	f.expectPass("established after an audit", f.toEp(ack))
	noEvent(t, f.ev)
	f.expectDrop("enforced default deny", f.toEp(f.synIn(ipA, 81)), flow.ReasonPolicyDefaultDeny)

	// Not enforced: the audit policy's default deny is reported, the flow forwarded.
	f.applyAudit(false, nil, true, e(allow(idA, in, tcp, 80, 16, 11)))
	f.expectAudit("audit default deny", f.toEp(f.synIn(ipB, 80)), flow.ReasonPolicyDefaultDeny, 0)
	f.expectForwarded("audit allow", f.toEp(f.synIn(ipA, 80)))
	syn6 := f.syn6(ipB6, 80)
	f.expectAudit("IPv6 audit default deny", f.toEp6(syn6), flow.ReasonPolicyDefaultDeny, 0)

	// Without the audit policy its entries go, and flows are plainly forwarded.
	f.apply6(false, false)
	for k := range f.d.policies[epID] {
		if k.EpId&auditEpFlag != 0 {
			t.Errorf("audit entry %s left after the audit policy went", keyString(k))
		}
	}
	f.expectForwarded("no audit", f.toEp(f.synIn(ipB, 80)))
}
