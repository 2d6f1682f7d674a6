// Command skrelay is an experiment behind issue 3's L7 target, not part of Rampart: it
// measures what a proxy hop costs an HTTP request on this machine, and what the kernel
// could do instead, on loopback (ports the kernel picks) with the L7 benchmark's CPU
// placement (load generator on CPU 0; server and relay on CPU 1).
//
// Paths, each measured with fortio in closed loop against the L7 benchmark's HTTP handler
// (bench/l7.ServeHTTP, in `skrelay server`):
//
//   - direct: no relay.
//   - user: a relay in user space (read and write, one goroutine per direction), the
//     floor of any proxy that handles bytes in a process, as the agent's fast path does.
//   - splice: the same with splice(2) (Go's io.Copy between TCP connections).
//   - sockmap: the relay's two sockets in a sockhash, with an sk_skb stream verdict
//     program that sends what one receives out of the other; the process never sees
//     the bytes.
//   - skmsg: no relay; a sockops program puts the client's connections to the server in
//     a sockhash and an sk_msg program checks the start of each send against a literal
//     rule (GET /v1) and passes it: the cost of a verdict on request heads at the
//     client's own socket.
//   - skmsg-parse: the same with what a real verdict has to do first: find the end of the
//     head (corking until it is whole), then the method and path in it.
//
// Tests check what such a verdict would rest on. TestSenderSocket: a tc program on an
// endpoint's host-side veth sees which socket sent each packet. TestRefusalAtSender: an
// sk_msg program can answer a refused request with a 403 in the sender's own receive
// queue, on a connection that stays open. TestRefusalWithSendfile: requests written with
// sendfile(2) or splice(2) go through the verdict too. TestParsedVerdictWaitsForWholeHeads:
// heads written in pieces are held until whole. TestServerSendsThroughTracker: a server's
// responses (sendfile included) arrive whole under an sk_msg program that sees each one.
// TestRefusalOrder: a server-side response tracker lets the client's verdict answer a
// refusal only in order (pipeline.bpf.c, built against the kernel's BTF). TestVerdictStaysInItsNamespace:
// the sockops programs, which see every namespace's sockets from the cgroup root, take only
// the server's namespace's connections.
//
// Run as root: bench/experiments/skrelay/run.sh [--rounds N] [--seconds S].
package main
