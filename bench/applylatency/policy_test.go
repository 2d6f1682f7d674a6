package applylatency

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// world is the state the agent computes for the benchmark's endpoints and one policy.
type world struct {
	state                     mapstate.State
	rules                     []policy.Rule
	client, server, bystander mapstate.Endpoint
}

func computeWorld(t *testing.T, manifest []byte, f Format) world {
	t.Helper()
	pw := benchkit.ComputePolicyWorld(t, "generated."+string(f), manifest, benchNamespace,
		netip.MustParsePrefix("198.19.64.0/24"), clientApp, serverApp, bystanderApp)
	return world{state: pw.State, rules: pw.Rules, client: pw.Endpoints[clientApp],
		server: pw.Endpoints[serverApp], bystander: pw.Endpoints[bystanderApp]}
}

func (w world) ingress(from netip.Addr, port int) mapstate.Decision {
	return mapstate.Lookup(w.state, w.server.ID, policy.Ingress, from, policy.ProtoTCP, uint16(port))
}

// The policies must mean what the probes assume: the large one admits the client on
// NewPort by its last rule only and drops OldPort, the old one the reverse; the large
// one gives the server two map entries per filler rule (the 20,000 for 10,000
// rules); and YAML and JSON are the same policy.
func TestPoliciesMeanWhatTheProbesAssume(t *testing.T) {
	for _, n := range []int{1, 4, 100, 10000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var rules [2][]policy.Rule
			for i, f := range []Format{YAML, JSON} {
				m, err := LargePolicy(n, f)
				if err != nil {
					t.Fatal(err)
				}
				w := computeWorld(t, m, f)
				rules[i] = w.rules
				if len(w.rules) != n {
					t.Fatalf("%s: %d rules parsed, want %d", f, len(w.rules), n)
				}
				if d := w.ingress(w.client.IP, NewPort); d.Verdict != mapstate.Allowed || d.RuleID != w.rules[n-1].ID {
					t.Errorf("%s: client -> NewPort: %s by rule %d, want allowed by the last rule", f, d.Verdict, d.RuleID)
				}
				for _, c := range []struct {
					name string
					from netip.Addr
					port int
				}{{"client -> OldPort", w.client.IP, OldPort}, {"bystander -> NewPort", w.bystander.IP, NewPort}} {
					if d := w.ingress(c.from, c.port); d.Verdict != mapstate.Denied {
						t.Errorf("%s: %s: %s, want denied", f, c.name, d.Verdict)
					}
				}
				if got, want := len(w.state.Endpoints[w.server.ID].Entries), 2*(n-1)+1; got != want {
					t.Errorf("%s: server has %d policy entries, want %d", f, got, want)
				}
				if n >= 3 {
					if d := w.ingress(benchkit.AddAddr(fillerCIDR.Addr(), 2), fillerPortBase+8); d.Verdict != mapstate.Allowed || d.RuleID != w.rules[2].ID {
						t.Errorf("%s: CIDR filler: %s by rule %d, want allowed by rule %d", f, d.Verdict, d.RuleID, w.rules[2].ID)
					}
				}
			}
			if !reflect.DeepEqual(rules[0], rules[1]) {
				t.Errorf("the YAML and the JSON document parse to different rules")
			}
			old := computeWorld(t, OldPolicy(YAML), YAML)
			if d := old.ingress(old.client.IP, OldPort); d.Verdict != mapstate.Allowed {
				t.Errorf("old policy: client -> OldPort %s, want allowed", d.Verdict)
			}
			if d := old.ingress(old.client.IP, NewPort); d.Verdict != mapstate.Denied {
				t.Errorf("old policy: client -> NewPort %s, want denied", d.Verdict)
			}
		})
	}
}
