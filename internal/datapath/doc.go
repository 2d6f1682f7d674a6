// Package datapath is Rampart's kernel edge: it loads the eBPF dataplane (bpf/rampart.c,
// built by bpf2go), pins its maps, attaches the tc programs to endpoint veths, applies
// desired policy and ipcache state to the maps without a window in which traffic denied by
// both the old and the new policy passes, and reads flow events and counters.
//
// Everything here needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN for bpffs). The policy
// computation itself lives in internal/mapstate; this package only writes its result.
//
// # Programs
//
// rampart_from_ep runs at tc ingress of an endpoint's host-side veth (packets the endpoint
// sends: egress policy); rampart_to_ep runs at tc egress (packets the endpoint receives:
// ingress policy). Both look the endpoint up by skb->ifindex in the endpoints map.
//
// # Maps
//
// All maps are pinned by name under Config.PinDir: endpoints, ipcache, policy, ct, frags,
// counters, events (ring buffer) and events_lost. A new Datapath on the same PinDir reuses
// them, so a restarted agent sees the same state, and the tc filters (which hold the
// programs) keep enforcing while no agent runs.
package datapath
