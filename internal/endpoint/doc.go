// Package endpoint creates and deletes endpoints in standalone mode: a network namespace
// per endpoint (bind-mounted under /run/netns like `ip netns add`), a veth pair whose host
// side lives in the agent's node namespace, addresses and routes on both sides, and the node
// namespace itself (forwarding on, router address on lo).
//
// A node with an IPv6 pod range (Node.PodCIDR6) is dual-stack: each endpoint also gets
// the IPv6 address paired with its IPv4 one and a link-local address (package podaddr),
// routes IPv6 through the link-local router address every host veth has
// (RouterLinkLocal), and the node routes to it with a /128.
//
// All netlink work goes through per-namespace handles (netlink.NewHandleAt), and the few
// operations that must run inside a namespace (unshare, sysctls) run on a dedicated, locked
// OS thread that is thrown away if it cannot be switched back, so no goroutine of the
// caller ever changes namespace.
package endpoint
