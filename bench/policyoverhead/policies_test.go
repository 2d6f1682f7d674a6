package policyoverhead

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// world is the state the agent computes for the benchmark's three endpoints and a set of
// manifests, built from the same pure packages the agent uses.
type world struct {
	state                     mapstate.State
	rules                     []policy.Rule
	client, server, bystander mapstate.Endpoint
}

func computeWorld(t *testing.T, manifest []byte) world {
	t.Helper()
	pw := benchkit.ComputePolicyWorld(t, "generated", manifest, benchNamespace,
		netip.MustParsePrefix("198.18.7.0/24"), clientApp, serverApp, bystanderApp)
	return world{state: pw.State, rules: pw.Rules, client: pw.Endpoints[clientApp],
		server: pw.Endpoints[serverApp], bystander: pw.Endpoints[bystanderApp]}
}

func (w world) ingress(from netip.Addr, port int) mapstate.Decision {
	return mapstate.Lookup(w.state, w.server.ID, policy.Ingress, from, policy.ProtoTCP, uint16(port))
}

func TestManyRulesPolicyOnlyLastMatches(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			m, err := manyRulesPolicy(n, benchPorts)
			if err != nil {
				t.Fatal(err)
			}
			w := computeWorld(t, m)
			if len(w.rules) != n {
				t.Fatalf("%d rules parsed, want %d", len(w.rules), n)
			}
			last := w.rules[n-1].ID
			for _, port := range []int{benchPorts.Iperf, benchPorts.RR} {
				d := w.ingress(w.client.IP, port)
				if d.Verdict != mapstate.Allowed || d.RuleID != last {
					t.Errorf("client -> server:%d: %s by rule %d, want allowed by the last rule %d", port, d.Verdict, d.RuleID, last)
				}
			}
			for _, c := range []struct {
				name string
				from netip.Addr
				port int
			}{
				{"bystander -> rr", w.bystander.IP, benchPorts.RR},
				{"client -> closed", w.client.IP, benchPorts.Closed},
			} {
				if d := w.ingress(c.from, c.port); d.Verdict != mapstate.Denied {
					t.Errorf("%s: %s (%s), want denied", c.name, d.Verdict, d.Reason)
				}
			}
			// Every filler rule must land in the server's map as entries of its own:
			// otherwise the case would not load the map as it claims.
			if got := len(w.state.Endpoints[w.server.ID].Entries); got < n {
				t.Errorf("server has %d policy entries, want at least %d (one per rule)", got, n)
			}
			if n >= 3 {
				for _, c := range []struct {
					name   string
					filler int // index of the filler rule that must allow it
					from   netip.Addr
					port   int
				}{
					{"client -> filler 0", 0, w.client.IP, fillerPortBase},
					{"bystander -> filler 1", 1, w.bystander.IP, fillerPortBase + 1},
					{"filler CIDR peer -> iperf", 2, benchkit.AddAddr(fillerCIDR.Addr(), 2), benchPorts.Iperf},
				} {
					if c.filler >= n-1 {
						continue
					}
					if d := w.ingress(c.from, c.port); d.Verdict != mapstate.Allowed || d.RuleID != w.rules[c.filler].ID {
						t.Errorf("%s: %s by rule %d, want allowed by filler rule %d", c.name, d.Verdict, d.RuleID, w.rules[c.filler].ID)
					}
				}
				// Filler rules never open the benchmark's ports to the client or bystander.
				if d := w.ingress(w.bystander.IP, benchPorts.Iperf); d.Verdict != mapstate.Denied {
					t.Errorf("bystander -> iperf: %s, want denied", d.Verdict)
				}
			}
		})
	}
}

// The probes of every case must agree with what its policy means: a probe that wants a
// connection or a reset needs an allow, one that wants a timeout needs a deny.
func TestCaseProbesMatchPolicies(t *testing.T) {
	cases, err := buildCases(benchPorts, []int{30}, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range cases {
		names[c.Name] = true
		if !c.Agent {
			if c.Manifest != nil || len(c.Probes) > 0 {
				t.Errorf("case %s without agent has a policy or probes", c.Name)
			}
			continue
		}
		if (c.Manifest == nil) != (c.Name == CaseNoPolicy) {
			t.Errorf("case %s: policy %v", c.Name, c.Manifest != nil)
		}
		w := computeWorld(t, c.Manifest)
		if got := len(w.state.Endpoints[w.server.ID].Entries); got < c.MinEntries {
			t.Errorf("%s: %d server entries, but the run waits for %d", c.Name, got, c.MinEntries)
		}
		if len(c.Probes) == 0 {
			t.Errorf("%s: no enforcement probes", c.Name)
		}
		for _, p := range c.Probes {
			from := w.client.IP
			if p.From == "bystander" {
				from = w.bystander.IP
			}
			want := mapstate.Allowed
			if p.Want == benchkit.ProbeTimeout {
				want = mapstate.Denied
			}
			if d := w.ingress(from, p.Port); d.Verdict != want {
				t.Errorf("%s probe %s: policy says %s, probe expects %s", c.Name, p.Name, d.Verdict, p.Want)
			}
		}
		// The benchmark's own traffic must be allowed in every case.
		for _, port := range []int{benchPorts.Iperf, benchPorts.RR} {
			if d := w.ingress(w.client.IP, port); d.Verdict != mapstate.Allowed {
				t.Errorf("%s: client -> server:%d %s", c.Name, port, d.Verdict)
			}
		}
	}
	for _, n := range []string{CaseNoAgent, CaseControl, CaseNoPolicy, CaseAllowAll, CaseL3, CaseL4, "rules-30"} {
		if !names[n] {
			t.Errorf("case %s missing", n)
		}
	}
}

func TestBuildCasesFilter(t *testing.T) {
	cases, err := buildCases(benchPorts, []int{1000}, []string{CaseL4})
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) != 2 || cases[0].Name != CaseNoAgent || cases[1].Name != CaseL4 {
		t.Errorf("got %v, want the baseline and l4", caseNames(cases))
	}
	if _, err := buildCases(benchPorts, nil, []string{"l5"}); err == nil {
		t.Error("unknown case accepted")
	}
	if _, err := manyRulesPolicy(MaxRules+1, benchPorts); err == nil {
		t.Error("rule count above MaxRules accepted")
	}
}

func caseNames(cs []caseDef) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}
