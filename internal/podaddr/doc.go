// Package podaddr derives an endpoint's IPv6 addresses from its IPv4 one, so that a
// dual-stack node needs no second allocator and no second record: the IPv6 address is
// the IPv6 pod range's network address plus the IPv4 address's offset in the IPv4 pod
// range, and the link-local address of the endpoint's interface is fe80:: plus the low
// 64 bits of that. Anyone who knows the two ranges (the agent, the endpoint plumbing,
// the dataplane's tests) computes the same addresses without asking the kernel.
//
// It is pure: no kernel, no state.
package podaddr
