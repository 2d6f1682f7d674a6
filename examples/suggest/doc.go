// Package suggest plays the Star Wars (examples/starwars) and marketplace
// (examples/marketplace) scenarios against a real agent to prove `rampart policy suggest`:
// the scenario's allowed traffic runs with no policy, the suggestion is applied in audit
// mode and the same traffic again must give no AUDIT flow, then the same manifests
// enforced must still pass that traffic and drop a connection the scenario did not make.
// Needs root (skipped without it, failed with CI=true) and, for the L7 variant, Envoy.
package suggest
