// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Rampart dataplane: tc programs on an endpoint's host-side veth.
 *
 *   rampart_from_ep  tc ingress: packets leaving the endpoint  (DIR_EGRESS policy)
 *   rampart_to_ep    tc egress:  packets entering the endpoint (DIR_INGRESS policy)
 *
 * and on the node's VXLAN device, the overlay between nodes (tunnel.h):
 *   rampart_to_tunnel / rampart_from_tunnel  tc egress / ingress of the device
 * or, for the IP-in-IP overlay, on the node's fabric interfaces (ipip.h):
 *   rampart_to_ipip / rampart_from_ipip      tc egress / ingress
 *
 * Per packet: endpoint -> parse -> source check (leaving the endpoint) -> fragments
 * -> conntrack -> ipcache -> policy -> verdict
 * -> for new flows and drops, a flow event (and drops a counter; forwarded packets are
 * counted by the interface itself). Every step is a fixed number of map lookups. Anything
 * the program cannot classify is dropped (fail closed).
 *
 * L7 (see proxy.h): connections that a redirect entry sends through the proxy are steered
 * at the client's veth (rampart_from_ep), whether the entry is the client's egress policy
 * or the destination endpoint's ingress policy, which is evaluated there too. The proxy's
 * upstream connection (socket mark) is admitted by the destination's redirect entry at
 * rampart_to_ep; a redirect verdict for a packet that did not come from the proxy drops.
 * The exception is a pair of local endpoints in sv_pairs: the send-side verdict
 * (sockverdict.c) checks its requests on the client's socket, so its connections go
 * straight to the server, and tc only makes sure their data comes from that socket.
 *
 * Policy changes, and changes of a peer's identity, reach established flows through the
 * check revision their conntrack entries record (see recheck_established). */

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "conntrack.h"
#include "cidrset.h"
#include "policy.h"
#include "events.h"
#include "proxy.h"
#include "tunnel.h"
#include "ipip.h"
#include "tap.h"
#include "ipv6.h"
#include "tunnel6.h"
#include "tap6.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* flow_event is only used through a ring buffer pointer, which leaves no BTF for it; this
 * unused global keeps the type in BTF so bpf2go can export it to Go, and with it the enums
 * of its fields (the flow vocabulary, rampart.h). */
const struct flow_event *unused_flow_event __attribute__((unused));

/* frag_record remembers the first fragment's ports and verdict for the later fragments,
 * and what it was judged as: its peer identity (d's), VNI identity and ipcache generation. */
static __noinline void frag_record(const struct pkt *p, const struct decision *d,
					int allowed)
{
	struct frag_key k;
	struct frag_value v = {};

	frag_key_fill(&k, p, d->ep_id, d->dir);
	v.sport = p->t.sport;
	v.dport = p->t.dport;
	v.allowed = allowed ? 1 : 0;
	v.reason = d->reason;
	v.rule_id = d->rule_id;
	v.peer_identity = ct_peer_identity(d);
	v.tunnel_id = p->tunnel_id;
	v.ipcache_gen = p->ipcache_gen;
	bpf_map_update_elem(&frags_peer, &k, &v, BPF_ANY);
}

/* frag_record_established records the verdict of a first fragment that passed as a packet of
 * an established flow: its peer identity is the one the flow's conntrack entry (entry, or
 * looked up when the flow cache served the packet) was last checked with. Out of line:
 * fragments are rare. */
static __noinline void frag_record_established(const struct pkt *p, struct decision *d,
						    const struct ct_value *entry)
{
	struct ct4_key k;
	__u32 peer = ID_UNKNOWN;

	if (!entry) {
		ct_key_fill(&k, &p->t, d->ep_id, d->dir);
		entry = bpf_map_lookup_elem(&conntrack4_peer, &k);
	}
	if (entry)
		peer = entry->peer_identity;
	if (d->dir == DIR_EGRESS)
		d->dst_identity = peer;
	else
		d->src_identity = peer;
	frag_record(p, d, 1);
}

static __always_inline void set_identities(struct decision *d, const struct endpoint_info *ep,
					   __u32 peer)
{
	if (d->dir == DIR_EGRESS) {
		d->src_identity = ep->identity;
		d->dst_identity = peer;
	} else {
		d->src_identity = peer;
		d->dst_identity = ep->identity;
	}
}

/* handle_later_fragment gives a non-first fragment its first fragment's verdict, as long as
 * it comes from the same peer identity: a later fragment of an allowed datagram passes
 * without a new evaluation when it carries the same VNI identity and no ipcache change
 * came in between, else when its peer's identity (derived as for a new flow) is the one
 * the first fragment passed with. One datagram has one sender: a later fragment from
 * another identity (its address now another pod's, its pod relabelled) is dropped. */
static __noinline int handle_later_fragment(struct __sk_buff *skb, struct pkt *p,
						 struct decision *d,
						 const struct endpoint_info *ep)
{
	struct frag_key k;
	struct frag_value *v;
	struct peer_identity peer;

	frag_key_fill(&k, p, d->ep_id, d->dir);
	v = bpf_map_lookup_elem(&frags_peer, &k);
	if (v && v->allowed && v->tunnel_id == p->tunnel_id && v->ipcache_gen == p->ipcache_gen)
		return pass(); /* allowed datagram: no new evaluation, no event */

	/* Resolve the peer only now (arrived through the VXLAN overlay: the identity its VNI
	 * carried, as for its first fragment). */
	ipcache_resolve(d->dir == DIR_EGRESS ? p->t.daddr : p->t.saddr, &peer);
	if (d->dir == DIR_INGRESS)
		tunnel_source(skb, &peer, d);
	set_identities(d, ep, peer.identity);
	if (!v)
		/* Drop: first fragment never seen here (lost, reordered past it, or a crafted
		 * fragment that would bypass the port check). */
		return drop(skb, p, d, REASON_FRAGMENT_UNKNOWN);
	p->t.sport = v->sport;
	p->t.dport = v->dport;
	d->rule_id = v->rule_id;
	if (v->allowed) {
		if (peer.identity == v->peer_identity)
			return pass();
		/* Drop: the first fragment passed as another peer identity. */
		return drop(skb, p, d, REASON_PEER_IDENTITY_CHANGED);
	}
	/* Drop: the first fragment of this datagram was dropped. */
	return drop(skb, p, d, v->reason ? v->reason : REASON_POLICY_DENY);
}

/* sv_pair says whether the send-side verdict checks the L7 rules of TCP flow p (a pair of
 * local endpoints the agent listed in sv_pairs). */
static __always_inline int sv_pair(const struct pkt *p)
{
	struct sv_pair_key k = {.saddr = p->t.saddr, .daddr = p->t.daddr, .dport = p->t.dport};

	return p->t.proto == IPPROTO_TCP && bpf_map_lookup_elem(&sv_pairs, &k) != NULL;
}

/* sv_established checks a forward packet of a send-side verdict flow at the client's
 * egress: a segment that carries data must come from the client socket the verdict checks
 * (its cookie, recorded by sockops in sv_flows), so that a raw socket, or any socket the
 * verdict did not take, cannot send unchecked bytes on the connection. Segments without
 * data (ACKs, FIN, RST, some sent by the kernel for a closing socket) pass. */
static __noinline int sv_established(struct __sk_buff *skb, struct pkt *p, struct decision *d)
{
	struct sv_flow_key k = {.saddr = p->t.saddr, .daddr = p->t.daddr, .sport = p->t.sport, .dport = p->t.dport};
	__u8 ihl_byte, doff_byte;
	__u32 hlen;
	__u64 *cookie;

	if (p->frag != FRAG_NONE)
		goto unchecked; /* no data of such a flow in fragments */
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ihl_byte, 1))
		goto unchecked;
	hlen = (ihl_byte & 0xf) * 4;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + hlen + 12, &doff_byte, 1))
		goto unchecked;
	hlen += ETH_HLEN + (doff_byte >> 4) * 4;
	if (skb->len <= hlen)
		return pass();
	cookie = bpf_map_lookup_elem(&sv_flows, &k);
	if (cookie && *cookie && *cookie == bpf_get_socket_cookie(skb))
		return pass();
unchecked:
	/* Drop: data on a send-side verdict flow that the verdict did not see. */
	d->ev_flags |= FLOW_F_SEND_SIDE;
	return drop(skb, p, d, REASON_L7_UNCHECKED);
}

/* ep_admin says whether endpoint ep has Admin tier entries for direction dir. */
static __always_inline int ep_admin(const struct endpoint_info *ep, __u8 dir)
{
	return ep->flags & (dir == DIR_INGRESS ? EP_ADMIN_INGRESS : EP_ADMIN_EGRESS);
}

/* steer_established hands a packet of an already steered flow to its proxy socket:
 * forward packets of a client's connection to the proxy (CT_F_TO_PROXY, established at the
 * client's egress), and a server's replies to the proxy's upstream connection
 * (CT_F_FROM_PROXY, a reply at the server's egress). Returns -1 when the packet is not
 * such a packet, else the tc verdict. */
static __noinline int steer_established(struct __sk_buff *skb, struct pkt *p,
					     struct decision *d, int status, __u32 ct_flags)
{
	int to_proxy = status == CT_ESTABLISHED && (ct_flags & CT_F_TO_PROXY);
	int reply_to_proxy = status == CT_REPLY && (ct_flags & CT_F_FROM_PROXY);

	if (!to_proxy && !reply_to_proxy)
		return -1;
	if (to_proxy && (ct_flags & CT_F_DNS_PROXY)) {
		/* A DNS flow: every datagram (or segment) goes to the DNS proxy. */
		if (p->frag != FRAG_NONE) {
			d->reason = REASON_PROXY_UNAVAILABLE;
			if (p->frag == FRAG_FIRST)
				frag_record(p, d, 0);
			return drop(skb, p, d, REASON_PROXY_UNAVAILABLE);
		}
		if (dns_assign(skb, p, 1, ct_flags & CT_F_DNS_OBSERVE) < 0)
			return drop(skb, p, d, REASON_PROXY_UNAVAILABLE);
		count_proxy(d->ep_id, 1);
		return pass();
	}
	if (p->t.proto != IPPROTO_TCP || p->frag != FRAG_NONE) {
		/* Drop: only whole TCP segments can be handed to a socket (the later fragments
		 * of a datagram could not follow the first). */
		d->reason = REASON_PROXY_UNAVAILABLE;
		if (p->frag == FRAG_FIRST)
			frag_record(p, d, 0);
		return drop(skb, p, d, REASON_PROXY_UNAVAILABLE);
	}
	/* A retransmitted SYN of a steered connection may find no socket yet (the first
	 * one was lost): it may go to the listener again. */
	if (proxy_assign(skb, p, to_proxy) < 0)
		/* Drop: the proxy socket of this connection is gone (proxy stopped or
		 * restarted): the connection cannot continue unchecked. */
		return drop(skb, p, d, REASON_PROXY_UNAVAILABLE);
	count_proxy(d->ep_id, 1);
	return pass();
}

/* endpoint_of finds the endpoint of the interface a packet is on: its slot in
 * endpoint_slots, else the endpoints hash (see endpoint_slots). */
static __always_inline struct endpoint_info *endpoint_of(__u32 ifindex)
{
	__u32 slot = ifindex & (RAMPART_EP_SLOTS - 1);
	struct endpoint_slot *s;

	s = bpf_map_lookup_elem(&endpoint_slots, &slot);
	if (s && s->ifindex == ifindex && s->info.ep_id)
		return &s->info;
	return bpf_map_lookup_elem(&endpoints, &ifindex);
}

/* handle_spoofed drops a packet or ARP frame that leaves endpoint ep with a source address
 * that is not the endpoint's own (a raw socket, or a second address added inside the
 * endpoint's namespace). It is judged, counted and reported as what it is: a packet of
 * this endpoint (d carries its ep_id and identity as sender), never of the endpoint whose
 * address it claims. The destination's identity is resolved for the event only. Out of
 * line: rare. */
static __noinline int handle_spoofed(struct __sk_buff *skb, struct pkt *p, struct decision *d)
{
	struct peer_identity peer;

	ipcache_resolve(p->t.daddr, &peer);
	d->dst_identity = peer.identity;
	/* Drop: source address not the sending endpoint's. */
	return drop(skb, p, d, REASON_SPOOFED_SOURCE);
}

/* local_source_spoofed is judge_local_source's check of a packet the node received on
 * interface iif (not 0): a source with the host identity becomes world, and a local
 * endpoint's address must have come from that endpoint's interface. */
static __always_inline int local_source_spoofed(__u32 iif, struct peer_identity *peer, __u32 *sender)
{
	struct endpoint_info *from;

	if (peer->identity == ID_HOST) {
		/* The address's CIDR identities stay: ipBlock and CIDR rules select addresses. */
		peer->identity = ID_WORLD;
		return 0;
	}
	if (!peer->ep_id)
		return 0;
	from = endpoint_of(iif);
	if (from && from->ep_id == peer->ep_id)
		return 0;
	*sender = from ? from->identity : ID_WORLD;
	return 1;
}

/* judge_local_source checks, for a new flow entering an endpoint, the peer identity that
 * the ipcache gave the packet's source address, against where the packet came from
 * (skb->ingress_ifindex: the interface the node received it on; 0 for a packet the node
 * itself sent, such as the host's own connections and the L7 proxy's upstream ones).
 *
 * Anti-spoofing at the sender's veth (handle) already makes the address of every packet
 * that enters the node from a local endpoint's interface that endpoint's own, so for those
 * the address lookup is the truth. This is the defence in depth for packets that did not
 * come from a local endpoint's interface at all, e.g. from the node's uplink:
 *   - a source that is a local endpoint's address must have been received on that
 *     endpoint's interface (or sent by the node): otherwise the packet claims an identity
 *     it cannot have, and is dropped (REASON_SPOOFED_SOURCE; the event names the sender's
 *     endpoint identity when it came from another endpoint's interface, else world);
 *   - a source with the host identity (the router address) received on any interface is
 *     not the host, which only sends from the node itself: it is judged as world, so that
 *     what the host may do (--host-traffic) never applies to it (e.g. traffic from outside
 *     that a NAT rule rewrote to the router address).
 * Used for new flows and for established flows checked again after a policy change
 * (recheck_established), so a flow is judged as the same peer both times.
 * Returns 1 when the packet must be dropped (*sender: the identity to report as source).
 *
 * A packet that a monitor sent back (tap.h) was received on the monitor's return interface:
 * when it belongs to a flow the dataplane diverted, it is judged with the source identity
 * it had when diverted (tap_returned_source), else as any other packet.
 *
 * Why the interface and not a mark carrying the sender's identity (as Cilium does): the
 * interface index is set by the kernel and cannot be forged, costs nothing on the sender's
 * path, and leaves skb->mark to the L7 proxy (proxy.h) and to the node's routing rules. */
static __always_inline int judge_local_source(struct __sk_buff *skb, const struct pkt *p,
					      struct decision *d, struct peer_identity *peer,
					      __u32 *sender)
{
	__u32 iif = skb->ingress_ifindex;

	if (!iif)
		return 0; /* sent by the node itself */
	if (tap_returned_source(skb, p, peer)) {
		/* Back from a monitor: the identity it was diverted with; its event says it
		 * was tapped. */
		d->ev_flags |= FLOW_F_TAPPED;
		return 0;
	}
	return local_source_spoofed(iif, peer, sender);
}

/* outside_cluster says whether a resolved address is outside the cluster: world, or a CIDR
 * identity of it (identity.FirstCIDR and above), and no endpoint's. */
static __always_inline int outside_cluster(const struct peer_identity *peer)
{
	return !peer->ep_id && (peer->identity == ID_WORLD ||
				(peer->identity >= ID_FIRST_CIDR && peer->identity < ID_CIDR_SET_FIRST));
}

/* related_from_node says whether an ICMP error that quotes a packet of a live flow of the
 * endpoint, but does not travel between the flow's two ends (conntrack.h, ct_related),
 * comes from a node: the routers on the paths of the node's endpoints. That is this node
 * (the host identity, sent by the node itself as judge_local_source has it; e.g.
 * fragmentation needed for the overlay's MTU) or another node (remote-node: by address,
 * or through the overlay), or, for a flow whose peer is outside the cluster, an address
 * outside it too (a router on the way out); and the error must enter the endpoint,
 * addressed to the flow's own side. Such an error passes as related. Anything else
 * (another endpoint, a world address reporting on a flow inside the cluster, an endpoint sending an error about its own flow to a third party) is what it
 * looks like, a packet from its sender to its destination, and the caller judges it by
 * policy as such (handle_new: dropped with policy's reason when policy does not allow
 * it), so that a pod denied by policy cannot end, or feed bytes to, another pod's flow by
 * quoting it. Out of line: rare. */
static __noinline int related_from_node(struct __sk_buff *skb, const struct pkt *p,
					struct decision *d)
{
	struct peer_identity peer;
	__u32 sender = 0;

	if (d->dir != DIR_INGRESS || p->t.daddr != p->inner.saddr)
		return 0;
	ipcache_resolve(p->t.saddr, &peer);
	if (judge_local_source(skb, p, d, &peer, &sender))
		return 0;
	tunnel_source(skb, &peer, d);
	if (peer.identity == ID_HOST || peer.identity == ID_REMOTE_NODE)
		return 1;
	/* A router beyond the node (path MTU, TTL exceeded on the way out): an address outside
	 * the cluster may report on a flow whose peer is outside the cluster too, as any
	 * stateful firewall admits related errors. No endpoint can send from such an address
	 * (anti-spoofing at its veth, the tunnels' source checks), so no pod gets through. */
	if (!outside_cluster(&peer))
		return 0;
	ipcache_resolve(p->inner.daddr, &peer);
	return outside_cluster(&peer);
}

/* host_traffic says whether a parsed packet on a host device (an EP_HOST interface) is the
 * node's own traffic, for host policy: IPv4 to a host address (tc ingress) or from one (tc
 * egress). Forwarded packets (to and from pods, which their own veths judge) and ARP are
 * not; nor is the overlay between nodes (VXLAN, IP-in-IP from and to a known node's
 * address), which host policy must never cut. IPv6 takes its own path (handle_host,
 * host_traffic6). */
static __noinline int host_traffic(const struct pkt *p, __u32 dir, int parsed)
{
	struct peer_identity own, peer;

	if (parsed != PARSE_IPV4)
		return 0;
	ipcache_resolve(dir == DIR_INGRESS ? p->t.daddr : p->t.saddr, &own);
	if (own.identity != ID_HOST)
		return 0;
	ipcache_resolve(dir == DIR_INGRESS ? p->t.saddr : p->t.daddr, &peer);
	if (peer.identity == ID_REMOTE_NODE &&
	    (p->t.proto == IPPROTO_IPIP || (p->t.proto == IPPROTO_UDP && p->t.dport == bpf_htons(VXLAN_PORT))))
		return 0;
	return 1;
}

/* host_safe_verdict is the verdict of a flow host_safe admits: allow, HOST_SAFE_RULE_ID. */
static __always_inline void host_safe_verdict(struct verdict *res)
{
	res->action = POLICY_ALLOW;
	res->proxy = 0;
	res->prec = 0;
	res->rule_id = HOST_SAFE_RULE_ID;
	res->identity = 0;
}

/* host_safe_flow says whether a new flow of the host endpoint is one host policy never
 * cuts: to or from a host_safe peer and port (the API server). If so, *res is the allow
 * verdict with HOST_SAFE_RULE_ID. */
static __noinline int host_safe_flow(const struct pkt *p, __u32 dir, struct verdict *res)
{
	struct host_safe_key k = {
		.addr = dir == DIR_EGRESS ? p->t.daddr : p->t.saddr,
		.port = dir == DIR_EGRESS ? p->t.dport : p->t.sport,
		.proto = p->t.proto,
	};

	if (!bpf_map_lookup_elem(&host_safe, &k))
		return 0;
	host_safe_verdict(res);
	return 1;
}

/* host_refuses judges the node's side of a flow between an endpoint (peer: its identity)
 * and the node for host_guard and host_guard6: the host's direction is the opposite of
 * the endpoint's dir. Returns the drop reason (and fills *d as the host's decision), or 0
 * when the host's policy lets the flow be. */
static __always_inline __u8 host_refuses(const struct endpoint_info *host, __u32 dir,
					 const struct peer_identity *peer, __u8 proto, __be16 port,
					 __u32 established, struct decision *d)
{
	__u8 hdir = dir == DIR_EGRESS ? DIR_INGRESS : DIR_EGRESS;
	struct verdict res = {};

	policy_decide(HOST_EP_ID, hdir, host->flags & (hdir == DIR_INGRESS ? EP_ADMIN_INGRESS : EP_ADMIN_EGRESS),
		      peer, proto, port, &res);
	if (res.action != POLICY_DENY &&
	    (established || res.action == POLICY_ALLOW ||
	     !(host->flags & (hdir == DIR_INGRESS ? EP_ENFORCE_INGRESS : EP_ENFORCE_EGRESS))))
		return 0;
	__builtin_memset(d, 0, sizeof(*d));
	d->ep_id = HOST_EP_ID;
	d->src_identity = hdir == DIR_INGRESS ? peer->identity : ID_HOST;
	d->dst_identity = hdir == DIR_INGRESS ? ID_HOST : peer->identity;
	d->rule_id = res.rule_id;
	d->match_identity = res.identity;
	d->dir = hdir;
	return res.action == POLICY_DENY ? REASON_POLICY_DENY : REASON_POLICY_DEFAULT_DENY;
}

/* host_guarding is the host endpoint when host policy has a say in a packet of an endpoint
 * with flags, in direction dir: the node has host policy, the endpoint is not the host, and
 * the packet is not one entering the endpoint from an interface (the node's own are sent
 * by the node). NULL otherwise. */
static __always_inline struct endpoint_info *host_guarding(struct __sk_buff *skb, __u32 dir,
							   __u32 flags)
{
	__u32 host_id = HOST_EP_ID;

	if (flags & EP_HOST)
		return NULL;
	if (dir == DIR_INGRESS && skb->ingress_ifindex)
		return NULL; /* from an interface: not the node's own packet */
	return bpf_map_lookup_elem(&endpoints_by_id, &host_id); /* NULL: no host policy */
}

/* host_guard judges, for a new flow of an endpoint, the node's side of it when the other
 * side is the node itself and a host endpoint exists: a flow from the endpoint to a host
 * address against the host's ingress policy, a flow the node sends to the endpoint (no
 * ingress interface: the node's own) against the host's egress policy. The endpoint's own
 * verdict is its own programs' as always. For an established flow (established: its
 * check word changed, recheck_established) only a deny entry drops, as for the endpoint's
 * own policy. Returns TC_ACT_SHOT after reporting a drop as the host's, 0 otherwise. Out
 * of line and called from the program's body, not from handle_new: its stack must not add
 * to handle_new's call chain. */
static __noinline int host_guard(struct __sk_buff *skb, struct pkt *p, __u32 dir, __u32 flags,
				 __u32 established)
{
	struct endpoint_info *host = host_guarding(skb, dir, flags);
	struct peer_identity hostside, peer;
	struct decision d;
	__u8 reason;

	if (!host)
		return 0;
	ipcache_resolve(dir == DIR_EGRESS ? p->t.daddr : p->t.saddr, &hostside);
	if (hostside.identity != ID_HOST)
		return 0;
	/* The host's direction is the opposite of the endpoint's; its peer is the endpoint. */
	ipcache_resolve(dir == DIR_EGRESS ? p->t.saddr : p->t.daddr, &peer);
	reason = host_refuses(host, dir, &peer, p->t.proto, p->policy_port, established, &d);
	if (reason) {
		/* Drop: the node's own policy refuses the flow; reported as the host's. */
		if (p->frag == FRAG_FIRST)
			frag_record(p, &d, 0);
		return drop(skb, p, &d, reason);
	}
	return 0;
}

/* recheck_drop drops a packet of an established flow that recheck_established refused with
 * verdict res. */
static __always_inline int recheck_drop(struct __sk_buff *skb, struct pkt *p, struct decision *d,
					const struct verdict *res, __u8 reason)
{
	d->rule_id = res->rule_id;
	d->match_identity = res->identity;
	d->reason = reason;
	if (p->frag == FRAG_FIRST)
		frag_record(p, d, 0);
	return drop(skb, p, d, reason);
}

/* recheck_established applies a change to an established flow: its conntrack entry v was
 * last checked with another check word than the packet's (conntrack.h): the endpoint's
 * policy changed, an ipcache change may have given the peer's address another identity, or
 * the packet's VNI carries another identity. The packet's peer identity is derived as for a
 * new flow (peer and res are scratch space of the caller) and its policy evaluated in the
 * packet's direction.
 *
 * The same peer identity as the entry's (a policy change):
 *   - deny: dropped (REASON_POLICY_DENY): a deny rule ends live flows too;
 *   - redirect while the flow does not go through the proxy (egress: not steered to it;
 *     ingress: not the proxy's upstream connection): dropped (REASON_PROXY_BYPASS), since
 *     an L7 rule must not be bypassed by a connection opened before it; the client's
 *     connection stalls, and the connection it opens instead is steered;
 *   - anything else (allow; redirect of a proxied flow; nothing, that is an allow removed
 *     without a deny, which stops only new flows, as in Cilium): the packet goes on.
 * Another peer identity (the principle that an endpoint never speaks with another's
 * identity: the flow was admitted for its old one) is judged as a new flow would be:
 *   - deny, or nothing while the endpoint enforces the direction: dropped
 *     (REASON_PEER_IDENTITY_CHANGED);
 *   - redirect: as above when the flow does not pass the proxy (REASON_PROXY_BYPASS);
 *     dropped too when it does (REASON_PEER_IDENTITY_CHANGED): the proxy, or the send-side
 *     verdict, took the connection's L7 decisions for the old identity;
 *   - allow, or nothing in an unenforced direction: the packet goes on.
 * A packet that goes on updates the entry to its check word and peer identity (so the flow
 * cache may serve the flow again). A dropped flow's entry keeps its old ones, so each of
 * its later packets is checked (and dropped) again. Only established packets are checked:
 * replies and related ICMP errors follow their flow, whose own packets are checked.
 * Returns -1 to go on, else the tc verdict. */
__noinline int recheck_established(struct __sk_buff *skb, struct pkt *p __arg_nonnull,
				   struct decision *d __arg_nonnull,
				   const struct endpoint_info *ep __arg_nonnull,
				   struct ct_value *v __arg_nonnull)
{
	__u32 via_proxy = v->flags & (CT_F_SOCKVERDICT | (d->dir == DIR_EGRESS ? CT_F_TO_PROXY : CT_F_FROM_PROXY));
	__u32 enforce = d->dir == DIR_INGRESS ? EP_ENFORCE_INGRESS : EP_ENFORCE_EGRESS;
	struct peer_identity peer;
	struct verdict res;
	__u32 sender = 0;
	int changed;

	ipcache_resolve(d->dir == DIR_EGRESS ? p->t.daddr : p->t.saddr, &peer);
	if (d->dir == DIR_INGRESS && judge_local_source(skb, p, d, &peer, &sender)) {
		/* Drop: a local endpoint's address that did not come from its interface. */
		set_identities(d, ep, sender);
		if (p->frag == FRAG_FIRST)
			frag_record(p, d, 0);
		return drop(skb, p, d, REASON_SPOOFED_SOURCE);
	}
	if (d->dir == DIR_INGRESS)
		tunnel_source(skb, &peer, d);
	set_identities(d, ep, peer.identity);
	/* ID_UNKNOWN: an entry of an earlier version, which recorded none: it takes this one. */
	changed = v->peer_identity != ID_UNKNOWN && v->peer_identity != peer.identity;
	policy_decide(d->ep_id, d->dir, ep_admin(ep, d->dir), &peer, p->t.proto, p->policy_port, &res);
	if (res.action == POLICY_DENY)
		/* Drop: a deny entry now matches this established flow. */
		return recheck_drop(skb, p, d, &res,
				    changed ? REASON_PEER_IDENTITY_CHANGED : REASON_POLICY_DENY);
	if (res.action == POLICY_REDIRECT && (!via_proxy || changed)) {
		/* Drop: L7 rules now apply to this flow, which does not pass the proxy, or
		 * whose L7 decisions were taken for another peer identity. */
		d->ev_flags |= d->dir == DIR_EGRESS ? FLOW_F_L7_EGRESS : FLOW_F_L7_INGRESS;
		return recheck_drop(skb, p, d, &res,
				    via_proxy ? REASON_PEER_IDENTITY_CHANGED : REASON_PROXY_BYPASS);
	}
	if (changed && res.action != POLICY_ALLOW && res.action != POLICY_REDIRECT &&
	    (ep->flags & enforce))
		/* Drop: nothing allows the flow's new peer identity. */
		return recheck_drop(skb, p, d, &res, REASON_PEER_IDENTITY_CHANGED);
	v->peer_identity = peer.identity;
	ct_set_checked(v, ct_check_word(ct_check_revision(ep, p), p));
	return -1;
}

/* dest_ingress evaluates, at the sender's veth, the ingress policy of the local endpoint
 * dst (the packet's destination) for a new TCP flow, as that endpoint's rampart_to_ep
 * would: peer is the source address's ipcache identity. *enforced says whether dst
 * enforces ingress (also when its info is missing: fail closed). */
static __always_inline void dest_ingress(const struct pkt *p, __u32 dst_ep_id,
					 struct peer_identity *src, struct verdict *res,
					 int *enforced)
{
	struct endpoint_info *dst = bpf_map_lookup_elem(&endpoints_by_id, &dst_ep_id);

	*enforced = !dst || (dst->flags & EP_ENFORCE_INGRESS);
	ipcache_resolve(p->t.saddr, src);
	policy_decide(dst_ep_id, DIR_INGRESS, dst && (dst->flags & EP_ADMIN_INGRESS), src, p->t.proto,
		      p->policy_port, res);
}

/* dest_drop_decision fills dd as the decision of the destination peer's ingress verdict
 * dres for a flow from src that the sender's veth judged for it (d: the sender's decision,
 * whose event flags it keeps), and returns its drop reason: reported as the destination's
 * ingress drop. */
static __always_inline __u8 dest_drop_decision(struct decision *dd, const struct decision *d,
					       const struct peer_identity *peer,
					       const struct peer_identity *src, const struct verdict *dres)
{
	__builtin_memset(dd, 0, sizeof(*dd));
	dd->ep_id = peer->ep_id;
	dd->src_identity = src->identity;
	dd->dst_identity = peer->identity;
	dd->rule_id = dres->rule_id;
	dd->match_identity = dres->identity;
	dd->dir = DIR_INGRESS;
	dd->ev_flags = d->ev_flags;
	return dres->action == POLICY_DENY ? REASON_POLICY_DENY : REASON_POLICY_DEFAULT_DENY;
}

/* RET_STEER_DNS: what handle_new returns for a new flow that a DNS redirect entry of the
 * endpoint's egress policy allows, or (FLOW_F_DNS_OBSERVE set in the decision) a DNS query
 * of an EP_DNS_OBSERVE endpoint that policy allows; the caller finishes it with
 * new_dns_flow. Not a tc verdict. Finishing it in handle_new would put the server's ingress check and the proxy
 * lookup on handle_new's stack, past the verifier's limit for the longest call chain. */
#define RET_STEER_DNS 0x7ff0

/* new_dns_flow finishes a new DNS flow (RET_STEER_DNS): the DNS proxy asks the server
 * from the node's own address, so the server's ingress verdict for the client is taken
 * here when the server is a local endpoint (deny or default deny there drops the query, as
 * the server's veth would; an L7 redirect there is not the DNS proxy's to honour, and the
 * server's veth drops the proxy's query as a bypass). Then the flow is recorded and its
 * first packet handed to the DNS proxy; steer_established hands over every later one. */
static __noinline int new_dns_flow(struct __sk_buff *skb, struct pkt *p, struct decision *d,
				   const struct endpoint_info *ep, __u64 now)
{
	struct peer_identity peer, src;
	struct verdict dres = {};
	int enforced = 1;
	int observe;

	if (p->frag != FRAG_NONE) {
		/* Drop: the later fragments of a datagram could not follow its first to the
		 * proxy's socket; the query cannot be checked, so it does not go out. */
		d->reason = REASON_PROXY_UNAVAILABLE;
		if (p->frag == FRAG_FIRST)
			frag_record(p, d, 0);
		return drop(skb, p, d, REASON_PROXY_UNAVAILABLE);
	}
	ipcache_resolve(p->t.daddr, &peer);
	if (peer.ep_id) {
		dest_ingress(p, peer.ep_id, &src, &dres, &enforced);
		if (dres.action == POLICY_DENY || (dres.action == 0 && enforced)) {
			struct decision dd;
			__u8 reason = dest_drop_decision(&dd, d, &peer, &src, &dres);

			return drop(skb, p, &dd, reason);
		}
	}
	observe = d->ev_flags & FLOW_F_DNS_OBSERVE;
	ct_create(p, d, CT_F_TO_PROXY | CT_F_DNS_PROXY | (observe ? CT_F_DNS_OBSERVE : 0), ct_check_revision(ep, p), now);
	if (dns_assign(skb, p, 1, observe) < 0)
		/* Drop: no DNS proxy socket (not running, not configured): the query cannot be
		 * checked, so it does not go out. */
		return drop(skb, p, d, REASON_PROXY_UNAVAILABLE);
	count_proxy(d->ep_id, 1);
	emit_event(skb, p, d, EVENT_NEW, VERDICT_REDIRECTED);
	return pass();
}

/* new_egress finishes a new flow leaving the endpoint that its own egress policy
 * allowed (res: ALLOW, REDIRECT, or nothing with egress unenforced). It decides whether
 * the flow goes through the proxy: when the egress verdict is REDIRECT, or when the
 * destination is a local endpoint whose ingress verdict is REDIRECT. A steered flow must
 * also be allowed by the destination's ingress policy, checked here because the proxy
 * would otherwise accept a connection that the destination refuses. Flows that are not
 * steered continue unchanged (the destination's rampart_to_ep decides as always). */
static __always_inline int new_egress(struct __sk_buff *skb, struct pkt *p, struct decision *d,
				      const struct peer_identity *peer, const struct verdict *res,
				      __u32 revision, __u64 now)
{
	struct peer_identity src;
	struct verdict dres = {};
	int steer = res->action == POLICY_REDIRECT;
	int enforced = 1;

	if (steer)
		d->ev_flags |= FLOW_F_L7_EGRESS;
	if (p->t.proto == IPPROTO_TCP && peer->ep_id) {
		dest_ingress(p, peer->ep_id, &src, &dres, &enforced);
		if (dres.action == POLICY_REDIRECT) {
			d->ev_flags |= FLOW_F_L7_INGRESS;
			if (!steer) {
				d->rule_id = dres.rule_id;
				d->match_identity = dres.identity;
			}
			steer = 1;
		}
	}
	if (!steer) {
		ct_create(p, d, 0, revision, now);
		if (p->frag == FRAG_FIRST)
			frag_record(p, d, 1);
		emit_event(skb, p, d, EVENT_NEW, VERDICT_FORWARDED);
		return pass();
	}

	if (peer->ep_id && p->t.proto == IPPROTO_TCP &&
	    (dres.action == POLICY_DENY || (dres.action == 0 && enforced))) {
		/* Drop: the destination's ingress policy refuses the flow (the same verdict its
		 * own veth would give); reported as the destination's ingress drop. */
		struct decision dd;

		d->reason = dest_drop_decision(&dd, d, peer, &src, &dres);
		if (p->frag == FRAG_FIRST)
			frag_record(p, d, 0);
		return drop(skb, p, &dd, d->reason);
	}
	if (p->t.proto != IPPROTO_TCP || p->frag != FRAG_NONE) {
		/* Drop: the proxy only takes whole TCP segments; a redirect entry for another
		 * protocol cannot be honoured, and unchecked is not an option. */
		d->reason = REASON_PROXY_UNAVAILABLE;
		if (p->frag == FRAG_FIRST)
			frag_record(p, d, 0);
		return drop(skb, p, d, REASON_PROXY_UNAVAILABLE);
	}
	if (peer->ep_id && sv_pair(p)) {
		/* Both ends are local and the send-side verdict checks this pair's requests on
		 * the client's socket: no proxy hop (sv_established pins the data to it). */
		d->ev_flags |= FLOW_F_SEND_SIDE;
		ct_create(p, d, CT_F_SOCKVERDICT, revision, now);
		emit_event(skb, p, d, EVENT_NEW, VERDICT_FORWARDED);
		return pass();
	}
	if (proxy_assign(skb, p, 1) < 0)
		/* Drop: no proxy listener (not running, not configured) or no socket for this
		 * packet: L7 policy cannot be checked, so the connection is refused. */
		return drop(skb, p, d, REASON_PROXY_UNAVAILABLE);
	ct_create(p, d, CT_F_TO_PROXY, revision, now);
	count_proxy(d->ep_id, 1);
	emit_event(skb, p, d, EVENT_NEW, VERDICT_REDIRECTED);
	return pass();
}

/* new_ingress finishes a new flow entering the endpoint that its ingress policy did not
 * refuse. A REDIRECT verdict admits only the proxy's upstream connection (the proxy has
 * applied the L7 rules); the server's replies to it will be steered back to the proxy. */
static __always_inline int new_ingress(struct __sk_buff *skb, struct pkt *p, struct decision *d,
				       const struct verdict *res, int proxied, __u32 revision,
				       __u64 now)
{
	__u32 ct_flags = 0;

	if (res->action == POLICY_REDIRECT) {
		d->ev_flags |= FLOW_F_L7_INGRESS;
		if (!proxied && p->frag == FRAG_NONE && sv_pair(p)) {
			/* Checked by the send-side verdict at the client, whose veth let it
			 * through for that reason (a pair of local endpoints). */
			d->ev_flags |= FLOW_F_SEND_SIDE;
			ct_create(p, d, CT_F_SOCKVERDICT, revision, now);
			emit_event(skb, p, d, EVENT_NEW, VERDICT_FORWARDED);
			return pass();
		}
		if (!proxied || p->t.proto != IPPROTO_TCP) {
			/* Drop: L7 rules apply to this flow but it did not pass the proxy (a
			 * sender whose veth does not steer, such as the host). Never allowed
			 * unchecked. */
			d->reason = REASON_PROXY_BYPASS;
			if (p->frag == FRAG_FIRST)
				frag_record(p, d, 0);
			return drop(skb, p, d, REASON_PROXY_BYPASS);
		}
	}
	if (proxied) {
		/* The proxy's upstream connection (for this endpoint's ingress rules or the
		 * client's egress rules): its replies must go back to the proxy's socket. */
		d->ev_flags |= FLOW_F_FROM_PROXY;
		ct_flags = CT_F_FROM_PROXY;
		count_proxy(d->ep_id, 0);
	}
	ct_create(p, d, ct_flags, revision, now);
	if (p->frag == FRAG_FIRST)
		frag_record(p, d, 1);
	emit_event(skb, p, d, EVENT_NEW, VERDICT_FORWARDED);
	return pass();
}

/* handle_new evaluates a new flow against the endpoint's policy in direction d->dir:
 * identities, policy, verdict, conntrack entry and event. Out of line: the packets of
 * established flows, nearly all packets, never get here (see likely). */
__noinline int handle_new(struct __sk_buff *skb, struct pkt *p __arg_nonnull,
			  struct decision *d __arg_nonnull, const struct endpoint_info *ep __arg_nonnull,
			  __u64 now)
{
	struct peer_identity peer;
	struct verdict res;
	__u8 dir = d->dir;

	ipcache_resolve(dir == DIR_EGRESS ? p->t.daddr : p->t.saddr, &peer);
	if (dir == DIR_INGRESS) {
		__u32 sender = 0;

		if (judge_local_source(skb, p, d, &peer, &sender)) {
			/* Drop: a local endpoint's address that did not come from its interface. */
			set_identities(d, ep, sender);
			if (p->frag == FRAG_FIRST)
				frag_record(p, d, 0);
			return drop(skb, p, d, REASON_SPOOFED_SOURCE);
		}
		tunnel_source(skb, &peer, d);
	}
	set_identities(d, ep, peer.identity);
	if (dir == DIR_INGRESS && (ep->flags & EP_MONITOR) && skb->ingress_ifindex)
		/* Drop: a monitor endpoint is not a destination (only the node itself may open
		 * a flow to it); it sees traffic through taps only. */
		return drop(skb, p, d, REASON_TAP_MONITOR_DESTINATION);
	if (unlikely(ep->flags & (dir == DIR_EGRESS ? EP_TAP_EGRESS : EP_TAP_INGRESS)) &&
	    tap_find(d->ep_id, p, dir) >= 0)
		d->ev_flags |= FLOW_F_TAPPED; /* its event says so; tap_apply acts after the verdict */
	if (!(unlikely(ep->flags & EP_HOST) && host_safe_flow(p, dir, &res)))
		policy_decide(d->ep_id, dir, ep_admin(ep, dir), &peer, p->t.proto, p->policy_port, &res);
	d->rule_id = res.rule_id;
	d->match_identity = res.identity;

	if (res.action == POLICY_DENY) {
		/* Drop: a deny entry matches (deny wins over any allow). */
		d->reason = REASON_POLICY_DENY;
		if (p->frag == FRAG_FIRST)
			frag_record(p, d, 0);
		return drop(skb, p, d, REASON_POLICY_DENY);
	}
	if (res.action != POLICY_ALLOW && res.action != POLICY_REDIRECT &&
	    (ep->flags & (dir == DIR_INGRESS ? EP_ENFORCE_INGRESS : EP_ENFORCE_EGRESS))) {
		/* Drop: the endpoint enforces this direction and nothing allows the flow. */
		d->reason = REASON_POLICY_DEFAULT_DENY;
		if (p->frag == FRAG_FIRST)
			frag_record(p, d, 0);
		return drop(skb, p, d, REASON_POLICY_DEFAULT_DENY);
	}
	audit_new(d, ep, dir, &peer, p->t.proto, p->policy_port);

	if (dir == DIR_EGRESS && res.action == POLICY_REDIRECT && res.proxy == PROXY_KIND_DNS) {
		d->ev_flags |= FLOW_F_L7_EGRESS;
		return RET_STEER_DNS;
	}
	if (dir == DIR_EGRESS && (ep->flags & EP_DNS_OBSERVE) && res.action != POLICY_REDIRECT &&
	    (p->t.proto == IPPROTO_UDP || p->t.proto == IPPROTO_TCP) && p->t.dport == bpf_htons(DNS_PORT)) {
		/* Allowed (the deny and default deny drops are above): the proxy forwards it
		 * and learns the answer. */
		d->ev_flags |= FLOW_F_DNS_OBSERVE;
		return RET_STEER_DNS;
	}
	if (dir == DIR_EGRESS)
		return new_egress(skb, p, d, &peer, &res, ct_check_revision(ep, p), now);
	return new_ingress(skb, p, d, &res, from_proxy(skb), ct_check_revision(ep, p), now);
}

/* handle_unparsed decides a frame that is not a whole IPv4 packet (parse_packet's result
 * ret): ARP passes unless an endpoint sends it with another sender address than its own,
 * everything else drops. */
static __noinline int handle_unparsed(struct __sk_buff *skb, struct pkt *p, struct decision *d,
				      const struct endpoint_info *ep, int ret)
{
	switch (ret) {
	case PARSE_ARP:
		/* ARP is needed for any IPv4 traffic on the veth and carries no policy. From the
		 * endpoint, its sender address must be the endpoint's own: a forged one would
		 * claim another endpoint's (or the router's) address in the node's neighbour
		 * table. An RFC 5227 probe (request, sender 0.0.0.0) passes: it claims no
		 * address, receivers must not learn from it (Linux does not), and it is how a
		 * DHCP client or arping -D checks that an address is free; the answer only tells
		 * the endpoint what the node's ARP would anyway. */
		if (d->dir == DIR_EGRESS && p->t.saddr != ep->addr &&
		    !(p->t.saddr == 0 && p->arp_op == ARP_OP_REQUEST)) {
			/* Drop: ARP sender address not the endpoint's (handle_spoofed). */
			d->ev_flags |= FLOW_F_ARP;
			p->icmp_type = p->arp_op; /* the event's icmp_type holds the ARP opcode */
			return handle_spoofed(skb, p, d);
		}
		return pass();
	case PARSE_IPV6:
		/* Drop: an IPv6 frame the IPv6 path did not take (rampart_from_ep6,
		 * rampart_to_ep6): its skb->protocol said otherwise, or the tail call failed.
		 * Unenforced means not allowed. */
		return drop(skb, p, d, REASON_UNSUPPORTED_L3);
	case PARSE_OTHER_L3:
		/* Drop: an ethertype other than IPv4/ARP/IPv6 (VLAN, MPLS, ...), no policy for it. */
		return drop(skb, p, d, REASON_UNSUPPORTED_L3);
	default:
		/* Drop: truncated or invalid Ethernet/IPv4/L4 header (see parse.h). */
		return drop(skb, p, d, REASON_MALFORMED);
	}
}

/* handle_related_foreign passes an ICMP error that quotes a live flow from a third
 * address when related_from_node admits it (what the established path does with a
 * related error: nothing to steer, no flow cache entry), and otherwise judges it by
 * policy as a packet from its sender (handle_new). Out of line and a tail of the policy
 * path, so that nothing of the inline path stays live across it: the inline path's stack
 * is what the deepest call chain (through handle_new and the taps) adds up to. */
static __noinline int handle_related_foreign(struct __sk_buff *skb, struct pkt *p,
					     struct decision *d, const struct endpoint_info *ep,
					     __u64 now)
{
	if (!related_from_node(skb, p, d))
		return handle_new(skb, p, d, ep, now);
	if (unlikely(p->frag == FRAG_FIRST))
		frag_record_established(p, d, 0);
	return pass();
}

/* handle_unknown_endpoint drops a packet on an interface the agent does not (or no
 * longer) know, e.g. between endpoint removal and detach: fail closed. p is the packet as
 * far as it parsed, for the event. Out of line: rare. */
static __noinline int handle_unknown_endpoint(struct __sk_buff *skb, struct pkt *p,
					       struct decision *d)
{
	return drop(skb, p, d, REASON_UNKNOWN_ENDPOINT);
}

/* handle_policy is the policy path. Its inline part is what a packet of an established flow
 * needs (parse, flow cache, endpoint, conntrack); everything else is out of line. *tapped
 * is set to the endpoint when it is an IPv4 packet of an endpoint with tap rules in its
 * direction (handle runs them after the verdict). */
static __always_inline int handle_policy(struct __sk_buff *skb, __u8 dir, struct pkt *pp,
					 struct endpoint_info **tapped)
{
	struct decision d = { .dir = dir };
	struct flow_cache_entry want, *fc = 0;
	struct endpoint_info *ep;
	struct ct_value *entry = 0;
	__u32 ifindex = skb->ifindex;
	__u32 ct_flags, check;
	__u64 now, fc_w0 = 1;
	int ret, status;

	/* Parsed first: the flow cache slot's address depends only on the packet, so its
	 * load goes out before the endpoint slot's and the two misses overlap. */
	ret = parse_packet(skb, pp);
	/* Read before any ipcache lookup of this packet (see struct pkt). */
	pp->ipcache_gen = ipcache_generation();
	if (likely(ret == PARSE_IPV4)) {
		if (dir == DIR_INGRESS)
			pp->tunnel_id = tunnel_id_of(skb);
		flow_cache_want(&want, pp, ifindex, dir);
		fc = flow_cache_slot_of(&want);
		if (likely(fc))
			fc_w0 = FC_READ(*(__u64 *)fc);
	}
	ep = endpoint_of(ifindex);
	if (unlikely(!ep))
		/* Drop: no endpoint on this interface (see handle_unknown_endpoint). */
		return handle_unknown_endpoint(skb, pp, &d);
	if (unlikely(ep->flags & EP_HOST) && !host_traffic(pp, dir, ret))
		/* Not the node's own traffic: the next program on the device (the IP-in-IP
		 * overlay's) or the kernel has it. */
		return TC_ACT_UNSPEC;
	d.ep_id = ep->ep_id;
	d.src_identity = dir == DIR_EGRESS ? ep->identity : 0;
	d.dst_identity = dir == DIR_INGRESS ? ep->identity : 0;

	if (unlikely(ret != PARSE_IPV4))
		return handle_unparsed(skb, pp, &d, ep, ret);
	if (unlikely(ep->flags & (dir == DIR_EGRESS ? EP_TAP_EGRESS : EP_TAP_INGRESS)))
		*tapped = ep;
	/* Anti-spoofing: a packet leaving the endpoint must carry the endpoint's own address
	 * as source, whatever flow it seems to belong to, so it is checked before the flow
	 * cache and conntrack (a forged packet matching an established flow gets no pass).
	 * One compare with the endpoint info loaded above. Only the sending side checks: a
	 * packet that got past it is the endpoint's, so the destination's identity lookup of
	 * a local source address is truthful (see judge_local_source for everything else). */
	if (dir == DIR_EGRESS && unlikely(pp->t.saddr != ep->addr) && !(ep->flags & EP_HOST))
		return handle_spoofed(skb, pp, &d);
	if (unlikely(pp->frag == FRAG_LATER))
		return handle_later_fragment(skb, pp, &d, ep);

	/* Conntrack times only need to be good to a tick against timeouts of seconds: the
	 * tick counter is one load (inlined), where even the coarse clock is a helper call. */
	now = bpf_jiffies64();
	check = ct_check_revision(ep, pp);
	if (likely(fc) && flow_cache_eligible(pp) &&
	    flow_cache_hit(fc, fc_w0, &want, check, now))
		goto established;
	status = ct_lookup(pp, d.ep_id, dir, now, &ct_flags, &entry);
	if (unlikely(status == CT_RELATED_FOREIGN))
		return handle_related_foreign(skb, pp, &d, ep, now);
	if (unlikely(status == CT_NEW)) {
		if (unlikely(host_guard(skb, pp, dir, ep->flags, 0)))
			return TC_ACT_SHOT;
		ret = handle_new(skb, pp, &d, ep, now);
		if (unlikely(ret == RET_STEER_DNS))
			ret = new_dns_flow(skb, pp, &d, ep, now);
		return ret;
	}

	/* Established, reply or related: allowed when the flow was created (or last checked,
	 * see recheck_established: one 8-byte compare of the check word, conntrack.h).
	 * Packets of steered flows still have to reach their proxy socket. */
	if (unlikely(status == CT_ESTABLISHED && entry &&
		     ct_checked(entry) != ct_check_word(check, pp))) {
		ret = recheck_established(skb, pp, &d, ep, entry);
		if (ret >= 0)
			return ret;
		/* A flow between the endpoint and the node: the host's policy too (from here,
		 * not from recheck_established, for the call chain's stack). */
		if (unlikely(entry->peer_identity == ID_HOST) && host_guard(skb, pp, dir, ep->flags, 1))
			return TC_ACT_SHOT;
	}
	if (dir == DIR_EGRESS &&
	    unlikely(ct_flags & (CT_F_TO_PROXY | CT_F_FROM_PROXY | CT_F_SOCKVERDICT))) {
		if ((ct_flags & CT_F_SOCKVERDICT) && status == CT_ESTABLISHED)
			return sv_established(skb, pp, &d);
		ret = steer_established(skb, pp, &d, status, ct_flags);
		if (ret >= 0)
			return ret;
	}
	if (likely(fc) && entry) {
		/* The conntrack path ran for this packet: let the cache serve the flow's next
		 * packets, or forget the flow when this packet changes its state. */
		if (flow_cache_eligible(pp) &&
		    flow_cache_cacheable(entry, pp->tunnel_id, check, status == CT_ESTABLISHED))
			flow_cache_fill(fc, &want, check, now);
		else if (pp->t.proto == IPPROTO_TCP && (pp->tcp_flags & (TCP_F_FIN | TCP_F_RST)))
			flow_cache_forget(fc, &want);
	}
established:
	if (dir == DIR_INGRESS && unlikely(from_proxy(skb))) {
		count_proxy(d.ep_id, 0);
	}
	if (unlikely(pp->frag == FRAG_FIRST))
		frag_record_established(pp, &d, entry);
	return pass();
}

/* handle runs the policy path and then, for a packet it passes, the endpoint's tap rules
 * (tap.h): a packet policy drops is never tapped. */
static __always_inline int handle(struct __sk_buff *skb, __u8 dir)
{
	struct endpoint_info *tapped = 0;
	struct pkt p = {};
	int ret;

	ret = handle_policy(skb, dir, &p, &tapped);
	if (unlikely(tapped != 0) && ret == TC_ACT_OK)
		return tap_apply(skb, &p, tapped, dir);
	return ret;
}

/* ---- IPv6 (ipv6.h) ---- */

/* own6 says whether addr is one of the endpoint's IPv6 addresses. */
static __always_inline int own6(const struct endpoint6 *a, const __u8 *addr)
{
	return ip6_equal(addr, a->addr) || ip6_equal(addr, a->lladdr);
}

/* judge_local_source6 is judge_local_source for IPv6, a packet back from a monitor
 * included (tap_returned_source6). A packet that passes it and arrived through the VXLAN
 * overlay then takes the identity its VNI carried (tunnel_source, peer6), under the same
 * condition as for IPv4: received on the VXLAN device, whose ingress program overwrote its
 * mark. */
static __always_inline int judge_local_source6(struct __sk_buff *skb, const struct pkt6 *p,
					       struct decision *d, struct peer_identity *peer,
					       __u32 *sender)
{
	__u32 iif = skb->ingress_ifindex;

	if (!iif)
		return 0;
	if (tap_returned_source6(skb, p, peer)) {
		d->ev_flags |= FLOW_F_TAPPED;
		return 0;
	}
	return local_source_spoofed(iif, peer, sender);
}

/* peer6 resolves the peer of an IPv6 packet in direction d->dir, for the endpoint with
 * flags ep_flags. A link-local peer is the node on an endpoint's veth (nothing else is on
 * that link), and the world on a host device (a neighbour on the fabric: never the host,
 * though the host veths' fe80::1 is in the ipcache as the host's). Returns 1 when the
 * source is spoofed (judge_local_source6; *sender: the identity to report). Entering from
 * the overlay, the peer is the identity the VNI carried (tunnel_source), as handle_new has
 * it for IPv4. */
static __always_inline int peer6(struct __sk_buff *skb, const struct pkt6 *p, struct decision *d,
				 __u32 ep_flags, struct peer_identity *peer, __u32 *sender)
{
	const __u8 *addr = d->dir == DIR_EGRESS ? p->t.daddr : p->t.saddr;

	if (ip6_is_link_local(addr)) {
		__builtin_memset(peer, 0, sizeof(*peer));
		peer->identity = (ep_flags & EP_HOST) ? ID_WORLD : ID_HOST;
		return 0;
	}
	ipcache_resolve6(addr, peer);
	if (d->dir != DIR_INGRESS)
		return 0;
	if (judge_local_source6(skb, p, d, peer, sender))
		return 1;
	tunnel_source(skb, peer, d);
	return 0;
}

/* handle6_nd passes a neighbour discovery or MLD message to a link-scoped address after
 * checking what it claims, as handle_unparsed does for ARP: such messages carry no policy (the link needs them for any
 * IPv6 traffic), so they must not claim anything of another's. Leaving the endpoint, the
 * source is its own address, its link-local one, or unspecified (duplicate address
 * detection, an MLD report before it has an address), and a neighbour advertisement's
 * target one of its own: a forged one would claim another endpoint's (or the router's)
 * address in the node's neighbour table. An endpoint is a host: router advertisements,
 * redirects and MLD queries from it claim the router's role and drop, as spoofed. Both ways,
 * a neighbour discovery message must have hop limit 255, that is come from the link. */
static __noinline int handle6_nd(struct __sk_buff *skb, struct pkt6 *p, struct decision *d,
				 const struct endpoint6 *a /* 0 on a host device */)
{
	__u8 t = p->icmp_type;

	/* Drop: neighbour discovery that did not come from the link. */
	if (t >= ICMP6_T_ROUTER_SOLICIT && t <= ICMP6_T_REDIRECT && p->hop_limit != ND_HOP_LIMIT)
		return drop6(skb, p, d, REASON_MALFORMED);
	if (d->dir == DIR_INGRESS || !a)
		return pass();
	/* Drop: router advertisement, redirect or MLD query from an endpoint. */
	if (t == ICMP6_T_ROUTER_ADVERT || t == ICMP6_T_REDIRECT || t == ICMP6_T_MLD_QUERY)
		return drop6(skb, p, d, REASON_SPOOFED_SOURCE);
	/* Drop: a source address not the endpoint's (unspecified only before it has one). */
	if (!own6(a, p->t.saddr) && !(ip6_is_zero(p->t.saddr) && t != ICMP6_T_NEIGH_ADVERT))
		return drop6(skb, p, d, REASON_SPOOFED_SOURCE);
	/* Drop: a neighbour advertisement for an address not the endpoint's. */
	if (t == ICMP6_T_NEIGH_ADVERT && !own6(a, p->nd_target))
		return drop6(skb, p, d, REASON_SPOOFED_SOURCE);
	return pass();
}

/* handle6_spoofed drops an IPv6 packet that leaves the endpoint from an address not its own
 * (handle_spoofed). */
static __noinline int handle6_spoofed(struct __sk_buff *skb, struct pkt6 *p, struct decision *d)
{
	struct peer_identity peer;

	ipcache_resolve6(p->t.daddr, &peer);
	d->dst_identity = peer.identity;
	/* Drop: source address not the sending endpoint's. */
	return drop6(skb, p, d, REASON_SPOOFED_SOURCE);
}

/* handle6_later_fragment gives a non-first fragment its first fragment's verdict, for the
 * same peer identity (handle_later_fragment). */
static __noinline int handle6_later_fragment(struct __sk_buff *skb, struct pkt6 *p,
					     struct decision *d, const struct endpoint_info *ep)
{
	struct peer_identity peer;
	struct frag_value *v;
	struct frag_key k;
	__u32 sender = 0;

	frag6_key_fill(&k, p, d->ep_id, d->dir);
	v = bpf_map_lookup_elem(&frags_peer, &k);
	if (!v)
		/* Drop: its first fragment was not seen here. */
		return drop6(skb, p, d, REASON_FRAGMENT_UNKNOWN);
	p->t.sport = v->sport;
	p->t.dport = v->dport;
	d->rule_id = v->rule_id;
	if (!v->allowed)
		/* Drop: its first fragment was dropped. */
		return drop6(skb, p, d, v->reason);
	if (v->ipcache_gen == p->ipcache_gen && v->tunnel_id == p->tunnel_id)
		return pass();
	if (peer6(skb, p, d, ep->flags, &peer, &sender)) {
		set_identities(d, ep, sender);
		return drop6(skb, p, d, REASON_SPOOFED_SOURCE);
	}
	set_identities(d, ep, peer.identity);
	if (peer.identity != v->peer_identity)
		/* Drop: the datagram's peer has another identity now. */
		return drop6(skb, p, d, REASON_PEER_IDENTITY_CHANGED);
	return pass();
}

/* related6_from_node: related_from_node for IPv6 (packet too big, above all, which IPv6
 * needs since routers do not fragment). */
static __noinline int related6_from_node(struct __sk_buff *skb, const struct pkt6 *p,
					 struct decision *d, __u32 ep_flags)
{
	struct peer_identity peer;
	__u32 sender = 0;

	if (d->dir != DIR_INGRESS || !ip6_equal(p->t.daddr, p->inner.saddr))
		return 0;
	if (peer6(skb, p, d, ep_flags, &peer, &sender))
		return 0;
	if (peer.identity == ID_HOST || peer.identity == ID_REMOTE_NODE)
		return 1;
	if (!outside_cluster(&peer))
		return 0;
	ipcache_resolve6(p->inner.daddr, &peer);
	return outside_cluster(&peer);
}

/* host_traffic6 is host_traffic for IPv6: a packet on a host device is the node's own when
 * its address on the node's side (the destination coming in, the source going out) has the
 * host identity, or is link-local (a host device's own: nothing forwards link-local
 * traffic). The overlay between nodes (VXLAN, IP-in-IP and IPv6-in-IP from and to a known
 * node) is not, as for IPv4. */
static __noinline int host_traffic6(const struct pkt6 *p, __u32 dir)
{
	const __u8 *mine = dir == DIR_INGRESS ? p->t.daddr : p->t.saddr;
	struct peer_identity own, peer;

	if (!ip6_is_link_local(mine)) {
		ipcache_resolve6(mine, &own);
		if (own.identity != ID_HOST)
			return 0;
	}
	ipcache_resolve6(dir == DIR_INGRESS ? p->t.saddr : p->t.daddr, &peer);
	if (peer.identity == ID_REMOTE_NODE &&
	    (p->t.proto == IPPROTO_IPIP || p->t.proto == IPPROTO_IPV6 ||
	     (p->t.proto == IPPROTO_UDP && p->t.dport == bpf_htons(VXLAN_PORT))))
		return 0;
	return 1;
}

/* host_safe6_flow is host_safe_flow for IPv6 (the host_safe6 map). */
static __noinline int host_safe6_flow(const struct pkt6 *p, __u32 dir, struct verdict *res)
{
	struct host_safe6_key k = {
		.port = dir == DIR_EGRESS ? p->t.dport : p->t.sport,
		.proto = p->t.proto,
	};

	__builtin_memcpy(k.addr, dir == DIR_EGRESS ? p->t.daddr : p->t.saddr, 16);
	if (!bpf_map_lookup_elem(&host_safe6, &k))
		return 0;
	host_safe_verdict(res);
	return 1;
}

/* host_guard6 is host_guard for an IPv6 flow of endpoint ep: the node's side of a flow
 * between the endpoint and the node, judged by the host's policy. The node's side is a host
 * address or, on the endpoint's link, a link-local one (the router's fe80::1). The host's
 * peer is the endpoint: its identity, whichever of its addresses the packet carries (its
 * link-local address is in no ipcache). */
static __noinline int host_guard6(struct __sk_buff *skb, struct pkt6 *p, __u32 dir,
				  const struct endpoint_info *ep, __u32 established)
{
	struct endpoint_info *host = host_guarding(skb, dir, ep->flags);
	struct peer_identity hostside, peer;
	const __u8 *hs, *es;
	struct decision d;
	__u8 reason;

	if (!host)
		return 0;
	hs = dir == DIR_EGRESS ? p->t.daddr : p->t.saddr;
	es = dir == DIR_EGRESS ? p->t.saddr : p->t.daddr;
	if (!ip6_is_link_local(hs)) {
		ipcache_resolve6(hs, &hostside);
		if (hostside.identity != ID_HOST)
			return 0;
	}
	if (ip6_is_link_local(es)) {
		__builtin_memset(&peer, 0, sizeof(peer));
		peer.identity = ep->identity;
		peer.ep_id = ep->ep_id;
	} else {
		ipcache_resolve6(es, &peer);
	}
	reason = host_refuses(host, dir, &peer, p->t.proto, p->policy_port, established, &d);
	if (reason) {
		/* Drop: the node's own policy refuses the flow; reported as the host's. */
		if (p->frag == FRAG_FIRST)
			frag6_record(p, &d, 0);
		return drop6(skb, p, &d, reason);
	}
	return 0;
}

/* drop6_new drops a new IPv6 flow's packet for reason (recording a first fragment's
 * verdict for the later ones). */
static __always_inline int drop6_new(struct __sk_buff *skb, struct pkt6 *p, struct decision *d,
				     __u8 reason)
{
	d->reason = reason;
	if (p->frag == FRAG_FIRST)
		frag6_record(p, d, 0);
	return drop6(skb, p, d, reason);
}

/* allow6_new records a new IPv6 flow that goes on (ct_flags: its proxy flags) and reports
 * it with verdict. */
static __always_inline int allow6_new(struct __sk_buff *skb, struct pkt6 *p, struct decision *d,
				      __u32 ct_flags, __u32 revision, __u64 now, __u8 verdict)
{
	ct6_create(p, d, ct_flags, revision, now);
	if (p->frag == FRAG_FIRST)
		frag6_record(p, d, 1);
	emit_event6(skb, p, d, EVENT_NEW, verdict);
	return pass();
}

/* proxy6_assign_to is proxy_assign_to for an IPv6 TCP packet: its own tuple's socket (an
 * accepted or upstream connection of a proxy, or a request socket mid-handshake), else, for
 * a SYN with listener set, the listener of cfg. The steer mark is the map proxy's (marks).
 * Returns 0 when assigned, -1 when not (the caller drops). */
static __noinline int proxy6_assign_to(struct __sk_buff *skb, const struct pkt6 *p, int listener,
				       const struct proxy_config *cfg, const struct proxy_config *marks)
{
	struct bpf_sock_tuple tuple = {};
	int syn = (p->tcp_flags & (TCP_F_SYN | TCP_F_ACK)) == TCP_F_SYN;

	if (!cfg || !cfg->port || cfg->family != RAMPART_FAMILY_V6 || !marks || !marks->steer_mark)
		return -1; /* no IPv6 listener configured */
	__builtin_memcpy(tuple.ipv6.saddr, p->t.saddr, 16);
	__builtin_memcpy(tuple.ipv6.daddr, p->t.daddr, 16);
	tuple.ipv6.sport = p->t.sport;
	tuple.ipv6.dport = p->t.dport;
	return proxy_assign_tuple(skb, &tuple, 1, syn, listener, cfg, marks);
}

/* proxy6_assign hands an IPv6 TCP packet to the L7 proxy (map proxy6). */
static __always_inline int proxy6_assign(struct __sk_buff *skb, const struct pkt6 *p, int listener)
{
	__u32 zero = 0;

	return proxy6_assign_to(skb, p, listener, bpf_map_lookup_elem(&proxy6, &zero), proxy_cfg());
}

/* dns6_assign is dns_assign for an IPv6 query: TCP as proxy6_assign to the DNS proxy's
 * IPv6 listener, UDP to its one IPv6 socket (map dns_proxy6; observe: its observing
 * sockets). Returns 0 when assigned, -1 when not (the caller drops). */
static __noinline int dns6_assign(struct __sk_buff *skb, const struct pkt6 *p, int listener, int observe)
{
	__u32 idx = observe ? 1 : 0;
	const struct proxy_config *cfg = bpf_map_lookup_elem(&dns_proxy6, &idx);
	const struct proxy_config *marks = proxy_cfg();
	struct bpf_sock_tuple tuple = {};
	struct bpf_sock *sk;

	if (p->t.proto == IPPROTO_TCP)
		return proxy6_assign_to(skb, p, listener, cfg, marks);
	if (p->t.proto != IPPROTO_UDP || !cfg || !cfg->port || !marks || !marks->steer_mark ||
	    cfg->family != RAMPART_FAMILY_V6)
		return -1;
	__builtin_memcpy(tuple.ipv6.saddr, p->t.saddr, 16);
	__builtin_memcpy(tuple.ipv6.daddr, cfg->addr, 16);
	tuple.ipv6.sport = p->t.sport;
	tuple.ipv6.dport = cfg->port;
	sk = bpf_sk_lookup_udp(skb, &tuple, sizeof(tuple.ipv6), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return -1;
	return assign_steered(skb, sk, marks);
}

/* new6_dns_flow is new_dns_flow for IPv6: a query that DNS rules redirect, or that an
 * EP_DNS_OBSERVE endpoint's policy allows (FLOW_F_DNS_OBSERVE in d), goes to the DNS
 * proxy once the server's ingress verdict (a local server) admits it. */
static __noinline int new6_dns_flow(struct __sk_buff *skb, struct pkt6 *p, struct decision *d,
				    const struct endpoint_info *ep, __u64 now)
{
	int observe = d->ev_flags & FLOW_F_DNS_OBSERVE;
	struct peer_identity peer, src;
	struct verdict dres = {};

	if (p->frag != FRAG_NONE)
		/* Drop: the later fragments of a datagram could not follow its first to the
		 * proxy's socket. */
		return drop6_new(skb, p, d, REASON_PROXY_UNAVAILABLE);
	ipcache_resolve6(p->t.daddr, &peer);
	if (peer.ep_id) {
		__u32 dst_id = peer.ep_id;
		struct endpoint_info *dst = bpf_map_lookup_elem(&endpoints_by_id, &dst_id);

		ipcache_resolve6(p->t.saddr, &src);
		policy_decide(dst_id, DIR_INGRESS, dst && (dst->flags & EP_ADMIN_INGRESS), &src,
			      p->t.proto, p->policy_port, &dres);
		if (dres.action == POLICY_DENY || (dres.action == 0 && (!dst || (dst->flags & EP_ENFORCE_INGRESS)))) {
			/* Drop: the server's ingress policy refuses the query. */
			struct decision dd;
			__u8 reason = dest_drop_decision(&dd, d, &peer, &src, &dres);

			return drop6(skb, p, &dd, reason);
		}
	}
	if (dns6_assign(skb, p, 1, observe) < 0)
		/* Drop: no DNS proxy socket: the query cannot be checked, so it does not go out. */
		return drop6(skb, p, d, REASON_PROXY_UNAVAILABLE);
	count_proxy(d->ep_id, 1);
	return allow6_new(skb, p, d, CT_F_TO_PROXY | CT_F_DNS_PROXY | (observe ? CT_F_DNS_OBSERVE : 0),
			  ep->revision + p->ipcache_gen, now, VERDICT_REDIRECTED);
}

/* new6_egress is new_egress for IPv6: a flow leaving the endpoint that its egress policy
 * allowed goes through the L7 proxy when the egress verdict is a redirect or when the
 * destination is a local endpoint whose ingress verdict is one, after that destination's
 * ingress policy admits it. DNS redirects drop: the DNS proxy takes IPv4 only. */
static __always_inline int new6_egress(struct __sk_buff *skb, struct pkt6 *p, struct decision *d,
				       const struct peer_identity *peer, const struct verdict *res,
				  __u32 revision, __u64 now)
{
	int steer = res->action == POLICY_REDIRECT;
	struct verdict dres = {};
	/* Initialised although only read after the same test that fills it: the verifier
	 * does not always see that the two tests agree. */
	struct peer_identity src = {};
	int enforced = 1;

	if (steer)
		d->ev_flags |= FLOW_F_L7_EGRESS;
	if (p->t.proto == IPPROTO_TCP && peer->ep_id) {
		__u32 dst_id = peer->ep_id;
		struct endpoint_info *dst = bpf_map_lookup_elem(&endpoints_by_id, &dst_id);

		enforced = !dst || (dst->flags & EP_ENFORCE_INGRESS);
		ipcache_resolve6(p->t.saddr, &src);
		policy_decide(dst_id, DIR_INGRESS, dst && (dst->flags & EP_ADMIN_INGRESS), &src,
			      p->t.proto, p->policy_port, &dres);
		if (dres.action == POLICY_REDIRECT) {
			d->ev_flags |= FLOW_F_L7_INGRESS;
			if (!steer) {
				d->rule_id = dres.rule_id;
				d->match_identity = dres.identity;
			}
			steer = 1;
		}
	}
	if (!steer)
		return allow6_new(skb, p, d, 0, revision, now, VERDICT_FORWARDED);
	if (peer->ep_id && p->t.proto == IPPROTO_TCP &&
	    (dres.action == POLICY_DENY || (dres.action == 0 && enforced))) {
		/* Drop: the destination's ingress policy refuses the flow; reported as its
		 * ingress drop (new_egress). */
		struct decision dd;

		d->reason = dest_drop_decision(&dd, d, peer, &src, &dres);
		if (p->frag == FRAG_FIRST)
			frag6_record(p, d, 0);
		return drop6(skb, p, &dd, d->reason);
	}
	if (p->t.proto != IPPROTO_TCP || p->frag != FRAG_NONE || proxy6_assign(skb, p, 1) < 0)
		/* Drop: not a whole TCP segment, or no proxy socket (no IPv6 listener): L7
		 * policy cannot be checked, so the connection is refused. */
		return drop6_new(skb, p, d, REASON_PROXY_UNAVAILABLE);
	count_proxy(d->ep_id, 1);
	return allow6_new(skb, p, d, CT_F_TO_PROXY, revision, now, VERDICT_REDIRECTED);
}

/* new6_ingress is new_ingress for IPv6: a redirect verdict admits only the proxy's
 * upstream connection (its socket mark), whose replies will be steered back to it. */
static __always_inline int new6_ingress(struct __sk_buff *skb, struct pkt6 *p, struct decision *d,
					const struct verdict *res, __u32 revision, __u64 now)
{
	int proxied = from_proxy(skb);
	__u32 ct_flags = 0;

	if (res->action == POLICY_REDIRECT) {
		d->ev_flags |= FLOW_F_L7_INGRESS;
		if (!proxied || p->t.proto != IPPROTO_TCP)
			/* Drop: L7 rules apply to this flow but it did not pass the proxy. */
			return drop6_new(skb, p, d, REASON_PROXY_BYPASS);
	}
	if (proxied) {
		d->ev_flags |= FLOW_F_FROM_PROXY;
		ct_flags = CT_F_FROM_PROXY;
		count_proxy(d->ep_id, 0);
	}
	return allow6_new(skb, p, d, ct_flags, revision, now, VERDICT_FORWARDED);
}

/* steer6_established is steer_established for IPv6: a client's packets of a steered flow
 * to the proxy, a server's replies to the proxy's upstream socket. Returns -1 when the
 * packet is not such a packet, else the tc verdict. */
static __noinline int steer6_established(struct __sk_buff *skb, struct pkt6 *p, struct decision *d,
					 int status, __u32 ct_flags)
{
	int to_proxy = status == CT_ESTABLISHED && (ct_flags & CT_F_TO_PROXY);
	int reply_to_proxy = status == CT_REPLY && (ct_flags & CT_F_FROM_PROXY);

	if (!to_proxy && !reply_to_proxy)
		return -1;
	if (to_proxy && (ct_flags & CT_F_DNS_PROXY)) {
		/* A DNS flow: every datagram (or segment) goes to the DNS proxy. */
		if (p->frag != FRAG_NONE || dns6_assign(skb, p, 1, ct_flags & CT_F_DNS_OBSERVE) < 0)
			return drop6(skb, p, d, REASON_PROXY_UNAVAILABLE);
		count_proxy(d->ep_id, 1);
		return pass();
	}
	if (p->t.proto != IPPROTO_TCP || p->frag != FRAG_NONE || proxy6_assign(skb, p, to_proxy) < 0)
		/* Drop: the connection's proxy socket is gone: it cannot go on unchecked. */
		return drop6(skb, p, d, REASON_PROXY_UNAVAILABLE);
	count_proxy(d->ep_id, 1);
	return pass();
}

/* handle6_new evaluates a new IPv6 flow, as handle_new does an IPv4 one. */
static __noinline int handle6_new(struct __sk_buff *skb, struct pkt6 *p, struct decision *d,
				  const struct endpoint_info *ep, __u64 now)
{
	struct peer_identity peer;
	struct verdict res;
	__u32 sender = 0;
	__u8 dir = d->dir;

	if (peer6(skb, p, d, ep->flags, &peer, &sender)) {
		/* Drop: a local endpoint's address that did not come from its interface. */
		set_identities(d, ep, sender);
		return drop6_new(skb, p, d, REASON_SPOOFED_SOURCE);
	}
	set_identities(d, ep, peer.identity);
	if (dir == DIR_INGRESS && (ep->flags & EP_MONITOR) && skb->ingress_ifindex)
		/* Drop: a monitor endpoint is not a destination. */
		return drop6_new(skb, p, d, REASON_TAP_MONITOR_DESTINATION);
	if (unlikely(ep->flags & (dir == DIR_EGRESS ? EP_TAP_EGRESS : EP_TAP_INGRESS)) &&
	    tap_find6(d->ep_id, p, dir) >= 0)
		d->ev_flags |= FLOW_F_TAPPED; /* its event says so; tap_apply6 acts after the verdict */
	if (!((ep->flags & EP_HOST) && host_safe6_flow(p, dir, &res)))
		policy_decide(d->ep_id, dir, ep_admin(ep, dir), &peer, p->t.proto, p->policy_port, &res);
	d->rule_id = res.rule_id;
	d->match_identity = res.identity;
	if (res.action == POLICY_DENY)
		/* Drop: a deny entry matches. */
		return drop6_new(skb, p, d, REASON_POLICY_DENY);
	if (res.action != POLICY_ALLOW && res.action != POLICY_REDIRECT &&
	    (ep->flags & (dir == DIR_INGRESS ? EP_ENFORCE_INGRESS : EP_ENFORCE_EGRESS)))
		/* Drop: the endpoint enforces this direction and nothing allows the flow. */
		return drop6_new(skb, p, d, REASON_POLICY_DEFAULT_DENY);
	audit_new(d, ep, dir, &peer, p->t.proto, p->policy_port);
	if (dir == DIR_EGRESS && res.action == POLICY_REDIRECT && res.proxy == PROXY_KIND_DNS) {
		d->ev_flags |= FLOW_F_L7_EGRESS;
		return RET_STEER_DNS;
	}
	if (dir == DIR_EGRESS && (ep->flags & EP_DNS_OBSERVE) && res.action != POLICY_REDIRECT &&
	    (p->t.proto == IPPROTO_UDP || p->t.proto == IPPROTO_TCP) && p->t.dport == bpf_htons(DNS_PORT)) {
		/* Allowed: the proxy forwards it and learns the answer (handle_new). */
		d->ev_flags |= FLOW_F_DNS_OBSERVE;
		return RET_STEER_DNS;
	}
	if (dir == DIR_EGRESS)
		return new6_egress(skb, p, d, &peer, &res, ep->revision + p->ipcache_gen, now);
	return new6_ingress(skb, p, d, &res, ep->revision + p->ipcache_gen, now);
}

/* handle6_recheck applies a change to an established IPv6 flow, as recheck_established
 * does. Returns -1 to go on, else the tc verdict. */
static __noinline int handle6_recheck(struct __sk_buff *skb, struct pkt6 *p, struct decision *d,
				      const struct endpoint_info *ep, struct ct_value *v)
{
	__u32 via_proxy = v->flags & (d->dir == DIR_EGRESS ? CT_F_TO_PROXY : CT_F_FROM_PROXY);
	__u32 enforce = d->dir == DIR_INGRESS ? EP_ENFORCE_INGRESS : EP_ENFORCE_EGRESS;
	struct peer_identity peer;
	struct verdict res;
	__u32 sender = 0;
	__u8 reason = 0;
	int changed;

	if (peer6(skb, p, d, ep->flags, &peer, &sender)) {
		set_identities(d, ep, sender);
		return drop6(skb, p, d, REASON_SPOOFED_SOURCE);
	}
	set_identities(d, ep, peer.identity);
	changed = v->peer_identity != ID_UNKNOWN && v->peer_identity != peer.identity;
	policy_decide(d->ep_id, d->dir, ep_admin(ep, d->dir), &peer, p->t.proto, p->policy_port, &res);
	d->rule_id = res.rule_id;
	d->match_identity = res.identity;
	if (res.action == POLICY_DENY)
		/* Drop: a deny entry now matches this established flow. */
		reason = changed ? REASON_PEER_IDENTITY_CHANGED : REASON_POLICY_DENY;
	else if (res.action == POLICY_REDIRECT && (!via_proxy || changed)) {
		/* Drop: L7 rules now apply to this flow, which does not pass the proxy, or whose
		 * L7 decisions were taken for another peer identity (recheck_established). */
		d->ev_flags |= d->dir == DIR_EGRESS ? FLOW_F_L7_EGRESS : FLOW_F_L7_INGRESS;
		reason = via_proxy ? REASON_PEER_IDENTITY_CHANGED : REASON_PROXY_BYPASS;
	}
	else if (changed && res.action != POLICY_ALLOW && res.action != POLICY_REDIRECT && (ep->flags & enforce))
		/* Drop: nothing allows the flow's new peer identity. */
		reason = REASON_PEER_IDENTITY_CHANGED;
	if (reason) {
		if (p->frag == FRAG_FIRST)
			frag6_record(p, d, 0);
		return drop6(skb, p, d, reason);
	}
	v->peer_identity = peer.identity;
	ct_set_checked(v, ct6_check_word(ep->revision + p->ipcache_gen, p));
	return -1;
}

/* handle6 is the IPv6 policy path of an endpoint's veth: endpoint -> parse -> neighbour
 * discovery, or source check -> fragments -> conntrack -> ipcache -> policy -> verdict, with
 * the IPv4 path's rules (handle_policy). On a host device (host: the host programs) it is
 * host policy's IPv6 path: only the node's own traffic is judged (host_traffic6), what is
 * forwarded passes on (TC_ACT_UNSPEC); the node sends from any of its addresses, and its
 * neighbour discovery passes whatever the destination (the hop limit keeps it on the link).
 * *tapped is set to the endpoint when it has tap rules in the packet's direction (endpoint6
 * runs them after the verdict). */
static __always_inline int handle6(struct __sk_buff *skb, __u8 dir, const int host, struct pkt6 *p,
				   struct endpoint_info **tapped)
{
	struct decision d = { .dir = dir };
	struct endpoint_info *ep;
	struct endpoint6 *a = 0;
	struct ct_value *entry;
	__u32 check;
	__u64 now;
	int ret, status;

	ret = parse6(skb, p);
	p->ipcache_gen = ipcache_generation();
	if (dir == DIR_INGRESS)
		p->tunnel_id = tunnel_id_of(skb);
	ep = endpoint_of(skb->ifindex);
	if (!ep)
		/* Drop: no endpoint on this interface. */
		return drop6(skb, p, &d, REASON_UNKNOWN_ENDPOINT);
	/* Not the node's own traffic (or an IPv6 header too short to say whose: the kernel
	 * drops it): the device's next program or the kernel has it. */
	if (host && !host_traffic6(p, dir))
		return TC_ACT_UNSPEC;
	d.ep_id = ep->ep_id;
	d.src_identity = dir == DIR_EGRESS ? ep->identity : 0;
	d.dst_identity = dir == DIR_INGRESS ? ep->identity : 0;
	if (ret == PARSE_MALFORMED)
		/* Drop: truncated or invalid IPv6 or upper-layer header. */
		return drop6(skb, p, &d, REASON_MALFORMED);
	if (ret < 0)
		/* Drop: an extension header not followed (parse6). */
		return drop6(skb, p, &d, REASON_IPV6_EXTENSION);
	if (host) {
		if (p->nd)
			return handle6_nd(skb, p, &d, 0);
	} else {
		a = bpf_map_lookup_elem(&endpoints6, &d.ep_id);
		if (!a)
			/* Drop: the endpoint has no IPv6 address. */
			return drop6(skb, p, &d, REASON_UNSUPPORTED_L3);
		/* Link control passes without policy only on the link. Leaving the endpoint
		 * that is a link-scoped destination: to any other address it is an ICMPv6
		 * packet like others, which policy judges (else an endpoint could send what it
		 * likes past its egress policy as neighbour solicitations to the world).
		 * Entering it, the node's own solicitations of the endpoint's address are
		 * unicast to it; that they come from the node, not from beyond, handle6_nd
		 * checks by the hop limit. */
		if (p->nd && (dir == DIR_INGRESS || ip6_is_link_scoped(p->t.daddr)))
			return handle6_nd(skb, p, &d, a);
		if (dir == DIR_EGRESS && !own6(a, p->t.saddr))
			return handle6_spoofed(skb, p, &d);
	}
	if (!host && unlikely(ep->flags & (dir == DIR_EGRESS ? EP_TAP_EGRESS : EP_TAP_INGRESS)))
		*tapped = ep;
	if (p->frag == FRAG_LATER)
		return handle6_later_fragment(skb, p, &d, ep);
	now = bpf_jiffies64();
	check = ep->revision + p->ipcache_gen;
	if (flow_cache6_eligible(p) && flow_cache6_hit(p, skb->ifindex, dir, check, now))
		return pass();
	status = ct6_lookup(p, d.ep_id, dir, now, &entry);
	if (status == CT_RELATED_FOREIGN && related6_from_node(skb, p, &d, ep->flags))
		return pass();
	if (status == CT_NEW || status == CT_RELATED_FOREIGN) {
		if (!host && host_guard6(skb, p, dir, ep, 0))
			return TC_ACT_SHOT;
		ret = handle6_new(skb, p, &d, ep, now);
		if (ret == RET_STEER_DNS)
			ret = new6_dns_flow(skb, p, &d, ep, now);
		return ret;
	}
	if (status == CT_ESTABLISHED && entry && ct_checked(entry) != ct6_check_word(check, p)) {
		ret = handle6_recheck(skb, p, &d, ep, entry);
		if (ret >= 0)
			return ret;
		/* A flow between the endpoint and the node: the host's policy too. */
		if (!host && entry->peer_identity == ID_HOST && host_guard6(skb, p, dir, ep, 1))
			return TC_ACT_SHOT;
	}
	if (!host && dir == DIR_EGRESS && entry && (entry->flags & (CT_F_TO_PROXY | CT_F_FROM_PROXY))) {
		ret = steer6_established(skb, p, &d, status, entry->flags);
		if (ret >= 0)
			return ret;
	}
	if (entry) {
		/* The conntrack path ran: let the cache serve the flow's next packets, or forget
		 * the flow when this packet changes its state. */
		if (flow_cache6_eligible(p) &&
		    flow_cache_cacheable(entry, p->tunnel_id, check, status == CT_ESTABLISHED))
			flow_cache6_update(p, skb->ifindex, dir, check, 1);
		else if (p->t.proto == IPPROTO_TCP && (p->tcp_flags & (TCP_F_FIN | TCP_F_RST)))
			flow_cache6_update(p, skb->ifindex, dir, 0, 0);
	}
	if (p->frag == FRAG_FIRST) {
		set_identities(&d, ep, entry ? entry->peer_identity : 0);
		d.rule_id = entry ? entry->rule_id : 0;
		frag6_record(p, &d, 1);
	}
	return pass();
}

/* endpoint6 runs an endpoint's IPv6 path and then, for a packet it passes, the endpoint's
 * tap rules (tap6.h): a packet policy drops is never tapped. */
static __always_inline int endpoint6(struct __sk_buff *skb, __u8 dir)
{
	struct endpoint_info *tapped = 0;
	struct pkt6 p = {};
	int ret = handle6(skb, dir, 0, &p, &tapped);

	if (unlikely(tapped != 0) && ret == TC_ACT_OK)
		return tap_apply6(skb, &p, tapped, dir);
	return ret;
}

/* host6 runs host policy's IPv6 path (no taps: the host is not tapped). */
static __always_inline int host6(struct __sk_buff *skb, __u8 dir)
{
	struct endpoint_info *tapped = 0;
	struct pkt6 p = {};
	int ret = handle6(skb, dir, 1, &p, &tapped);

	return ret == TC_ACT_OK ? TC_ACT_UNSPEC : ret;
}

/* tc ingress on an endpoint's veth, IPv6 (tail call from rampart_from_ep). */
SEC("tc")
int rampart_from_ep6(struct __sk_buff *skb)
{
	return endpoint6(skb, DIR_EGRESS);
}

/* tc egress on an endpoint's veth, IPv6 (tail call from rampart_to_ep). */
SEC("tc")
int rampart_to_ep6(struct __sk_buff *skb)
{
	return endpoint6(skb, DIR_INGRESS);
}

/* tc ingress on a host device, IPv6 (tail call from rampart_to_host). */
SEC("tc")
int rampart_to_host6(struct __sk_buff *skb)
{
	return host6(skb, DIR_INGRESS);
}

/* tc egress on a host device, IPv6 (tail call from rampart_from_host). */
SEC("tc")
int rampart_from_host6(struct __sk_buff *skb)
{
	return host6(skb, DIR_EGRESS);
}

/* IPV6_PATH_HOST + DIR_*: the host programs' entries in ipv6_path. */
#define IPV6_PATH_HOST 2

/* The IPv6 path by direction (DIR_*; IPV6_PATH_HOST + DIR_* for the host devices): the
 * endpoint and host programs tail-call into it. Filled when the programs are loaded (not
 * pinned: each load has its own). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 5);
	__type(key, __u32);
	__array(values, int(struct __sk_buff *));
} ipv6_path SEC(".maps") = {
	.values = {
		[DIR_INGRESS] = (void *)&rampart_to_ep6,
		[DIR_EGRESS] = (void *)&rampart_from_ep6,
		[IPV6_PATH_HOST + DIR_INGRESS] = (void *)&rampart_to_host6,
		[IPV6_PATH_HOST + DIR_EGRESS] = (void *)&rampart_from_host6,
	},
};

/* handle_endpoint runs the endpoint's IPv6 path for an IPv6 frame (by the protocol the
 * kernel read from it: handle6 checks the frame itself) and the IPv4 path for everything
 * else. */
static __always_inline int handle_endpoint(struct __sk_buff *skb, __u8 dir)
{
	if (unlikely(skb->protocol == bpf_htons(ETH_P_IPV6))) {
		bpf_tail_call(skb, &ipv6_path, dir);
		/* Not reached unless the program is missing: the IPv4 path drops the frame
		 * (REASON_UNSUPPORTED_L3, handle_unparsed). */
	}
	return handle(skb, dir);
}

/* handle_host runs host policy's IPv6 path for an IPv6 frame and its IPv4 path for
 * everything else, passing on (TC_ACT_UNSPEC) what the policy path passes. */
static __always_inline int handle_host(struct __sk_buff *skb, __u8 dir)
{
	int ret;

	if (unlikely(skb->protocol == bpf_htons(ETH_P_IPV6))) {
		bpf_tail_call(skb, &ipv6_path, IPV6_PATH_HOST + dir);
		/* Not reached unless the program is missing: the IPv4 path would pass the
		 * node's IPv6 unjudged (host_traffic), so it drops. */
		return TC_ACT_SHOT;
	}
	ret = handle(skb, dir);
	return ret == TC_ACT_OK ? TC_ACT_UNSPEC : ret;
}

/* tc ingress on the host-side veth: the endpoint is sending. */
SEC("tc")
int rampart_from_ep(struct __sk_buff *skb)
{
	return handle_endpoint(skb, DIR_EGRESS);
}

/* tc egress on the host-side veth: the packet is about to enter the endpoint. */
SEC("tc")
int rampart_to_ep(struct __sk_buff *skb)
{
	return handle_endpoint(skb, DIR_INGRESS);
}

/* tc ingress on a host device: into the node. The node's own traffic is judged as the host
 * endpoint's ingress (host_traffic says which); what the policy path passes goes on to the
 * device's next program (TC_ACT_UNSPEC: the IP-in-IP overlay's, with a lower priority) or
 * to the kernel. */
SEC("tc")
int rampart_to_host(struct __sk_buff *skb)
{
	return handle_host(skb, DIR_INGRESS);
}

/* tc egress on a host device: out of the node, the host endpoint's egress. */
SEC("tc")
int rampart_from_host(struct __sk_buff *skb)
{
	return handle_host(skb, DIR_EGRESS);
}

/* tc egress on the VXLAN device, IPv6 inner packets (tail call from rampart_to_tunnel). */
SEC("tc")
int rampart_to_tunnel6(struct __sk_buff *skb)
{
	return tunnel_egress6(skb);
}

/* tc ingress on the VXLAN device, IPv6 inner packets (tail call from rampart_from_tunnel). */
SEC("tc")
int rampart_from_tunnel6(struct __sk_buff *skb)
{
	return tunnel_ingress6(skb);
}

/* The overlay's IPv6 programs by direction (DIR_*): a program of their own, as the
 * endpoints' IPv6 path (ipv6_path), so that the IPv6 parser neither adds to the IPv4
 * programs' verification nor to their stack. Filled when the programs are loaded. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__array(values, int(struct __sk_buff *));
} tunnel6_path SEC(".maps") = {
	.values = {
		[DIR_INGRESS] = (void *)&rampart_from_tunnel6,
		[DIR_EGRESS] = (void *)&rampart_to_tunnel6,
	},
};

/* tc egress on the VXLAN device: into the overlay (tunnel.h). An IPv6 frame (by the
 * protocol the kernel read from it; parse6 checks the frame itself) takes
 * rampart_to_tunnel6; should the tail call fail, tunnel_egress drops it as not IPv4. */
SEC("tc")
int rampart_to_tunnel(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		bpf_tail_call(skb, &tunnel6_path, DIR_EGRESS);
	return tunnel_egress(skb);
}

/* tc ingress on the VXLAN device: out of the overlay (tunnel.h; IPv6: rampart_from_tunnel6,
 * as above). */
SEC("tc")
int rampart_from_tunnel(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		bpf_tail_call(skb, &tunnel6_path, DIR_INGRESS);
	return tunnel_ingress(skb);
}

/* tc ingress on the host side of a monitor's veths: what the monitor sends back (tap.h). */
SEC("tc")
int rampart_from_monitor(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return tap_return6(skb);
	return tap_return(skb);
}

/* tc ingress on the tap tunnel device: copies from other nodes for local monitors (tap.h). */
SEC("tc")
int rampart_from_tap_tunnel(struct __sk_buff *skb)
{
	return tap_tunnel_ingress(skb);
}

/* tc egress on a fabric interface: into the IP-in-IP overlay (ipip.h). */
SEC("tc")
int rampart_to_ipip(struct __sk_buff *skb)
{
	return ipip_egress(skb);
}

/* tc ingress on a fabric interface: out of the IP-in-IP overlay (ipip.h). */
SEC("tc")
int rampart_from_ipip(struct __sk_buff *skb)
{
	return ipip_ingress(skb);
}
