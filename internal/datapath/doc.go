// Package datapath is Rampart's kernel edge: it loads the eBPF dataplane (bpf/rampart.c,
// built by bpf2go), pins its maps, attaches the tc programs to endpoint veths, applies
// desired policy and ipcache state to the maps without a window in which traffic denied by
// both the old and the new policy passes, and reads flow events and counters.
//
// Everything here needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN for bpffs). The policy
// computation itself lives in internal/mapstate; this package only writes its result.
//
// # One type per kernel concept
//
// Open returns a Datapath whose fields are the dataplane's concepts, each a small type
// whose methods are that concept's whole surface and which satisfies the agent's
// interface for it directly (internal/agent/kernel.go wires them):
//
//   - Endpoints (attach.go, endpoint.go, ipv6.go, counters.go): the programs on endpoint
//     veths, each endpoint's info and policy, its counters. The agent's EndpointTables.
//   - IPCache (ipcache.go): the identities of addresses and prefixes. The agent's IPCache.
//   - Events (events.go): readers on the flow event ring buffer (EventReader, the agent's
//     FlowEvents) and the events lost to a full ring.
//   - Taps (taps.go): tap rules, their counters, the monitors' interfaces. What the
//     agent's tap kernel drives.
//   - Tunnel (tunnel.go): the VXLAN device's, the IP-in-IP and the tap tunnel's programs,
//     the nodes reached over the IPv6 fabric. The kernel half of the agent's Overlay.
//   - Proxy (proxy.go): where the L7 and DNS proxies listen and the routing to them. The
//     agent's ProxyRouting; with Conntrack its DNSKernel.
//   - Conntrack (ctpeers.go): reads the conntrack maps.
//   - Host (host.go): host policy's programs on the node's devices. The agent's
//     HostDevices.
//   - Pins (pins.go, memory.go, cidrmaps.go, migrate.go): the pinned maps as a whole,
//     their memory, the maps handed to internal/cidrtable and internal/sockverdict, and the
//     migration of an earlier version's pins at Open. The agent's MapMemories.
//
// Datapath itself only closes or removes the whole. The concepts share one unexported
// handle (handle.go): the loaded objects (programs.go), the record of what the maps hold
// (rebuilt from them on Open; the endpoint records in records.go) and the lock that
// guards it. One lock, because the concepts use each
// other's records (the taps find an endpoint's interface and set its tap bits in its
// info, which ApplyEndpoint writes too); the handle's methods are the shared machinery
// (the endpoint records and slots, the ipcache generation, the batch writes) and are all
// unexported.
//
// The concepts are types of one package rather than subpackages: every one reads or
// writes maps whose keys and values are the bpf2go-generated types of one object
// (rampart_bpfel.go), loaded once into one collection, and subpackages would have to
// export those types and the collection, which is this package's inside. The test seams
// are explicit too: the handle's steps (stepObserver) and writers (mapWriters) are
// interfaces a test sets, nil in production.
//
// # Programs
//
// rampart_from_ep runs at tc ingress of an endpoint's host-side veth (packets the endpoint
// sends: egress policy); rampart_to_ep runs at tc egress (packets the endpoint receives:
// ingress policy). Both are attached as Config.Attach says (see Attach): as tc cls_bpf filters under a
// clsact qdisc (AttachTC, the default) or as TCX links pinned under Config.PinDir
// (AttachTCX). Both look the endpoint up by skb->ifindex in the endpoints map.
//
// rampart_to_host and rampart_from_host run on the node's own interfaces (AttachHost) for
// host policy: the host endpoint's info sits there, and they judge only the node's own
// traffic, passing everything else on to the next filter (the IP-in-IP overlay's, whose
// filters and the host's are fabricFilters).
//
// # Maps
//
// All maps are pinned by name under Config.PinDir: endpoints (and the same info by ep_id in
// endpoints_by_id, and in endpoint_slots, a 1,024-slot table direct-mapped by interface
// index that the programs look at first: small enough for the kernel to allocate it from
// its linear mapping, so its lookup costs no page-table walk, where a hash or a large
// array lives in vmalloc memory), ipcache,
// policy, ct, frags, counters, proxy (the L7 proxy's address), events (ring buffer),
// events_lost, and the CIDR set maps cidr4_config, cidr4_top, cidr4_host (map-in-maps that
// hold each bank's tables) and cidr6. A new Datapath on the same PinDir reuses them, so a
// restarted agent sees the same state, and the attached programs (held by the tc filters or
// the pinned TCX links) keep enforcing while no agent runs.
//
// # The send-side L7 verdict
//
// The tc programs send the new connections of the pairs listed in sv_pairs straight to the
// server, whose requests the send-side verdict checks on the client's socket
// (internal/sockverdict, which fills sv_pairs: SockPairsMap). Its maps and sockops link are
// pinned in the same directory.
//
// # CIDR sets
//
// The programs compute the CIDR sets containing a peer from the maps cidr4_config,
// cidr4_top, cidr4_host (map-in-maps that hold each bank's tables) and cidr6. Open sizes
// cidr6 (Config.CIDR6MaxEntries); CIDRMaps hands the maps to internal/cidrtable, which
// builds and switches the tables. MapMemory reports every map's memory as the kernel
// accounts it.
//
// # L7 steering
//
// Policy entries with mapstate.Value.Redirect send TCP connections through the L7 proxy, a
// transparent listener in the node namespace (SetProxy, default DefaultProxyAddr). The
// sender's veth steers them (bpf_sk_assign plus ProxySteerMark, which SetupProxyRouting
// routes to local delivery), also for the destination endpoint's ingress rules, which it
// evaluates through the ipcache's EndpointID. The destination admits a redirected flow
// only from the proxy's upstream socket (ProxyUpstreamMark) and its replies are steered
// back to that socket. No proxy means no connection (fail closed). See bpf/README.md.
package datapath
