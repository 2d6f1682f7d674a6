// Package api is the contract between the agent (rampartd) and the CLI (rampart): JSON types,
// an HTTP handler over a Service the agent implements, a Unix socket listener that only root
// can use, and the client the CLI calls. It has no kernel code, so the CLI stays small and
// the handler is tested with a fake Service. CIDR set contents travel in a compact binary
// form (PrefixList), not as JSON.
package api
