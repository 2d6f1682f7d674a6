// Package l7table compiles the L7 rules that apply to one connection between two local
// endpoints into the tables the kernel's send-side verdict matches requests against
// (bpf/sockverdict.c; docs/internals/l7-send-side.md).
//
// It is pure: Compile takes the L7 plan (l7plan.Plan: the same authorisations Envoy and
// the fast path enforce) and a connection's addresses and port, and either returns a Table
// or says why the kernel cannot match those rules exactly, in which case the connection
// keeps the proxy path. Table.Allows is a model of the kernel's lookup, written against the encoded
// form, so that tests can check the kernel's semantics against the plan's own without a
// kernel.
package l7table
