// Package tap is the tap contract model: which flows of which endpoints are copied
// (mirror) or diverted (redirect) to which monitor endpoint, after the FlowTap(SRC, DST,
// Flow_Syntax, Action) primitive of the security-as-a-service design (docs/taps.md).
//
// It is part of the pure core: plain Go over labels, addresses and names, with no BPF,
// netlink or Kubernetes client. It validates contracts, decides exactly whether two
// matches can both match one packet (Overlaps), and resolves contracts against the
// current endpoints into the kernel-neutral rules a dataplane installs per endpoint
// (Resolve). Resolution is a pure function of the contracts and the endpoints, so a
// relabel, a replica added or removed or a monitor gone gives a new resolution and
// nothing else has to remember what a contract selected.
//
// Manifests (the TapContract kind and Antrea's TrafficControl) are parsed by package
// policy, which shares its strict parser with the policy kinds and returns Contracts.
package tap
