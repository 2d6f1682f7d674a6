// Package sockverdict is the send-side L7 verdict (docs/internals/l7-send-side.md): sockops
// and sk_msg programs (bpf/sockverdict.c, a BPF object of its own, built by bpf2go) that
// check the HTTP/1.1 requests between two local endpoints on the client's own socket, so
// that such connections need not pass through the L7 proxy.
//
// It is apart from internal/datapath because it is another kernel concept, with its own
// object, attach points (the root cgroup v2 and two sockhashes) and state: Verdict loads
// the programs and writes the rule tables (l7table) and socket targets; Manager keeps, for
// the agent, which pairs of endpoints are listed and in which slot, retires the slots of
// pairs that stop being listed while their connections stay open, and turns the verdict's
// events into access log records. The tc programs learn which pairs skip the proxy from
// the map sv_pairs of the tc object, which the datapath hands over (Pairs). This package
// imports no other kernel package of Rampart.
package sockverdict
