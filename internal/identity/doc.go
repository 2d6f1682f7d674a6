// Package identity allocates security identities: numbers for endpoint label sets and for
// CIDR prefixes used by policy, next to the reserved identities (host, world, ...).
// Replicas with equal label sets share an identity, so policy does not change when
// addresses churn. The package is pure (no kernel access).
package identity
