// Package hubble speaks Hubble's flow API for Rampart: the observer gRPC service of
// github.com/cilium/cilium's api/v1/observer (GetFlows, ServerStatus, GetNodes,
// GetNamespaces), so the hubble CLI and other Hubble clients can observe a Rampart node,
// and the mapping of Rampart's flows (api.Flow) to Hubble's flow.Flow, which
// `rampart observe -o jsonpb` prints too.
//
// The mapping fills only what Rampart knows; a field it does not know stays at its zero
// value (docs/observability.md, "Flows: the Hubble API", lists both). Hubble's filters are
// applied to the mapped flow, so a filter means what it means against Cilium; a filter
// field this server cannot evaluate is refused (InvalidArgument naming it), never
// ignored.
//
// The server reads flows through Source, the part of the agent's service it uses, and
// holds nothing of its own but a stream's state: the agent's history and its bounded
// per-follower queue (lost flows reported as LostEvent) keep its memory bounded whatever
// the clients do.
package hubble
