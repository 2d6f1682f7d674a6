// Package cidrtest holds what the CIDR set tests share: a reference model of the sets,
// random prefix sets with the interesting edges, addresses worth asking about, and the
// edge cases any implementation of the tables must pass. The tables' own tests (over Go
// memory and over the kernel's maps, internal/cidrtable) and the dataplane's tests of the
// programs that read them (internal/datapath) use it; it imports neither.
package cidrtest
