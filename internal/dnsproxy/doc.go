// Package dnsproxy is the transparent DNS proxy of DNS-aware egress policy: the dataplane
// steers a pod's DNS packets (UDP, and TCP connections, to port 53 when its policy has
// rules.dns) to this proxy's sockets in the node namespace with bpf_sk_assign, which keeps
// their original destination. For each query the proxy asks the agent (Policy.Allow)
// whether the pod may ask that name of that server; a refused query is answered REFUSED
// and never leaves the node. An allowed query goes, unchanged, to the server the pod asked,
// from the node's own address; the addresses of the response's chain (the question's name,
// the CNAMEs leading from it, the A and AAAA records at its end) are handed to the agent
// (Policy.Learn), which admits them for the pod's toFQDNs rules, and only then is the
// response passed to the pod, from the address and port the pod sent its query to.
//
// Why a proxy and not snooping the packets as they pass: rules.dns must be able to stop a
// query before it reaches a server, which a passive observer cannot do; and the learnt
// addresses must be in the dataplane before the pod gets them, or the pod's first packet
// to an address it has just been given would be dropped. Holding the response until Learn
// returns orders the two; if Learn fails the pod gets SERVFAIL instead (fail closed: it
// may retry, and it never holds an address the dataplane does not admit).
//
// What the proxy trusts: nothing a pod or a server sends. Queries are parsed and bounded
// (MaxQuerySize, one question, opcode QUERY); responses must carry the query's ID and
// question, and only records on the chain from the question's name are learnt, so a
// server cannot make the proxy learn addresses for names nobody asked. Every buffer,
// the number of queries in flight and of TCP connections are bounded, and slow TCP
// clients time out. Every drop is counted by reason (Stats) and reported (Config.OnEvent).
//
// How replies leave with the original destination as their source: a TCP connection's
// accepted socket already has it as its local address. A UDP answer is sent on the
// listening socket with an IP_PKTINFO (IPV6_PKTINFO) source when the original port is the
// listener's own; otherwise (steered port 53 to a listener on another port) it is written
// as a UDP packet on a raw socket whose IP source is set the same way, because a UDP
// socket can only send from its bound port. Both need IP_TRANSPARENT (Config.Transparent)
// when the original destination is not a local address.
package dnsproxy
