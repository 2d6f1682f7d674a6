// Package taps is the agent's taps subsystem: tap contracts, the tap policy (a Datalog
// program compiled by internal/tappolicy into contracts), monitors' reports and the tap
// kernel over the datapath (docs/taps.md, docs/internals/taps.md).
//
// It plugs into the agent's transaction (internal/agent, doc.go "Subsystems") and never
// imports the agent: its part of the model is Config, what it reads of the rest is a World
// and, for a tap policy that names exposed or talks, the computed Policy, both built by
// the agent only when asked for. Compute derives its State purely (compiling the tap
// policy only when its facts changed, resolving the contracts only when their inputs did),
// Apply moves the dataplane's tap rules from one State to another, Committed hears that a
// State is live. Its kernel is the small Table and Monitors interfaces, and Kernel
// implements them over a Dataplane interface the datapath satisfies.
package taps
