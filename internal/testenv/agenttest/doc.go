// Package agenttest holds the test helpers that need the product above the kernel edge: an
// agent started in-process in a fresh node namespace (StartAgent, Env) with its CLI,
// endpoints and L7 helpers, a world namespace behind it (AddWorld), a node without agent
// built with the agent's own endpoint plumbing (NewBareNode), and the Envoy lookup
// (RequireEnvoy). Everything below (the root/CI rule, names, namespaces, sockets, probes,
// binaries) is in package testenv, which lower packages' tests use.
package agenttest
