// Package relay is the cluster's view of flows (rampart observe --cluster): it finds the
// agent pods of a cluster through its API server and reads each one's flows, merged in
// time order, as one stream.
//
// Each agent is reached through the API server's exec into its pod: the agent image's own
// CLI runs `rampart observe ... -o json` against its node's agent and the relay decodes
// the lines. Nothing new listens on the nodes and access is the API server's: whoever may
// exec into the agent pods (pods/exec in their namespace, an administrator's right, since
// the agents are privileged) may see the cluster's flows. A node that cannot be reached is
// reported and the others are still shown, as Hubble Relay does.
//
// A followed stream is put in time order through a short window (SortWindow): a flow is
// held until it has waited that long, so flows from nodes whose clocks agree come out in
// order however their streams interleave; the buffer is bounded (MaxBuffered) and the
// oldest flow goes out first when it is full.
package relay
