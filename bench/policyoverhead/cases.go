package policyoverhead

import (
	"fmt"
	"slices"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Case names, in report order. The baseline is always first.
const (
	CaseNoAgent  = "no-agent"
	CaseControl  = "control"
	CaseNoPolicy = "no-policy"
	CaseAllowAll = "allow-all"
	CaseL3       = "l3"
	CaseL4       = "l4"
	// CaseObserved is CaseL4 on a second agent that serves metrics, Hubble's flow API and
	// the service map, each read all along (see observe.go): against CaseL4, what
	// observability costs the data path.
	CaseObserved = "observed-l4"
)

// RulesCaseName names the case with n rules of which the last one matches.
func RulesCaseName(n int) string { return fmt.Sprintf("rules-%d", n) }

// probeSpec is an enforcement check run before a case is measured: one connection attempt
// from an endpoint to a server port, and the outcome the case's policy must produce.
type probeSpec struct {
	Name string
	From string // "client" or "bystander"
	Port int
	Want string // benchkit.ProbeConnected, benchkit.ProbeRefused or benchkit.ProbeTimeout
}

// caseDef is one benchmark case.
type caseDef struct {
	Name        string
	Description string
	Agent       bool
	// Control cases run on a second no-agent topology: baseline against baseline (A/A).
	Control bool
	// Observed cases run on the observed agent's topology (CaseObserved).
	Observed bool
	Rules    int
	Manifest []byte // applied before measuring, deleted after; nil: no policy
	Policies int    // documents in Manifest: what the agent must report as stored
	// MinEntries is how many policy map entries the server must have for the policy to
	// count as enforced (every rule of the case yields at least one distinct entry).
	MinEntries int
	Probes     []probeSpec
}

// buildCases returns the cases to run: the baseline, then the agent cases, filtered by
// names (empty: all). The baseline is always included since every ratio needs it.
func buildCases(ports Ports, ruleCounts []int, names []string) ([]caseDef, error) {
	bystanderDenied := probeSpec{"bystander->rr", "bystander", ports.RR, benchkit.ProbeTimeout}
	closedDropped := probeSpec{"client->closed", "client", ports.Closed, benchkit.ProbeTimeout}
	all := []caseDef{
		{Name: CaseNoAgent, Description: "no agent: same topology built without the dataplane"},
		{
			Name:        CaseControl,
			Description: "control (A/A): a second, identical no-agent topology against the first; its ratio is the harness's noise and bias",
			Control:     true,
		},
		{
			Name: CaseNoPolicy, Description: "agent, dataplane attached, no policy (nothing enforced): the cost of the programs themselves",
			Agent: true,
			Probes: []probeSpec{
				{"bystander->rr", "bystander", ports.RR, benchkit.ProbeConnected},
				{"client->closed", "client", ports.Closed, benchkit.ProbeRefused},
			},
		},
		{
			Name: CaseAllowAll, Description: "agent, server enforcing ingress with a policy allowing every peer and port",
			Agent: true, Rules: 1, Manifest: allowAllPolicy(), Policies: 1, MinEntries: 1,
			Probes: []probeSpec{
				{"bystander->rr", "bystander", ports.RR, benchkit.ProbeConnected},
				{"client->closed", "client", ports.Closed, benchkit.ProbeRefused},
			},
		},
		{
			Name: CaseL3, Description: "agent, one L3 rule: ingress from the client's labels, any port",
			Agent: true, Rules: 1, Manifest: l3Policy(), Policies: 1, MinEntries: 1,
			Probes: []probeSpec{bystanderDenied, {"client->closed", "client", ports.Closed, benchkit.ProbeRefused}},
		},
		{
			Name: CaseL4, Description: "agent, one L4 rule: ingress from the client's labels to the benchmark's TCP ports",
			Agent: true, Rules: 1, Manifest: l4Policy(ports), Policies: 1, MinEntries: 2,
			Probes: []probeSpec{bystanderDenied, closedDropped},
		},
		{
			Name: CaseObserved, Description: "the l4 case on a second agent serving metrics, Hubble's flow API and the service map, all read throughout: against l4, what observability costs",
			Agent: true, Observed: true, Rules: 1, Manifest: l4Policy(ports), Policies: 1, MinEntries: 2,
			Probes: []probeSpec{bystanderDenied, closedDropped},
		},
	}
	for _, n := range ruleCounts {
		m, err := manyRulesPolicy(n, ports)
		if err != nil {
			return nil, err
		}
		c := caseDef{
			Name:        RulesCaseName(n),
			Description: fmt.Sprintf("agent, %d policies selecting the server; only the last one matches (the L4 rule)", n),
			Agent:       true, Rules: n, Manifest: m, Policies: n, MinEntries: n,
			Probes: []probeSpec{bystanderDenied, closedDropped},
		}
		if n >= 3 {
			// Filler rules are live in the dataplane, not only in the map: their ports are
			// open to the peers they name (closed, so refused rather than dropped).
			c.Probes = append(c.Probes,
				probeSpec{"client->filler", "client", fillerPortBase, benchkit.ProbeRefused},
				probeSpec{"bystander->filler", "bystander", fillerPortBase + 1, benchkit.ProbeRefused})
		}
		all = append(all, c)
	}
	if len(names) == 0 {
		return all, nil
	}
	var out []caseDef
	for _, n := range names {
		if !slices.ContainsFunc(all, func(c caseDef) bool { return c.Name == n }) {
			return nil, fmt.Errorf("unknown case %q", n)
		}
	}
	for _, c := range all {
		if c.Name == CaseNoAgent || slices.Contains(names, c.Name) {
			out = append(out, c)
		}
	}
	return out, nil
}
